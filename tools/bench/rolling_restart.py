"""A rolling restart under load, at a larger scale than the suite's test
(``tests/e2e/test_rolling_restart.py``): ``--instances`` coordinators on a private
``redis-server``, ``--nodes`` echo node agents in this process dialling all of them, and
``--clients`` client tasks sending plain and streamed requests in turn across the instances,
while each instance in turn gets SIGTERM, exits and is started again on its port
(``--rounds`` times over). The client retries, as a load balancer does, a ``503
instance_draining``, a refused connection, and a connection closed before any response byte,
on the next instance; nothing else.

It prints the requests answered and retried, the failures (any other error, any stream that
did not end in ``done``; expected: none), each instance's time from SIGTERM to exit, how long
until every node was online elsewhere after each exit, and the longest gap between a node's
connection ending and its next welcome.

    python -m tools.bench.rolling_restart [--instances 3] [--nodes 24] [--clients 8]
        [--rounds 1] [--drain-s 10] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import sys
import time
from typing import Any

import httpx
import trio

from tools.bench._harness import (
    CLI,
    LOOPBACK,
    Coordinator,
    Harness,
    exit_code_for,
    free_port,
    install_signal_handlers,
    wait_until,
    write_json,
)
from tools.node_agent import AgentConfig, NodeAgent, coordinator_ws_url
from tools.node_agent.backends import EchoBackend
from tools.node_agent.settings import Latency

RETRIED = (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError)


class TracedAgent(NodeAgent):
    """Notes when each connection is welcomed and when it ends (monotonic seconds)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.trace: list[tuple[str, float]] = []

    async def _serve(self, ws: Any, welcome: Any) -> None:
        self.trace.append(("up", time.monotonic()))
        try:
            await super()._serve(ws, welcome)
        finally:
            self.trace.append(("down", time.monotonic()))

    def gaps(self) -> list[float]:
        pairs = zip(self.trace, self.trace[1:], strict=False)
        return [b[1] - a[1] for a, b in pairs if a[0] == "down" and b[0] == "up"]


class Load:
    def __init__(self, urls: list[str], key: str) -> None:
        self.urls = urls
        self.headers = {"Authorization": f"Bearer {key}"}
        self.answered = {"plain": 0, "stream": 0}
        self.retried = 0
        self.failures: list[str] = []
        self.stop = trio.Event()
        #: the last restart step and when (for the failures' report)
        self.last_event = ("start", time.monotonic())

    async def client(self, http: httpx.AsyncClient, k: int) -> None:
        n = 0
        while not self.stop.is_set():
            stream = n % 2 == 1
            prompt = f"client {k} request {n} says hello"
            verdict = "gave up after 50 attempts"
            for attempt in range(50):
                url = self.urls[(k + n + attempt) % len(self.urls)]
                try:
                    verdict = await self._one(http, url, prompt, stream)
                except RETRIED:
                    verdict = "retry"
                if verdict != "retry":
                    break
                self.retried += 1
                await trio.sleep(0.02)
            if verdict in self.answered:
                self.answered[verdict] += 1
            else:
                since = time.monotonic() - self.last_event[1]
                where = f"instance {(k + n + attempt) % len(self.urls)}"
                self.failures.append(
                    f"{verdict} ({where}, {since:.2f} s after {self.last_event[0]})"
                )
            n += 1

    async def _one(self, http: httpx.AsyncClient, url: str, prompt: str, stream: bool) -> str:
        body = {"model": "echo", "prompt": prompt, "stream": stream}
        async with http.stream(
            "POST", f"{url}/api/v1/request", json=body, headers=self.headers
        ) as r:
            if r.status_code == 503:
                code = json.loads(await r.aread())["error"]["code"]
                return "retry" if code == "instance_draining" else f"503 {code}"
            if r.status_code != 200:
                return f"{r.status_code} {(await r.aread())[:200]!r}"
            if not stream:
                ok = json.loads(await r.aread())["output"] == prompt
                return "plain" if ok else "wrong output"
            text, last = "", None
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    last = json.loads(line[6:])
                    text += last.get("delta", "")
        if last is not None and last.get("done") and text == prompt:
            return "stream"
        return f"stream ended with {last}"


def _start(harness: Harness, name: str, port: int, drain_s: float) -> Coordinator:
    proc = harness.spawn(
        name,
        [*CLI, "serve", "--host", LOOPBACK, "--port", str(port)],
        {**harness.env, "GEMMANET_INSTANCE_ID": name, "GEMMANET_DRAIN_S": str(drain_s)},
    )
    coord = Coordinator(proc, f"http://{LOOPBACK}:{port}", harness.probe_key)
    harness.coordinators.append(coord)
    wait_until(coord.healthy, f"{name} to answer /healthz (log {proc.log_path})")
    return coord


