"""Capacity leases and the shared admission queue end to end: two real coordinator processes on
one real Redis, one real node agent that runs one task at a time (``--max-parallel 1``) and
counts, itself, how many tasks it was asked to run at once and in which order
(``GEMMANET_NODE_STATS_FILE``). Without leases, a burst got a wall of 503s and a stale view
could send a full node a second task."""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
import pytest
import trio

from protocol import TaskErrorCode
from tests.fixtures.processes import Coordinator, Processes, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.redis]


def start(
    procs: Processes, redis_server: object, tmp_path: Path, *, latency_ms: int, **env: str
) -> tuple[Coordinator, Coordinator, Path]:
    procs.share_redis(redis_server, f"aq{os.getpid()}", **env)
    a, b = procs.two_instances()
    stats = tmp_path / "node-stats.json"
    procs.env["GEMMANET_NODE_STATS_FILE"] = str(stats)
    extra = ("--max-parallel", "1", "--latency-ms", str(latency_ms))
    procs.node(a, "one", extra=extra)
    del procs.env["GEMMANET_NODE_STATS_FILE"]
    wait_until(lambda: b.has_node("one"), "B sees the node")
    return a, b, stats


async def post(coord: Coordinator, key: str, prompt: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=coord.url, timeout=60) as client:
        return await client.post(
            "/api/v1/request",
            json={"model": "echo", "prompt": prompt},
            headers={"Authorization": f"Bearer {key}"},
        )


def node_stats(path: Path) -> dict[str, object]:
    return json.loads(path.read_text())  # type: ignore[no-any-return]


async def test_a_burst_from_both_instances_waits_its_turn_in_arrival_order(
    procs, redis_server, tmp_path
) -> None:
    a, b, stats = start(procs, redis_server, tmp_path, latency_ms=250)
    key = procs.create_key("burst")
    responses: dict[str, httpx.Response] = {}

    async def one(i: int) -> None:
        prompt = f"q{i:02d}"
        responses[prompt] = await post(a if i % 2 else b, key, prompt)

    async def arrived(count: int) -> None:
        """Until ``count`` requests are in the system: asked of the node, or queued. Sending
        the next one only then makes the order sent the order of arrival, however slow the
        machine (a fixed pause between sends was not enough on a loaded one)."""
        async with httpx.AsyncClient(base_url=a.url, timeout=10) as client:
            with trio.fail_after(20):
                while True:
                    asked = len(node_stats(stats)["prompts"]) if stats.exists() else 0  # type: ignore[arg-type]
                    cluster = await client.get(
                        "/api/v1/cluster", headers={"Authorization": f"Bearer {key}"}
                    )
                    if asked + (cluster.json()["queue_depth"] or 0) >= count:
                        return
                    await trio.sleep(0.02)

    async with trio.open_nursery() as nursery:
        for i in range(8):
            nursery.start_soon(one, i)
            await arrived(i + 1)
    assert {p: r.status_code for p, r in responses.items()} == {f"q{i:02d}": 200 for i in range(8)}
    seen = node_stats(stats)
    assert seen["peak_asked"] == 1, seen  # never two at once, counted at the node
    assert seen["prompts"] == [f"q{i:02d}" for i in range(8)], seen  # first come, first served
    assert all(n["leases"] == 0 for n in a.nodes())  # every lease given back


