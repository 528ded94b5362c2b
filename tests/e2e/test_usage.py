"""Token usage, end to end: a real coordinator process and real echo node agents (the echo
backend counts words: prompt tokens are the words of the input, completion tokens those of the
output). Tasks asked through ``POST /api/v1/request`` show up in ``GET /api/v1/usage`` summed
per key and model; a key sees only its own; an operator key sees every key; a task that timed
out counts as a task without usage; ``/metrics`` counts the tokens by model and kind.

Task records are written in batches, so each check polls (bounded) until the records it needs
have landed, then compares the whole answer."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.fixtures.processes import Coordinator, Processes, wait_until

pytestmark = pytest.mark.e2e

PROMPT = "one two three"  # 3 words in, and the echo node answers the same 3 words


class Cluster:
    def __init__(self, procs: Processes, coord: Coordinator) -> None:
        self.procs, self.coord = procs, coord

    def usage(self, key: str | None, **params: object) -> httpx.Response:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return self.coord.http.get("/api/v1/usage", params=params, headers=headers)

    def usage_of(self, key: str, **params: object) -> dict[str, Any]:
        response = self.usage(key, **params)
        assert response.status_code == 200, response.text
        assert response.headers["content-type"].startswith("application/json")
        body: dict[str, Any] = response.json()
        return body

    def key_id(self, key: str) -> str:
        # A key's own usage always names it, tasks or not.
        (entry,) = self.usage_of(key)["keys"]
        return str(entry["key_id"])

    def wait_for_tasks(self, key: str, tasks: int, **params: object) -> dict[str, Any]:
        """The usage answer once ``tasks`` tasks are counted (their batches are written)."""

        def landed() -> dict[str, Any] | None:
            body = self.usage_of(key, **params)
            return body if sum(k["tasks"] for k in body["keys"]) >= tasks else None

        found: dict[str, Any] = wait_until(landed, f"{tasks} task(s) in a key's usage", 10)
        return found

    def tokens_metric(self) -> dict[tuple[str, str], float]:
        response = self.coord.http.get("/metrics")
        assert response.status_code == 200, response.text
        return {
            (sample.labels["model"], sample.labels["kind"]): sample.value
            for family in text_string_to_metric_families(response.text)
            for sample in family.samples
            if sample.name == "gemmanet_tokens_total"
        }


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    procs = Processes(Path(tmp_path_factory.mktemp("usage")))
    try:
        coord = procs.coordinator()
        procs.node(coord, "echo-1", models=("echo",))
        # Answers after 3 s: a request with a shorter timeout ends without usage.
        procs.node(coord, "slow-1", models=("slow",), extra=("--latency-ms", "3000"))
        yield Cluster(procs, coord)
    finally:
        procs.stop_all()


def ask(cluster: Cluster, key: str, prompt: str, **extra: object) -> httpx.Response:
    return cluster.coord.request(key, model="echo", prompt=prompt, **extra)


def sums(tasks: int, without: int, prompt: int, completion: int) -> dict[str, int]:
    return {
        "tasks": tasks,
        "tasks_without_usage": without,
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def test_usage_is_summed_per_key_and_model_and_each_key_sees_its_own(cluster: Cluster) -> None:
    alice, bob = cluster.procs.create_key("alice"), cluster.procs.create_key("bob")
    ops = cluster.procs.create_key("ops", admin=True)
    alice_id, bob_id = cluster.key_id(alice), cluster.key_id(bob)
    since = time.time() - 1  # the same clock as the coordinator's: one machine
    tokens_before = cluster.tokens_metric()

    for _ in range(2):
        answer = ask(cluster, alice, PROMPT)
        assert answer.status_code == 200, answer.text
        assert answer.json()["usage"] == {
            "prompt_tokens": 3,
            "completion_tokens": 3,
            "total_tokens": 6,
        }
    streamed = ask(cluster, alice, PROMPT, stream=True)  # a stream is recorded the same way
    assert streamed.status_code == 200 and '"done":true' in streamed.text, streamed.text
    timed_out = cluster.coord.request(alice, model="slow", prompt=PROMPT, timeout_s=0.5)
    assert timed_out.status_code == 504, timed_out.text
    assert ask(cluster, bob, "four five").status_code == 200

    alice_usage = {
        "key_id": alice_id,
        **sums(4, 1, 9, 9),
        "models": [
            {"model": "echo", **sums(3, 0, 9, 9)},
            {"model": "slow", **sums(1, 1, 0, 0)},  # timed out: a task, its tokens unknown
        ],
    }
    bob_usage = {"key_id": bob_id, **sums(1, 0, 2, 2), "models": [{"model": "echo", **sums(1, 0, 2, 2)}]}  # fmt: skip
    mine = cluster.wait_for_tasks(alice, 4, since=since)
    assert mine["keys"] == [alice_usage]
    assert mine["since"] == since and since < mine["until"] <= time.time()
    # The default window (the last 24 hours up to now) holds them too.
    default = cluster.usage_of(alice)
    assert default["keys"] == [alice_usage]
    assert default["until"] - default["since"] == pytest.approx(86_400)
    # Bob sees his task only; a window that ended before the tasks holds none of them.
    assert cluster.wait_for_tasks(bob, 1, since=since)["keys"] == [bob_usage]
    before = cluster.usage_of(alice, since=since - 10, until=since)
    assert before["keys"] == [{"key_id": alice_id, **sums(0, 0, 0, 0), "models": []}]

    # Another key's usage, or every key's, is for operator keys only.
    for asked in (bob_id, "*"):
        refused = cluster.usage(alice, key_id=asked)
        assert refused.status_code == 403, refused.text
        assert refused.json()["error"]["code"] == "forbidden"
    assert cluster.usage_of(ops, key_id=alice_id, since=since)["keys"] == [alice_usage]
    everyone = cluster.usage_of(ops, key_id="*", since=since)["keys"]
    assert [k for k in everyone if k["key_id"] in (alice_id, bob_id)] == sorted(
        [alice_usage, bob_usage], key=lambda k: k["key_id"]
    )

    # The counters moved by the same tokens (the timed-out task moved none).
    tokens_after = cluster.tokens_metric()
    moved = {k: v - tokens_before.get(k, 0.0) for k, v in tokens_after.items()}
    assert moved == {("echo", "prompt"): 11, ("echo", "completion"): 11}


@pytest.mark.parametrize(
    "params",
    [
        {"since": "yesterday"},
        {"until": "nan"},
        {"since": "inf"},
        {"since": 200, "until": 100},  # since after until
        {"since": time.time() + 3600},  # after the default until (now)
        {"sinse": 100},  # a typo would silently widen the window
        {"key_id": ""},
    ],
)
def test_a_bad_window_is_a_422_in_the_native_error_shape(
    cluster: Cluster, params: dict[str, object]
) -> None:
    key = cluster.procs.create_key()
    response = cluster.usage(key, **params)
    assert response.status_code == 422, response.text
    body = response.json()
    assert list(body) == ["error"] and set(body["error"]) == {"code", "message"}
    assert body["error"]["code"] == "invalid_request" and body["error"]["message"]


def test_a_repeated_parameter_is_a_422_and_no_key_is_a_401(cluster: Cluster) -> None:
    key = cluster.procs.create_key()
    repeated = cluster.coord.http.get(
        "/api/v1/usage?since=1&since=2", headers={"Authorization": f"Bearer {key}"}
    )
    assert repeated.status_code == 422 and "since" in repeated.json()["error"]["message"]
    anonymous = cluster.usage(None)
    assert anonymous.status_code == 401, anonymous.text
    assert anonymous.json()["error"]["code"] == "unauthorized"