async def run(args: argparse.Namespace, harness: Harness) -> dict[str, Any]:
    redis_url = harness.redis()
    harness.env.update(
        GEMMANET_REDIS_URL=redis_url,
        GEMMANET_MULTI_INSTANCE="1",
        GEMMANET_RATE_LIMIT="1000000/minute",
    )
    names = [f"i{k}" for k in range(args.instances)]
    ports = {name: free_port() for name in names}
    coords = {name: _start(harness, name, ports[name], args.drain_s) for name in names}
    urls = [coords[n].url for n in names]
    ws = [coordinator_ws_url(u) for u in urls]
    node_ids = [f"n{k}" for k in range(args.nodes)]
    tokens = harness.enroll_many(node_ids)
    agents = []
    for k, node_id in enumerate(node_ids):
        first = k % len(ws)
        config = AgentConfig(
            ws_url=ws[first],
            ws_urls=tuple(ws[first:] + ws[:first]),
            node_id=node_id,
            token=tokens[node_id],
            models=("echo",),
        )
        backend = EchoBackend(latency=Latency(20, 80), chunk_delay_s=0.01, rng=random.Random(k))
        agents.append(TracedAgent(config, backend, rng=random.Random(k)))
    load = Load(urls, harness.create_key("rolling"))
    exits: list[float] = []
    back_online: list[float] = []
    everyone = set(node_ids)

    def online_on(coord: Coordinator) -> set[str]:
        return {str(n["node_id"]) for n in coord.nodes()}

    async with httpx.AsyncClient(timeout=60) as http, trio.open_nursery() as nursery:
        for agent in agents:
            nursery.start_soon(agent.run)
        await trio.to_thread.run_sync(
            lambda: wait_until(lambda: online_on(coords[names[0]]) == everyone, "nodes online")
        )
        for k in range(args.clients):
            nursery.start_soon(load.client, http, k)
        await trio.sleep(1.0)
        for _round in range(args.rounds):
            for index, name in enumerate(names):
                old, other = coords[name], coords[names[(index + 1) % len(names)]]
                old.proc.popen.send_signal(signal.SIGTERM)
                termed = time.monotonic()
                load.last_event = (f"SIGTERM to {name}", termed)
                code = await trio.to_thread.run_sync(lambda o=old: o.proc.popen.wait(timeout=60))
                left = time.monotonic()
                load.last_event = (f"{name} exited", left)
                exits.append(left - termed)
                if code != 0:
                    load.failures.append(f"{name} exited with {code}")

                def back(o: Coordinator = other) -> bool:
                    return online_on(o) == everyone

                await trio.to_thread.run_sync(
                    lambda b=back: wait_until(b, "every node online elsewhere", 30)
                )
                back_online.append(time.monotonic() - left)
                coords[name] = await trio.to_thread.run_sync(
                    lambda n=name: _start(harness, n, ports[n], args.drain_s)
                )
                load.last_event = (f"{name} restarted", time.monotonic())
                await trio.sleep(1.0)
        load.stop.set()
        await trio.sleep(1.0)
        nursery.cancel_scope.cancel()
    gaps = [g for agent in agents for g in agent.gaps()]
    return {
        "instances": args.instances,
        "nodes": args.nodes,
        "clients": args.clients,
        "rounds": args.rounds,
        "answered": load.answered,
        "retried": load.retried,
        "failures": load.failures,
        "exit_s": [round(e, 3) for e in exits],
        "back_online_s": [round(b, 3) for b in back_online],
        "longest_node_gap_s": round(max(gaps), 3) if gaps else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.bench.rolling_restart", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--instances", type=int, default=3)
    parser.add_argument("--nodes", type=int, default=24)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=1, help="restarts of every instance")
    parser.add_argument("--drain-s", type=float, default=10.0, help="GEMMANET_DRAIN_S")
    parser.add_argument("--json", default=None, metavar="FILE")
    args = parser.parse_args(argv)
    install_signal_handlers()
    try:
        with Harness() as harness:
            report = trio.run(run, args, harness)
    except BaseException as exc:  # noqa: BLE001 - exit_code_for raises what is not ours
        return exit_code_for("rolling restart", exc)
    write_json(args.json, report)
    print(
        f"{report['instances']} instances, {report['nodes']} nodes, {report['clients']} clients, "
        f"{report['rounds']} round(s): answered {report['answered']}, retried elsewhere "
        f"{report['retried']}, failed {len(report['failures'])}"
    )
    print(f"SIGTERM to exit (s): {report['exit_s']}")
    print(f"every node online elsewhere after each exit (s): {report['back_online_s']}")
    print(f"longest gap between a node's connections (s): {report['longest_node_gap_s']}")
    for failure in report["failures"][:10]:
        print(f"  failure: {failure}")
    return 0 if not report["failures"] else 1


if __name__ == "__main__":
    sys.exit(main())