async def test_a_flooding_key_does_not_hold_up_another_key_on_redis(
    procs, redis_server, tmp_path
) -> None:
    """The fair order through the Lua scripts, with real keys: one key's flood is queued (sent
    at once, across both instances), then a key of priority 2 sends two requests.
    They run within a few tasks of arriving, before most of the flood (first come first
    served would run them last); their queue wait is counted under priority class 2-4."""
    a, b, stats = start(procs, redis_server, tmp_path, latency_ms=200)
    flood_key = procs.create_key("flood")
    quiet_key = procs.create_key("quiet", priority=2)
    responses: dict[str, httpx.Response] = {}

    async def one(coord: Coordinator, key: str, prompt: str) -> None:
        responses[prompt] = await post(coord, key, prompt)

    async def arrived(count: int) -> int:
        """As in the burst test above; returns how many the node had been asked by then."""
        async with httpx.AsyncClient(base_url=a.url, timeout=10) as client:
            with trio.fail_after(20):
                while True:
                    asked = len(node_stats(stats)["prompts"]) if stats.exists() else 0  # type: ignore[arg-type]
                    cluster = await client.get(
                        "/api/v1/cluster", headers={"Authorization": f"Bearer {flood_key}"}
                    )
                    if asked + (cluster.json()["queue_depth"] or 0) >= count:
                        return asked
                    await trio.sleep(0.02)

    flood = [f"f{i:02d}" for i in range(12)]
    async with trio.open_nursery() as nursery:
        for i, prompt in enumerate(flood):
            nursery.start_soon(one, a if i % 2 else b, flood_key, prompt)
        await arrived(len(flood))
        for i, prompt in enumerate(["q1", "q2"]):
            nursery.start_soon(one, b if i else a, quiet_key, prompt)
            asked = await arrived(len(flood) + i + 1)
            if i == 0:
                asked_when_quiet_came = asked
    assert {p: r.status_code for p, r in responses.items()} == dict.fromkeys(
        [*flood, "q1", "q2"], 200
    )
    seen = node_stats(stats)
    prompts: list[str] = seen["prompts"]  # type: ignore[assignment]
    assert seen["peak_asked"] == 1, seen
    # Each quiet request waited for at most a few tasks (the one running when it came, one
    # turn of the flood, the other quiet one); under first come first served both would have
    # waited for every flood request still queued.
    assert 12 - asked_when_quiet_came >= 6, (asked_when_quiet_came, prompts)
    assert prompts.index("q2") <= asked_when_quiet_came + 4, (asked_when_quiet_came, prompts)
    metrics = ""
    async with httpx.AsyncClient(timeout=10) as client:
        for coord in (a, b):
            metrics += (await client.get(f"{coord.url}/metrics")).text
    waited = [
        float(line.split()[-1])
        for line in metrics.splitlines()
        if line.startswith(
            'gemmanet_admission_queue_wait_by_priority_seconds_count{priority="2-4"}'
        )
    ]
    assert sum(waited) == 2, metrics
    # The System Health page's figures: per instance, the waits by the keys' priority class.
    bearer = {"Authorization": f"Bearer {quiet_key}"}
    async with httpx.AsyncClient(timeout=10) as client:
        pages = [
            (await client.get(f"{c.url}/api/v1/cluster", headers=bearer)).json() for c in (a, b)
        ]
    quiet = [w for p in pages for w in p["queue_waits"] if w["priority"] == "2-4"]
    assert sum(w["waited"] for w in quiet) == 2 and all(w["mean_wait_s"] > 0 for w in quiet)


async def test_past_the_queue_timeout_a_request_gets_503_with_retry_after(
    procs, redis_server, tmp_path
) -> None:
    a, b, stats = start(
        procs, redis_server, tmp_path, latency_ms=2500, GEMMANET_QUEUE_TIMEOUT_S="1"
    )
    key = procs.create_key("timeout")
    responses: dict[str, tuple[httpx.Response, float]] = {}

    async def one(coord: Coordinator, prompt: str) -> None:
        started = trio.current_time()
        responses[prompt] = (
            await post(coord, prompt=prompt, key=key),
            trio.current_time() - started,
        )

    async def handed_runs() -> None:
        """Until the node was handed "runs" (or "runs" was answered: the assertions below say
        how), which then holds the only slot for 2.5 s. A fixed pause after sending it was
        not enough on a loaded machine: A could reach the store after B, B's request took
        the slot and "runs" got the queue timeout's 503."""
        with trio.fail_after(20):
            while "runs" not in responses:
                if stats.exists() and node_stats(stats)["prompts"] == ["runs"]:
                    return
                await trio.sleep(0.02)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(one, a, "runs")
        await handed_runs()
        nursery.start_soon(one, b, "waits-on-b")
        nursery.start_soon(one, a, "waits-on-a")
    assert responses["runs"][0].status_code == 200, responses["runs"][0].text
    for prompt in ("waits-on-b", "waits-on-a"):
        response, took = responses[prompt]
        assert response.status_code == 503, response.text
        assert response.json()["error"]["code"] == TaskErrorCode.ALL_NODES_BUSY
        assert int(response.headers["Retry-After"]) >= 1
        assert 0.9 <= took < 2.4, took  # after the queue timeout, not after the task
    assert node_stats(stats)["prompts"] == ["runs"]


async def test_sixty_concurrent_requests_to_one_single_slot_node_all_get_200(
    procs, redis_server, tmp_path
) -> None:
    a, b, stats = start(procs, redis_server, tmp_path, latency_ms=20)
    key = procs.create_key("sixty")
    codes: list[int] = []

    async def one(i: int) -> None:
        response = await post(a if i % 2 else b, key, f"r{i}")
        codes.append(response.status_code)
        if response.status_code != 200:
            print("FAILED", i, response.text)

    async with trio.open_nursery() as nursery:
        for i in range(60):
            nursery.start_soon(one, i)
    assert codes == [200] * 60
    seen = node_stats(stats)
    assert seen["peak_asked"] == 1 and len(seen["prompts"]) == 60  # type: ignore[arg-type]
