"""``gemmanet node``: flags, validation, signal handling, exit codes.

Exit codes: 0 drained after SIGINT/SIGTERM, 2 bad flag value, 3 replaced by a newer connection
of the same node identity (close 4000), 4 authentication failed (close 4001).
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import signal
import sys
import threading
from functools import partial
from pathlib import Path
from typing import Protocol

import trio

from protocol.log_lines import bind_log_ids, json_logging_active, register_secret
from protocol.telemetry import TelemetrySample
from tools.node_agent import prefix_cache
from tools.node_agent.agent import AgentConfig, AgentExit, NodeAgent
from tools.node_agent.backends import make_backend
from tools.node_agent.logs import configure_logging_once
from tools.node_agent.settings import (
    BACKENDS,
    DEFAULT_BACKEND_CHECK_S,
    DEFAULT_DRAIN_S,
    DEFAULT_MAX_PARALLEL,
    DEFAULT_OLLAMA_URL,
    DEFAULT_OPENAI_URL,
    DEFAULT_RECONNECT_MAX_S,
    NodeSettings,
    UsageError,
)


class HostTelemetry(Protocol):
    """What the agent uses of a host sampler (``LiveTelemetry``): the newest sample, kept fresh
    by ``run``. Typed here so that the agent's modules name nothing of the coordinator."""

    latest: TelemetrySample | None

    async def run(self) -> None: ...


EXIT_USAGE = 2
TOKEN_ENV = "GEMMANET_NODE_TOKEN"
log = logging.getLogger("gemmanet.node")


