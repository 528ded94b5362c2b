"""The streams bus's presence (GEMMANET_BUS=streams) against real processes and a real
redis-server: a kill -9 of an instance is seen by a sender within the presence TTL (1 s), and
a SIGSTOP of redis-server for longer than that TTL makes no live instance look gone and fails
no request.

The sender in the first test is a ``StreamsBus`` of the test process on the same Redis and key
prefix as the instances: the very code a peer sends with, asked ``is_listening`` every 20 ms
after the kill, then ``send``. The peer B's own verdict (it stops counting A) is measured too,
against the liveness judge's bound for a killed owner on this bus (``failover_bound_s``:
TTL 1 + sweep 0.5 + slack 0.2 + 2 x rtt 0.1 = 1.9 s)."""

from __future__ import annotations

import json
import os
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from coordinator.coordination.bus.streams import StreamsBus
from coordinator.coordination.keys import listening_key, refused_key
from coordinator.coordination.redis.coordination import RedisCoordination
from coordinator.core.liveness import STREAMS_PRESENCE_TTL_S, STREAMS_REFRESH_S
from coordinator.settings import Settings
from protocol import Assign, Chunk, Result
from tests.e2e.test_metrics import moved, scrape
from tests.e2e.test_redis_pause import (
    TASK_MIN_S,
    assert_nobody_declared_dead,
    assert_served,
    pause_under_cross_instance_load,
)
from tests.fixtures.processes import Processes
from tests.fixtures.raw_node import raw_node
from tests.fixtures.redis_server import RedisServer

pytestmark = [pytest.mark.e2e, pytest.mark.redis]

#: what a measurement of the sender may add to the TTL: its 20 ms poll, the round trip of the
#: poll that answers, and the kill's delivery, on a box shared with other work
SENDER_MARGIN_S = 0.2
#: the same for B's verdict, read over HTTP (a status request every 20 ms)
PEER_MARGIN_S = 0.3
KILLS = 3


async def _b_counts(client: httpx.AsyncClient) -> int:
    response = await client.get("/api/v1/status")
    return int(response.json()["instances"])


async def test_a_killed_instance_is_seen_gone_within_the_presence_ttl(
    procs: Processes, redis_server: RedisServer
) -> None:
    prefix = f"sk{os.getpid()}"
    shared = procs.share_redis(redis_server, prefix, GEMMANET_BUS="streams")
    a, b = shared.two_instances()
    killed_bound = Settings(bus="streams").liveness_timing()
    peer_bound_s = (
        killed_bound.presence_ttl_s + killed_bound.stall_gap_s + 2 * killed_bound.responsive_rtt_s
    )
    assert peer_bound_s == pytest.approx(1.9) and STREAMS_PRESENCE_TTL_S == 1.0
    seen: list[float] = []
    judged: list[float] = []
    async with (
        RedisCoordination(redis_server.url, key_prefix=prefix) as coordination,
        httpx.AsyncClient(base_url=b.url, timeout=10) as b_client,
    ):
        sender = StreamsBus(coordination.link)
        for kill in range(KILLS):
            if kill:
                a = shared.coordinator(GEMMANET_INSTANCE_ID="A")  # the same id, at once
                with trio.fail_after(20):
                    while await _b_counts(b_client) != 2:
                        await trio.sleep(0.05)
            # A's presence is being refreshed (its TTL went up), so its last refresh before
            # the kill is at most a refresh period old.
            key = coordination.link.redis_key(listening_key("A"))
            assert await sender.is_listening("A")
            assert await sender.held_by_live_process("A"), f"{key} is not refreshed"
            await trio.sleep(STREAMS_REFRESH_S * 1.5)
            os.kill(a.proc.pid, signal.SIGKILL)
            killed_at = trio.current_time()
            found: dict[str, float] = {}

            async def sender_sees(found: dict[str, float] = found) -> None:
                while await sender.is_listening("A"):
                    await trio.sleep(0.02)
                found["sender"] = trio.current_time()
                # ... and a send now reaches nobody: 0
                assert await sender.send("A", b"after the kill") == 0

            async def peer_sees(found: dict[str, float] = found) -> None:
                while await _b_counts(b_client) != 1:
                    await trio.sleep(0.02)
                found["peer"] = trio.current_time()

            with trio.fail_after(10):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(sender_sees)
                    nursery.start_soon(peer_sees)
            a.proc.wait()
            seen.append(round(found["sender"] - killed_at, 3))
            judged.append(round(found["peer"] - killed_at, 3))
        assert sender.absence_believed()  # it never saw a stall: nothing was late
    print(f"kill -9 of A seen by a sender after {seen} s, B stopped counting A after {judged} s")
    for took in seen:
        assert took <= STREAMS_PRESENCE_TTL_S + SENDER_MARGIN_S, (seen, judged)
    for took in judged:
        assert took <= peer_bound_s + PEER_MARGIN_S, (seen, judged)


