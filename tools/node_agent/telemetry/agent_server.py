"""``gemmanet telemetry-agent``: this machine's latest telemetry sample over HTTP.

``GET /`` and ``GET /telemetry`` answer ``200`` with the sample (``protocol.telemetry``), a new
one every ``interval_s`` seconds; any other path is ``404 not_found`` and any other method
``405 method_not_allowed``, with the coordinator's JSON error body. No authentication: it says
how busy a machine is and nothing else, for a monitor on a trusted network to poll.
"""

from __future__ import annotations

import logging
import signal
from pathlib import Path

import trio
from hypercorn.trio import serve as hypercorn_serve
from quart import Response
from quart_trio import QuartTrio

from coordinator.api.errors import install_error_handlers
from coordinator.server import hypercorn_patches
from coordinator.server.serve import hypercorn_config
from protocol.telemetry import encode_sample
from tools.node_agent.telemetry.sampler import DEFAULT_INTERVAL_S, LiveTelemetry, Sampler

__all__ = ["create_agent_app", "run_telemetry_agent"]

log = logging.getLogger("gemmanet.telemetry")


def create_agent_app(live: LiveTelemetry) -> QuartTrio:
    app = QuartTrio("gemmanet-telemetry-agent")
    install_error_handlers(app)

    async def current() -> Response:
        sample = await live.current()
        return Response(encode_sample(sample), 200, content_type="application/json")

    app.add_url_rule("/", "root", current, methods=["GET"])
    app.add_url_rule("/telemetry", "telemetry", current, methods=["GET"])
    return app


def run_telemetry_agent(
    *,
    host: str,
    port: int,
    interval_s: float = DEFAULT_INTERVAL_S,
    sysfs_root: Path = Path("/sys"),
) -> int:
    """Serve until SIGINT or SIGTERM; exit 0."""
    hypercorn_patches.apply()
    live = LiveTelemetry(Sampler(sysfs_root=sysfs_root), interval_s)
    app = create_agent_app(live)

    async def main() -> None:
        shutdown = trio.Event()

        async def watch_signals() -> None:
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for _ in signals:
                    shutdown.set()
                    return

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch_signals)
            nursery.start_soon(live.run)
            log.info(
                "telemetry agent on http://%s:%d (a sample every %g s)", host, port, interval_s
            )
            await hypercorn_serve(app, hypercorn_config(host, port), shutdown_trigger=shutdown.wait)
            nursery.cancel_scope.cancel()

    trio.run(main)
    return 0
