"""Many simulated nodes in one process: real :class:`NodeAgent` s with the echo backend, all in
one ``trio.run``, so 200 nodes do not need 200 processes.

    python -m tools.loadtest.nodes SPEC.json

``SPEC.json`` (written by the load test, mode 0600 because it holds node tokens) names the
coordinator URLs, the nodes with their tokens and the instance each connects to first, and the
echo backend's settings. Two additions to a plain agent:

* failover: a node that cannot connect to its instance tries another one (at random) on its next
  attempt, as a load balancer in front of the instances would send it; a node whose connection
  dropped retries its own instance first.
* a journal (tab-separated lines, flushed every 50 ms, times from ``time.monotonic()`` which is
  one clock for every process of the machine) that the load test joins with its requests:

  ``A tag node_id instance_index t``  the node started a task (``tag`` = first word of the prompt)
  ``D tag delay_s``                   the echo backend's delay before its first piece
  ``C node_id instance_index t``      the node was welcomed by that instance

SIGTERM or SIGINT drains every agent (1 s grace) and exits 0.
"""

from __future__ import annotations

import json
import logging
import random
import signal
import sys
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import replace
from pathlib import Path
from typing import Any, TextIO

import trio

from protocol import Welcome
from protocol.model_servers import Finish, Generation
from tools.node_agent import (
    AgentConfig,
    AgentExit,
    EchoBackend,
    NodeAgent,
    coordinator_ws_url,
    parse_latency,
)

log = logging.getLogger("gemmanet.loadtest.nodes")

FLUSH_INTERVAL_S = 0.05


class Journal:
    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._lines: list[str] = []

    def add(self, *fields: object) -> None:
        self._lines.append("\t".join(str(f) for f in fields) + "\n")

    def flush(self) -> None:
        if self._lines:
            self._stream.write("".join(self._lines))
            self._lines.clear()
        self._stream.flush()

    async def run(self) -> None:
        try:
            while True:
                await trio.sleep(FLUSH_INTERVAL_S)
                self.flush()
        finally:
            self.flush()


class JournalingEcho(EchoBackend):
    """The echo backend, telling the journal which node (on which instance) ran each task."""

    def __init__(self, node_id: str, journal: Journal, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.node_id = node_id
        self.journal = journal
        self.agent: FailoverAgent | None = None

    async def generate(self, request: Generation) -> AsyncIterator[str | Finish]:
        tag = request.input_text.split(" ", 1)[0]
        started = time.monotonic()
        where = self.agent.url_index if self.agent is not None else -1
        self.journal.add("A", tag, self.node_id, where, f"{started:.6f}")
        first = True
        async with aclosing(super().generate(request)) as pieces:  # type: ignore[type-var]
            async for piece in pieces:
                if first and isinstance(piece, str):
                    first = False
                    self.journal.add("D", tag, f"{time.monotonic() - started:.6f}")
                yield piece


class FailoverAgent(NodeAgent):
    """A node agent that moves to another instance when its own cannot be reached."""

    def __init__(
        self,
        config: AgentConfig,
        backend: JournalingEcho,
        *,
        rng: random.Random,
        urls: list[str],
        url_index: int,
        journal: Journal,
        failover: bool,
    ) -> None:
        super().__init__(replace(config, ws_url=urls[url_index]), backend, rng=rng)
        self.urls = urls
        self.url_index = url_index
        self.journal = journal
        self.failover = failover
        self._pick = random.Random(rng.getrandbits(64))
        backend.agent = self

    async def _handshake(self, ws: Any) -> Welcome | None:  # type: ignore[override]
        welcome = await super()._handshake(ws)
        if welcome is not None:
            self.journal.add("C", self.config.node_id, self.url_index, f"{time.monotonic():.6f}")
        return welcome

    async def _connect_once(self) -> bool:
        welcomed = await super()._connect_once()
        if not welcomed and self.failover and len(self.urls) > 1 and not self.draining:
            self.url_index = self._pick.choice(
                [i for i in range(len(self.urls)) if i != self.url_index]
            )
            self.config = replace(self.config, ws_url=self.urls[self.url_index])
        return welcomed


async def serve(spec: dict[str, Any], journal: Journal) -> int:
    urls: list[str] = [coordinator_ws_url(u) for u in spec["urls"]]
    latency = parse_latency(str(spec.get("latency_ms", "0")))
    chunk_delay_s = float(spec.get("chunk_delay_ms", 0)) / 1000.0
    seed = int(spec.get("seed", 0))
    stagger_s = float(spec.get("stagger_s", 0.0))
    agents: list[FailoverAgent] = []
    refused: dict[str, str] = {}
    for node in spec["nodes"]:
        rng = random.Random(f"{seed}:{node['node_id']}")
        backend = JournalingEcho(
            node["node_id"],
            journal,
            latency=latency,
            chunk_delay_s=chunk_delay_s,
            rng=random.Random(rng.getrandbits(64)),
        )
        config = AgentConfig(
            ws_url=urls[node["url_index"]],
            node_id=node["node_id"],
            token=node["token"],
            models=tuple(spec["models"]),
            max_parallel=int(spec.get("max_parallel", 4)),
            drain_s=1.0,
            backoff_initial_s=float(spec.get("backoff_initial_s", 0.5)),
            backoff_max_s=float(spec.get("backoff_max_s", 5.0)),
        )
        agents.append(
            FailoverAgent(
                config,
                backend,
                rng=rng,
                urls=urls,
                url_index=int(node["url_index"]),
                journal=journal,
                failover=bool(spec.get("failover", True)),
            )
        )

    async def run_agent(agent: FailoverAgent) -> None:
        try:
            await agent.run()
        except AgentExit as exc:
            refused[agent.config.node_id] = exc.message
            log.warning("node %s stopped: %s", agent.config.node_id, exc.message)

    async def watch_signals() -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for _ in signals:
                for agent in agents:
                    agent.request_drain()

    async with trio.open_nursery() as outer:
        outer.start_soon(journal.run)
        outer.start_soon(watch_signals)
        async with trio.open_nursery() as nursery:
            for agent in agents:
                nursery.start_soon(run_agent, agent)
                if stagger_s > 0:
                    await trio.sleep(stagger_s)
        outer.cancel_scope.cancel()
    print(
        f"loadtest nodes: {len(agents)} agents stopped; {len(refused)} refused "
        f"(4000/4001): {sorted(refused)[:5]}",
        file=sys.stderr,
        flush=True,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m tools.loadtest.nodes SPEC.json", file=sys.stderr)
        return 2
    spec = json.loads(Path(args[0]).read_text())
    logging.basicConfig(
        level=getattr(logging, str(spec.get("log_level", "WARNING")).upper(), logging.WARNING),
        format="%(asctime)s loadtest-nodes %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    with open(spec["journal"], "a", encoding="utf-8") as stream:
        return trio.run(serve, spec, Journal(stream))


if __name__ == "__main__":
    sys.exit(main())
