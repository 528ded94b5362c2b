"""A rolling restart under load loses nothing (docs/operations.md): three real coordinator
processes on one real Redis, six nodes that dial all three (five agents in this process on
real sockets, one ``gemmanet node`` process given ``--coordinator`` three times), and a steady
mix of plain and streamed requests across the instances for the whole run, while each
instance in turn gets SIGTERM, exits and is started again.

The client does what a load balancer does: a ``503 instance_draining``, a refused connection,
or a connection closed before any response byte is sent to the next instance. Nothing else is
retried, so every other failure, and every stream that does not end in ``done`` (or the
explicit shutdown error), fails the test. Every node is back online within 5 s of its
instance leaving (they are told to move and dial the next instance at once), and no capacity
lease or queue entry is left in Redis."""

from __future__ import annotations

import json
import random
import signal
import time

import httpx
import pytest
import trio

from tests.fixtures.processes import Coordinator, Processes, wait_until
from tools.node_agent import AgentConfig, NodeAgent, coordinator_ws_url
from tools.node_agent.backends import EchoBackend
from tools.node_agent.settings import Latency

pytestmark = [pytest.mark.e2e, pytest.mark.redis]

IDS = ("A", "B", "C")
BACK_ONLINE_S = 5.0
#: errors of the connection before any response: a load balancer retries them elsewhere
RETRIED_ERRORS = (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError)