def add_node_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``gemmanet node`` flags on ``parser`` (values are checked by run_node)."""
    parser.add_argument(
        "--coordinator",
        action="append",
        required=True,
        metavar="URL",
        help="coordinator base URL, e.g. http://127.0.0.1:8000 (the agent dials ws://…/ws/node; "
        "https gives wss); repeat for several instances (or give one load balancer URL): the "
        "agent moves to the next one when its connection is lost, at once when told to move",
    )
    parser.add_argument(
        "--reconnect-max-s",
        default=str(DEFAULT_RECONNECT_MAX_S),
        metavar="S",
        help="the most the agent waits between connection attempts (exponential backoff from "
        f"0.5 s with full jitter; default {DEFAULT_RECONNECT_MAX_S:g}; 0.1-3600)",
    )
    parser.add_argument("--node-id", required=True, metavar="ID", help="this node's identity")
    parser.add_argument(
        "--token",
        default=None,
        metavar="TOKEN",
        help=f"node token from `gemmanet nodes enroll` (default: ${TOKEN_ENV}, which keeps it "
        "out of the process list)",
    )
    parser.add_argument(
        "--model",
        dest="models",
        action="append",
        required=True,
        metavar="NAME",
        help="a model this node serves; repeat for several",
    )
    parser.add_argument(
        "--backend",
        required=True,
        choices=BACKENDS,
        help="echo: answers with the prompt (reference model for tests); ollama: Ollama's "
        "/api/generate; openai: an OpenAI-compatible /v1/chat/completions server (vLLM, "
        "llama.cpp, LM Studio...; API key from $OPENAI_API_KEY)",
    )
    parser.add_argument(
        "--backend-url",
        default=None,
        metavar="URL",
        help=f"model server base URL (default: ollama {DEFAULT_OLLAMA_URL}, openai "
        f"{DEFAULT_OPENAI_URL}; a trailing /v1 is accepted)",
    )
    parser.add_argument(
        "--backend-check-s",
        default=str(DEFAULT_BACKEND_CHECK_S),
        metavar="S",
        help="check that the model server answers (ollama GET /api/tags, openai GET "
        "/v1/models; 5 s timeout) before connecting and every S seconds; while it does not, "
        "the node serves none of its models and checks again with backoff, at most S apart "
        f"(default {DEFAULT_BACKEND_CHECK_S:g}; 0.1-3600)",
    )
    parser.add_argument(
        "--latency-ms",
        default="0",
        metavar="N|MIN-MAX",
        help="echo backend: answer after N ms, or uniform in MIN-MAX ms (default 0)",
    )
    parser.add_argument(
        "--chunk-delay-ms",
        default="0",
        metavar="N",
        help="echo backend: pause between streamed chunks (default 0)",
    )
    parser.add_argument(
        "--max-parallel",
        default=str(DEFAULT_MAX_PARALLEL),
        metavar="N",
        help=f"tasks run at once; more are refused with node_busy (default {DEFAULT_MAX_PARALLEL})",
    )
    parser.add_argument("--vram-gb", default=None, metavar="X", help="advertised GPU memory")
    parser.add_argument(
        "--drain-s",
        default=str(DEFAULT_DRAIN_S),
        metavar="S",
        help="on SIGINT/SIGTERM, let running tasks finish for up to S seconds, then cancel them "
        f"and exit 0 (default {DEFAULT_DRAIN_S:g}; a second signal cuts it short)",
    )
    parser.add_argument(
        "--telemetry-interval",
        default="2",
        metavar="S",
        help="sample this host's CPU, memory and GPUs every S seconds and send the latest "
        "sample in each heartbeat; 0 sends none (default 2)",
    )
    parser.add_argument(
        "--telemetry-sysfs-root",
        default="/sys",
        metavar="DIR",
        help="where to read the DRM GPU files (default /sys)",
    )
    parser.add_argument(
        "--seed",
        default=None,
        metavar="N",
        help="seed of the echo latency and reconnect jitter (default: random)",
    )


def settings_from_args(args: argparse.Namespace) -> NodeSettings:
    token = getattr(args, "token", None) or os.environ.get(TOKEN_ENV)
    return NodeSettings.parse(
        coordinator=getattr(args, "coordinator", None),
        node_id=getattr(args, "node_id", None),
        token=token,
        models=getattr(args, "models", None) or getattr(args, "model", None),
        backend=getattr(args, "backend", "echo"),
        backend_url=getattr(args, "backend_url", None),
        latency_ms=getattr(args, "latency_ms", "0"),
        max_parallel=getattr(args, "max_parallel", DEFAULT_MAX_PARALLEL),
        vram_gb=getattr(args, "vram_gb", None),
        chunk_delay_ms=getattr(args, "chunk_delay_ms", "0"),
        drain_s=getattr(args, "drain_s", DEFAULT_DRAIN_S),
        seed=getattr(args, "seed", None),
        backend_check_s=getattr(args, "backend_check_s", DEFAULT_BACKEND_CHECK_S),
        reconnect_max_s=getattr(args, "reconnect_max_s", DEFAULT_RECONNECT_MAX_S),
    )


async def _watch_signals(agent: NodeAgent) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            log.info("got %s", signal.Signals(signum).name)
            agent.request_drain()


def telemetry_from_args(args: argparse.Namespace) -> HostTelemetry | None:
    """The host telemetry the agent sends, or None (``--telemetry-interval 0``)."""
    raw = str(getattr(args, "telemetry_interval", "0"))
    try:
        interval = float(raw)
    except ValueError:
        raise UsageError(f"--telemetry-interval: not a number: {raw!r}") from None
    if interval == 0:
        return None
    if not 0.05 <= interval <= 3600:
        raise UsageError("--telemetry-interval must be 0 or between 0.05 and 3600 seconds")
    # Imported here: psutil and the GPU readers are only needed by an agent that samples. The
    # sampler is the coordinator's (``gemmanet telemetry-agent`` serves the same samples); it
    # loads tools/node_agent/telemetry/ alone, none of the server stack (test_node_agent_imports.py).
    from tools.node_agent.telemetry.sampler import LiveTelemetry, Sampler

    root = Path(getattr(args, "telemetry_sysfs_root", "/sys"))
    return LiveTelemetry(Sampler(sysfs_root=root), interval)


async def serve_node(
    settings: NodeSettings, *, handle_signals: bool = True, telemetry: HostTelemetry | None = None
) -> int:
    """Run one agent until it drains (0) or is refused (3, 4); prints why on stderr."""
    seed = settings.seed if settings.seed is not None else random.SystemRandom().getrandbits(64)
    # One generator per subsystem, so echo latency draws do not shift the reconnect jitter.
    backend = make_backend(settings, rng=random.Random(f"{seed}:backend"))
    backend = prefix_cache.from_env(backend)  # a benchmark's model of a KV cache, if asked for
    agent = NodeAgent(
        AgentConfig(
            ws_url=settings.ws_url,
            ws_urls=settings.ws_urls,
            backoff_max_s=settings.reconnect_max_s,
            node_id=settings.node_id,
            token=settings.token,
            models=settings.models,
            max_parallel=settings.max_parallel,
            vram_gb=settings.vram_gb,
            drain_s=settings.drain_s,
            backend_check_s=settings.backend_check_s,
        ),
        backend,
        rng=random.Random(f"{seed}:reconnect"),
        health_rng=random.Random(f"{seed}:health"),
        telemetry=None if telemetry is None else (lambda: telemetry.latest),
    )
    refused: AgentExit | None = None
    try:
        async with trio.open_nursery() as nursery:
            if handle_signals:
                nursery.start_soon(_watch_signals, agent)
            if telemetry is not None:
                nursery.start_soon(telemetry.run)
            try:
                await agent.run()
            except AgentExit as exc:
                refused = exc
            nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(2):
            await backend.aclose()
    if refused is not None:
        if json_logging_active():  # every line of stderr stays JSON
            log.error(refused.message)
        else:
            print(f"gemmanet node: {refused.message}", file=sys.stderr, flush=True)
        return refused.exit_code
    return 0


def run_node(args: argparse.Namespace) -> int:
    """Blocking entry point of ``gemmanet node``; returns the process exit code."""
    try:
        settings = settings_from_args(args)
        telemetry = telemetry_from_args(args)
    except UsageError as exc:
        print(f"gemmanet node: error: {exc}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    try:
        # `gemmanet node` has configured it already (GEMMANET_LOG_FORMAT, -v); `python -m
        # tools.node_agent` has not.
        configure_logging_once()
    except UsageError as exc:
        print(f"gemmanet node: error: {exc}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    # Masked in every log line, whatever a library might print at debug level.
    register_secret(settings.token)
    register_secret(os.environ.get("OPENAI_API_KEY"))
    bind_log_ids(node_id=settings.node_id)  # trio.run's tasks inherit it
    handle_signals = threading.current_thread() is threading.main_thread()
    return trio.run(
        partial(serve_node, settings, handle_signals=handle_signals, telemetry=telemetry)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.node_agent", description="Run a GemmaNet node agent."
    )
    add_node_arguments(parser)
    return run_node(parser.parse_args(argv))