@pytest.mark.parametrize("pause_s", [1.3, 2.5])
async def test_a_redis_pause_longer_than_the_presence_ttl_fails_nothing(
    procs: Processes, redis_server: RedisServer, pause_s: float
) -> None:
    """SIGSTOP of redis-server for longer than the presence TTL (1 s) under cross-instance
    load: every presence key lapses in the pause, yet every request gets 200 with its own
    answer (those that came during the pause later), no instance judges the other dead, no
    inbox counts as lost and no sender refused an envelope. 1.3 s: the sends made as Redis
    stopped are answered (within the 1 s operation timeout of the last command before the
    pause), some of them before their target's refresh. 2.5 s: the inboxes' reads time out and
    each resumes its stream after the pause."""
    assert STREAMS_PRESENCE_TTL_S < pause_s < Settings().store_outage_s
    procs.env["GEMMANET_BUS"] = "streams"
    run = await pause_under_cross_instance_load(procs, redis_server, pause_s)
    summary = run.summary()
    assert len(run.outcomes) >= 8.0 * (6.5 + pause_s) * 0.9, summary
    assert_nobody_declared_dead(run)
    for o in run.outcomes:
        assert_served(o, summary)
    during = [o for o in run.outcomes if run.paused_at <= o.started < run.resumed_at - 0.2]
    assert during and {o.target for o in during} == {"A", "B"}, summary
    for o in during:
        assert o.finished >= run.resumed_at + TASK_MIN_S - 0.2, (o, summary)
    in_flight = [o for o in run.outcomes if run.paused_at - 1.0 <= o.started < run.paused_at - 0.1]
    assert in_flight, summary
    for coordinator in run.instances:
        metrics = await scrape(coordinator.url)
        assert moved(Counter(), metrics, "gemmanet_peers_declared_dead_total") == 0
        # no envelope was dropped for want of a listener, or otherwise
        assert moved(Counter(), metrics, "gemmanet_bus_envelopes_dropped_total") == 0
        assert coordinator.status()["instances"] == 2
    # Nobody was told that an inbox had nobody listening, in the pause or after it.
    prefix = procs.env["GEMMANET_KEY_PREFIX"]
    for instance in ("A", "B"):
        record = f"{prefix}:{refused_key(instance)}"
        assert redis_server.raw_command("EXISTS", record) == b":0\r\n", record


async def test_a_stream_across_a_long_redis_pause_resumes_and_completes(
    procs: Processes, redis_server: RedisServer
) -> None:
    """A client on B streams from a node on A; B's inbox has been idle for a second (its read
    blocks), then redis-server stops for 3.5 s and a chunk comes from the node meanwhile. B's
    read times out in the pause and every attempt to listen again times out until Redis is
    back (time that does not count against the resume window: Redis is silent, not gone), so
    B resumes its stream after the pause, nothing lost, and the stream completes in order with
    200: no inbox lost, nobody declared dead."""
    prefix = f"sl{os.getpid()}"
    shared = procs.share_redis(redis_server, prefix, GEMMANET_BUS="streams")
    a, b = shared.two_instances()
    key, token = shared.create_key("long"), shared.enroll("rn")
    events: list[dict[str, Any]] = []
    status: list[int] = []
    async with raw_node(a.url, "rn", token) as node:
        with trio.fail_after(20):
            while not b.has_node("rn"):
                await trio.sleep(0.05)

        async def client() -> None:
            async with (
                httpx.AsyncClient(base_url=b.url, timeout=60) as http,
                http.stream(
                    "POST",
                    "/api/v1/request",
                    json={"model": "echo", "prompt": "p", "stream": True},
                    headers={"Authorization": f"Bearer {key}"},
                ) as response,
            ):
                status.append(response.status_code)
                async for line in response.aiter_lines():
                    if line.startswith("data: "):
                        events.append(json.loads(line[6:]))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(client)
            assign = await node.receive()
            assert isinstance(assign, Assign)
            await node.send(Chunk(task_id=assign.task_id, seq=0, delta="before "))
            with trio.fail_after(10):
                while not events:
                    await trio.sleep(0.02)
            await trio.sleep(1.2)  # B's inbox idle: its read blocks, sent up to 1 s ago
            redis_server.pause()
            try:
                await trio.sleep(0.5)
                await node.send(Chunk(task_id=assign.task_id, seq=1, delta="during "))
                await trio.sleep(3.0)
            finally:
                redis_server.resume()
            await node.send(Chunk(task_id=assign.task_id, seq=2, delta="after"))
            await node.send(Result(task_id=assign.task_id, output="before during after", chunks=3))
    assert status == [200], events
    assert [e.get("delta") for e in events[:-1]] == ["before ", "during ", "after"], events
    assert events[-1]["done"] is True and events[-1]["output"] == "before during after"
    log = Path(b.proc.log_path).read_text()  # type: ignore[attr-defined]
    assert "instance bus resumed" in log, log[-3000:]
    for coordinator in (a, b):
        diagnostics: Any = coordinator.status()["diagnostics"]
        assert diagnostics["bus_losses"] == 0, diagnostics
        assert diagnostics["liveness_lost"] == 0, diagnostics
        metrics = await scrape(coordinator.url)
        assert moved(Counter(), metrics, "gemmanet_peers_declared_dead_total") == 0
