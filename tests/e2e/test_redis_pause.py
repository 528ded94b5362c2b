"""A paused Redis is not a dead instance: two real coordinator instances serve cross-instance
requests (a client on B for the node on A, and the reverse) while the test SIGSTOPs its own
redis-server for 2.5 s and then resumes it.

Nobody may be declared dead: no instance counts a liveness loss or a lost bus subscription, no
request gets 502, and the tasks in flight across the pause complete. Requests that need Redis
during the pause may be refused with 503 ``coordination_unavailable``."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import trio

from tests.fixtures.processes import Coordinator, Processes, open_loop, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.redis]

PAUSE_S = 2.5
RATE_HZ = 8.0
CLIENT_TIMEOUT_S = 20.0


@dataclass
class Outcome:
    target: str
    model: str
    prompt: str
    started: float
    finished: float
    status: int | None
    body: Any = None


def diagnostics(coord: Coordinator) -> dict[str, Any]:
    return coord.status()["diagnostics"]  # type: ignore[return-value]


async def test_redis_paused_for_2_5_s_declares_nobody_dead(procs: Processes, redis_server) -> None:
    shared = procs.share_redis(
        redis_server, f"pz{os.getpid()}", GEMMANET_RATE_LIMIT="100000/minute"
    )
    a, b = shared.two_instances()
    # Each node serves its own model, so a request for "on-a" made on B must cross to A.
    slow = ("--max-parallel", "64", "--latency-ms", "1200-2000")
    shared.node(a, "n-a", models=("on-a",), extra=slow)
    shared.node(b, "n-b", models=("on-b",), extra=slow)
    wait_until(lambda: len(a.nodes()) == 2 and len(b.nodes()) == 2, "both nodes everywhere")
    key = shared.create_key("pause")
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=0)
    clients = {
        name: httpx.AsyncClient(base_url=c.url, timeout=CLIENT_TIMEOUT_S, limits=limits)
        for name, c in {"A": a, "B": b}.items()
    }
    outcomes: list[Outcome] = []

    async def one(i: int) -> None:
        # B asks for A's node, A asks for B's node: every request crosses instances.
        target, model = ("B", "on-a") if i % 2 == 0 else ("A", "on-b")
        prompt = f"p{i}"
        started = time.monotonic()
        try:
            r = await clients[target].post(
                "/api/v1/request",
                json={"model": model, "prompt": prompt},
                headers={"Authorization": f"Bearer {key}"},
            )
        except httpx.HTTPError as exc:
            outcomes.append(Outcome(target, model, prompt, started, time.monotonic(), None, exc))
            return
        outcomes.append(
            Outcome(target, model, prompt, started, time.monotonic(), r.status_code, r.json())
        )

    stop = trio.Event()
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(open_loop, one, RATE_HZ, stop)
            await trio.sleep(2.5)  # tasks (1.2-2 s each) are in flight when Redis stops
            paused_at = time.monotonic()
            redis_server.pause()
            try:
                await trio.sleep(PAUSE_S)
            finally:
                redis_server.resume()
            resumed_at = time.monotonic()
            await trio.sleep(4.0)
            stop.set()
    finally:
        for client in clients.values():
            await client.aclose()

    outcomes.sort(key=lambda o: o.started)
    summary = [
        (o.target, round(o.started - paused_at, 2), o.status, round(o.finished - o.started, 2))
        for o in outcomes
    ]
    assert len(outcomes) >= RATE_HZ * 8, summary

    # Nobody was declared dead, by a peer or by itself, and no subscription counted as lost.
    for coord in (a, b):
        diag = diagnostics(coord)
        assert diag["liveness_lost"] == 0, diag
        assert diag["bus_losses"] == 0, diag

    # Every request got an answer: 200 with its own prompt, or 503 coordination_unavailable.
    for o in outcomes:
        assert o.status is not None, (o, summary)
        if o.status == 200:
            assert o.body["output"] == o.prompt, o
            assert o.body["node_id"] == ("n-a" if o.model == "on-a" else "n-b"), o
            continue
        assert o.status == 503, (o, summary)
        assert o.body["error"]["code"] == "coordination_unavailable", (o, summary)

    # Tasks already running on the other instance when Redis stopped completed.
    in_flight = [o for o in outcomes if paused_at - 1.0 <= o.started < paused_at - 0.1]
    assert in_flight and all(o.status == 200 for o in in_flight), summary
    # Before the pause and a beat after it, everything is served, in both directions.
    before = [o for o in outcomes if o.finished < paused_at]
    assert before and all(o.status == 200 for o in before), summary
    after = [o for o in outcomes if o.started >= resumed_at + 1.0]
    assert after and all(o.status == 200 for o in after), summary
    assert {o.target for o in after} == {"A", "B"}