class TracedAgent(NodeAgent):
    """A node agent that notes when each of its connections is welcomed and when it ends."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.trace: list[tuple[str, str, float]] = []

    async def _serve(self, ws, welcome) -> None:  # type: ignore[no-untyped-def]
        self.trace.append(("up", welcome.instance_id, time.monotonic()))
        try:
            await super()._serve(ws, welcome)
        finally:
            self.trace.append(("down", welcome.instance_id, time.monotonic()))


class Load:
    """Client loops: plain and streamed requests, in turn, over the instances."""

    def __init__(self, urls: dict[str, str], key: str) -> None:
        self.urls = urls
        self.headers = {"Authorization": f"Bearer {key}"}
        self.ok = {"plain": 0, "stream": 0}
        self.retried = 0
        self.shutdown_errors = 0
        self.failures: list[str] = []
        self.stop = trio.Event()
        self.events: list[str] = []

    async def client(self, http: httpx.AsyncClient, k: int) -> None:
        for n in range(10**6):
            if self.stop.is_set():
                return
            stream = n % 2 == 1
            prompt = f"client {k} request {n} says hello"
            for attempt in range(40):
                instance = IDS[(k + n + attempt) % 3]
                try:
                    verdict = await self._one(http, self.urls[instance], prompt, stream)
                except RETRIED_ERRORS:
                    verdict = "retry"
                if verdict != "retry":
                    break
                self.retried += 1
                await trio.sleep(0.02)
            else:
                verdict = f"gave up after 40 attempts: {prompt!r}"
            if verdict in ("plain", "stream"):
                self.ok[verdict] += 1
            elif verdict != "shutdown":
                at = time.monotonic()
                self.failures.append(f"{verdict} from {instance} at {at:.3f}, {self.events}")
            await trio.sleep(0.03)

    async def _one(self, http: httpx.AsyncClient, url: str, prompt: str, stream: bool) -> str:
        body = {"model": "echo", "prompt": prompt, "stream": stream}
        async with http.stream(
            "POST", f"{url}/api/v1/request", json=body, headers=self.headers
        ) as r:
            if r.status_code == 503:
                error = json.loads(await r.aread())["error"]["code"]
                return "retry" if error == "instance_draining" else f"503 {error}"
            if r.status_code != 200:
                return f"{r.status_code} {(await r.aread())[:200]!r}"
            if not stream:
                answer = json.loads(await r.aread())
                return "plain" if answer["output"] == prompt else f"wrong output {answer}"
            text, last = "", None
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    last = json.loads(line[6:])
                    text += last.get("delta", "")
        if last is not None and last.get("done") and last["output"] == prompt == text:
            return "stream"
        if last is not None and last.get("error", {}).get("code") == "instance_shutting_down":
            self.shutdown_errors += 1  # explicit, not a cut
            return "shutdown"
        return f"truncated stream: {text!r} then {last}"


def live_nodes(coord: Coordinator) -> set[str]:
    return {str(n["node_id"]) for n in coord.nodes()}


async def test_a_rolling_restart_under_load_loses_nothing(
    procs: Processes, redis_server_session, redis_key_prefix: str
) -> None:
    procs.share_redis(
        redis_server_session,
        redis_key_prefix,
        GEMMANET_DRAIN_S="5",
        GEMMANET_RATE_LIMIT="100000/minute",
    )
    coords: dict[str, Coordinator] = {}

    async def start(i: str, port: int | None = None) -> None:
        coords[i] = await trio.to_thread.run_sync(
            lambda: procs.coordinator(port=port, GEMMANET_INSTANCE_ID=i)
        )

    async with trio.open_nursery() as starting:  # the three start side by side
        for i in IDS:
            starting.start_soon(start, i)
    urls = {i: c.url for i, c in coords.items()}
    ws = [coordinator_ws_url(urls[i]) for i in IDS]
    node_ids = [f"n{k}" for k in range(6)]
    agents = []
    for k, node_id in enumerate(node_ids[:5]):
        config = AgentConfig(
            ws_url=ws[k % 3],
            ws_urls=tuple(ws[k % 3 :] + ws[: k % 3]),  # each starts on its own instance
            node_id=node_id,
            token=procs.enroll(node_id),
            models=("echo",),
            backoff_max_s=1.0,
        )
        backend = EchoBackend(latency=Latency(20, 60), chunk_delay_s=0.01, rng=random.Random(k))
        agents.append(TracedAgent(config, backend, rng=random.Random(k)))
    cli_node = procs.node(
        coords["C"],
        node_ids[5],
        wait_online=False,
        extra=(
            "--coordinator",
            urls["A"],
            "--coordinator",
            urls["B"],
            "--telemetry-interval",
            "0",
            "--latency-ms",
            "20-60",
            "--chunk-delay-ms",
            "10",
        ),
    )
    load = Load(urls, procs.create_key())
    back_online: list[float] = []
    exits: list[float] = []

    async def restart(i: str, other: Coordinator) -> None:
        """SIGTERM, wait for the exit, start again on the same port."""
        old = coords[i]
        old.proc.send_signal(signal.SIGTERM)
        termed_at = time.monotonic()
        load.events.append(f"TERM {i} {termed_at:.3f}")
        assert await trio.to_thread.run_sync(lambda: old.proc.wait(timeout=15)) == 0
        left_at = time.monotonic()
        exits.append(left_at - termed_at)
        load.events.append(f"EXIT {i} {left_at:.3f}")

        def everyone_elsewhere() -> bool:
            return other.status()["instances"] == 2 and live_nodes(other) == set(node_ids)

        # It left the registry, and every node is online elsewhere, within the bound.
        await trio.to_thread.run_sync(
            lambda: wait_until(
                everyone_elsewhere,
                f"every node back online after {i} left",
                timeout_s=BACK_ONLINE_S,
                interval=0.02,
            )
        )
        back_online.append(time.monotonic() - left_at)
        await start(i, int(old.url.rsplit(":", 1)[1]))  # on its port again

    async with httpx.AsyncClient(timeout=30) as http, trio.open_nursery() as nursery:
        for agent in agents:
            nursery.start_soon(agent.run)
        everyone = set(node_ids)
        await trio.to_thread.run_sync(
            wait_until, lambda: live_nodes(coords["A"]) == everyone, "all six nodes online"
        )
        for k in range(2):
            nursery.start_soon(load.client, http, k)
        await trio.sleep(0.5)
        for i in IDS:
            await restart(i, coords[IDS[(IDS.index(i) + 1) % 3]])
            await trio.sleep(0.3)  # the restarted instance takes its share of the load
        load.stop.set()
        await trio.sleep(0.5)  # the clients finish their last request
        nursery.cancel_scope.cancel()
    cli_node.terminate()
    assert load.failures == [], load.failures
    assert load.ok["plain"] > 30 and load.ok["stream"] > 30, load.ok
    # The window (5 s) covers these short tasks: no stream needed the shutdown error.
    assert load.shutdown_errors == 0
    assert max(back_online) < BACK_ONLINE_S, back_online
    # In-process agents: each gap between a connection ending and the next welcome.
    gaps = []
    for agent in agents:
        for (kind, _, at), (next_kind, _, next_at) in zip(agent.trace, agent.trace[1:]):
            if kind == "down" and next_kind == "up":
                gaps.append(next_at - at)
    assert gaps and max(gaps) < 1.0, gaps

    # Nothing of the requests is left in Redis: no lease, no queue entry, no active set.
    def leftovers() -> bytes:
        reply = redis_server_session.raw_command("KEYS", f"{redis_key_prefix}:lease:[nqia]*")
        return reply

    await trio.to_thread.run_sync(
        lambda: wait_until(lambda: leftovers() == b"*0\r\n", "leases and queue entries gone", 5)
    )
    print(
        f"requests ok {load.ok}, retried {load.retried}, exits {exits}, back online {back_online}, "
        f"node gaps max {max(gaps):.3f} s"
    )
