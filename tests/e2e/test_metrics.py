"""``GET /metrics`` of real coordinator processes on a real Redis: a scripted run (one task
timeout, one refusal before placement, one 4000 replace, one 502 from a kill -9'd owner) moves
the counters by exactly those amounts; ``GEMMANET_METRICS_PORT`` moves the endpoint off the
API port."""

from __future__ import annotations

import os
import signal
from collections import Counter
from typing import Any

import httpx
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from protocol import Assign
from tests.fixtures.processes import Coordinator, Processes, free_port, wait_until
from tests.fixtures.raw_node import raw_node

pytestmark = pytest.mark.e2e

Sample = tuple[str, tuple[tuple[str, str], ...]]


def parse(text: str) -> Counter[Sample]:
    """Every sample of an exposition, keyed by name and sorted labels."""
    samples: Counter[Sample] = Counter()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] += sample.value
    return samples


async def scrape(base_url: str) -> Counter[Sample]:
    async with httpx.AsyncClient(base_url=base_url, timeout=10) as client:
        response = await client.get("/metrics")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return parse(response.text)


def moved(before: Counter[Sample], after: Counter[Sample], name: str, **labels: str) -> float:
    """How much the samples of ``name`` matching ``labels`` moved (summed over other labels)."""

    def total(samples: Counter[Sample]) -> float:
        return sum(
            value
            for (sample, found), value in samples.items()
            if sample == name and set(labels.items()) <= set(found)
        )

    return total(after) - total(before)


async def post(coord: Coordinator, key: str, **body: Any) -> httpx.Response:
    async with httpx.AsyncClient(base_url=coord.url, timeout=30) as client:
        return await client.post(
            "/api/v1/request", json=body, headers={"Authorization": f"Bearer {key}"}
        )


async def sees(coord: Coordinator, node_id: str) -> None:
    with trio.fail_after(10):
        while True:
            async with httpx.AsyncClient(base_url=coord.url, timeout=5) as client:
                nodes = (
                    await client.get(
                        "/api/v1/nodes", headers={"Authorization": f"Bearer {coord.probe_key}"}
                    )
                ).json()["nodes"]
            if any(n["node_id"] == node_id for n in nodes):
                return
            await trio.sleep(0.05)


@pytest.mark.redis
async def test_scripted_run_moves_the_counters_by_exactly_its_failures(
    procs: Processes, redis_server_session
) -> None:
    shared = procs.share_redis(redis_server_session, f"metrics{os.getpid()}")
    a, b = shared.two_instances()
    key = shared.create_key("client")
    async with (
        raw_node(b.url, "mute", shared.enroll("mute"), models=("mute",)) as mute,
        raw_node(a.url, "doomed", shared.enroll("doomed")) as doomed,
    ):
        await sees(b, "doomed")
        before = await scrape(b.url)

        # 1. A task that times out: the node on B takes it and never answers (local path).
        response = await post(b, key, model="mute", prompt="hello?", timeout_s=1)
        assert response.status_code == 504, response.text
        assert isinstance(await mute.receive(), Assign)

        # A refusal before any node was chosen: nobody serves the model (503 at once).
        response = await post(b, key, model="nobody-serves-this", prompt="x")
        assert response.status_code == 503, response.text
        assert response.json()["error"]["code"] == "no_node_for_model"

        # 2. A 4000 replace: the twin's identity connects again on A; B closes its own.
        twin_token = shared.enroll("twin")
        async with raw_node(b.url, "twin", twin_token) as first:
            async with raw_node(a.url, "twin", twin_token):
                assert await first.close_code() == 4000

            # 3. A 502: the request on B waits on the node of A, and A is killed (remote path).
            results: list[httpx.Response] = []
            async with trio.open_nursery() as nursery:

                async def client() -> None:
                    results.append(await post(b, key, model="echo", prompt="doomed"))

                nursery.start_soon(client)
                assert isinstance(await doomed.receive(), Assign)
                os.kill(a.proc.pid, signal.SIGKILL)
        assert results[0].status_code == 502, results[0].text

    wait_until(lambda: b.status()["instances"] == 1, "B counts one instance", timeout_s=5)
    after = await scrape(b.url)

    def delta(name: str, **labels: str) -> float:
        return moved(before, after, name, **labels)

    outcomes = "gemmanet_task_outcomes_total"
    assert delta(outcomes, code="task_timeout", status="504") == 1
    assert delta(outcomes, code="node_disconnected", status="502") == 1
    assert delta(outcomes, status="502") == 1
    assert delta(outcomes, code="no_node_for_model", status="503") == 1
    assert delta(outcomes) == 3, "no other outcome was counted"
    requests = "gemmanet_http_requests_total"
    assert delta(requests, route="/api/v1/request", status="504") == 1
    assert delta(requests, route="/api/v1/request", status="502") == 1
    assert delta(requests, route="/api/v1/request", status="503") == 1
    assert delta("gemmanet_node_closes_total", code="4000") == 1
    assert delta("gemmanet_node_replaced_total", node_id="twin") == 1
    assert delta("gemmanet_node_replaced_total") == 1
    assert delta("gemmanet_node_connects_total") == 1  # the twin's first connection, on B
    # The timeout ran on B's own node, the 502 on A's: one observation on each path.
    assert delta("gemmanet_task_duration_seconds_count", path="local") == 1
    assert delta("gemmanet_task_duration_seconds_count", path="remote") == 1
    assert delta("gemmanet_task_duration_seconds_sum", path="local") >= 1.0
    assert delta("gemmanet_peers_declared_dead_total") == 1
    assert delta("gemmanet_lease_grants_total") == 2
    assert delta("gemmanet_bus_envelopes_sent_total") >= 1  # the assign to A
    assert delta("gemmanet_redis_op_duration_seconds_count") > 0


def test_metrics_port_serves_them_there_and_not_on_the_api_port(procs: Processes) -> None:
    port = free_port()
    coord = procs.coordinator(GEMMANET_METRICS_PORT=str(port))
    on_api = coord.http.get("/metrics")
    assert on_api.status_code == 404
    assert on_api.json()["error"]["code"] == "not_found"
    response = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
    assert response.status_code == 200
    samples = parse(response.text)
    # The API's own requests are counted on the metrics port, the 404 above included.
    assert samples[("gemmanet_http_requests_total", (("route", "unmatched"), ("status", "404")))]
    assert httpx.get(f"http://127.0.0.1:{port}/other", timeout=10).status_code == 404
    # The collection that froze start-up's objects was timed (coordinator/server/gc_tuning.py).
    assert samples[("gemmanet_gc_pause_seconds_count", (("generation", "2"),))] >= 1
