"""Direct model hosts end to end: real coordinator processes on a real redis-server, an elected
``gemmanet monitor`` process polling a fake Ollama server (its own process, speaking Ollama's
wire format) listed under ``[hosts]``. Any instance calls the host itself; placement on it needs
the monitor's facts fresh and of the current epoch. The instances run with
``GEMMANET_HOST_PLACEMENT=on`` (a deployment from before the gate); the gate itself, switched by
``gemmanet audit --enable``, is tests/e2e/test_host_gate.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from tests.fixtures.processes import CLI, Coordinator, Processes, free_port, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.redis]

HOST = "box-c"
#: monitor timing that fits a 3 s staleness window (poll 0.2 + TTL 1 + retry 0.2 + 2 x 0.3 = 2)
FAST = {
    "GEMMANET_MONITOR_POLL_S": "0.2",
    "GEMMANET_MONITOR_TTL_S": "1",
    "GEMMANET_MONITOR_RETRY_S": "0.2",
    "GEMMANET_MONITOR_POLL_TIMEOUT_S": "0.3",
    "GEMMANET_RESIDENCY_STALE_S": "3",
}


class FakeHost:
    def __init__(self, procs: Processes) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        args = [sys.executable, "-m", "tools.fakes.ollama", "--port", str(self.port)]
        self.proc = procs._popen([*args, "--model", "llama3", "--resident", "llama3=4"])
        wait_until(self.answers, "the fake Ollama host")

    def answers(self) -> bool:
        return httpx.get(self.url + "/api/version", timeout=1).status_code == 200

    def configure(self, **config: object) -> None:
        httpx.post(self.url + "/_fake/config", json=config, timeout=5).raise_for_status()

    def stats(self) -> dict[str, object]:
        return httpx.get(self.url + "/_fake/stats", timeout=5).json()  # type: ignore[no-any-return]

    def requests(self) -> list[dict[str, Any]]:
        """What the host received: ``{"path", "body", "refused"}`` each, in order."""
        received = httpx.get(self.url + "/_fake/requests", timeout=5).json()
        return received["requests"]  # type: ignore[no-any-return]


def start(
    procs: Processes, redis_server: object, tmp_path: Path, *, max_parallel: int = 2, **env: str
) -> FakeHost:
    host = FakeHost(procs)
    capacity = tmp_path / "capacity.toml"
    capacity.write_text(
        f'[hosts."{HOST}"]\nurl = "{host.url}"\nkind = "ollama"\nmemory_gb = 24\n'
        f"max_parallel = {max_parallel}\n"
    )
    procs.share_redis(
        redis_server,
        f"dh{os.getpid()}",
        GEMMANET_CAPACITY_FILE=str(capacity),
        GEMMANET_HOST_PLACEMENT="on",
        **FAST,
        **env,
    )
    return host


def monitor(procs: Processes, name: str) -> subprocess.Popen[bytes]:
    return procs._popen([*CLI, "monitor", "--id", name])


def host_info(coord: Coordinator) -> dict[str, object]:
    return next(n for n in coord.nodes() if n["node_id"] == HOST)


def host_state(coord: Coordinator) -> object:
    return host_info(coord)["host_state"]


def sse_events(response: httpx.Response) -> list[dict[str, object]]:
    return [json.loads(line[5:]) for line in response.text.splitlines() if line.startswith("data:")]


def test_any_instance_serves_a_request_on_the_host_itself_plain_and_streamed(
    procs, redis_server, tmp_path
) -> None:
    host = start(procs, redis_server, tmp_path)
    a, b = procs.two_instances()
    monitor(procs, "m1")
    wait_until(lambda: host_state(a) == "ok" and host_state(b) == "ok", "fresh host facts")
    info = host_info(b)
    assert info["kind"] == "direct" and info["instance_id"] == "direct", info
    assert info["models"] == ["llama3"] and info["agent_version"] == "ollama", info
    key = procs.create_key("direct")

    plain = a.request(key, model="llama3", prompt="hello from A")
    assert plain.status_code == 200, plain.text
    assert plain.json()["node_id"] == HOST and plain.json()["output"] == "hello from A"
    # The host's own counts, from its final record.
    assert plain.json()["usage"] == {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}
    assert plain.json()["finish_reason"] == "stop"

    streamed = b.request(key, model="llama3", prompt="three little words", stream=True)
    assert streamed.status_code == 200, streamed.text
    assert streamed.headers["content-type"].startswith("text/event-stream")
    events = sse_events(streamed)
    assert [e["delta"] for e in events[:-1]] == ["three ", "little ", "words"], events
    assert events[-1]["done"] is True and events[-1]["node_id"] == HOST, events

    # A conversation goes to the host's chat route, in order, with its options in Ollama's
    # names; the bound is hit, and the host says so.
    turns = [
        {"role": "system", "content": "answer in kind"},
        {"role": "user", "content": "one two three"},
    ]
    chat = b.request(key, model="llama3", messages=turns, options={"max_tokens": 2, "seed": 3})
    assert chat.status_code == 200, chat.text
    assert chat.json()["output"] == "one two" and chat.json()["finish_reason"] == "length"
    assert chat.json()["usage"] == {"prompt_tokens": 6, "completion_tokens": 2, "total_tokens": 8}
    received = host.requests()
    assert [r["path"] for r in received] == ["/api/generate", "/api/generate", "/api/chat"]
    assert received[-1]["body"]["messages"] == turns
    assert received[-1]["body"]["options"] == {"num_predict": 2, "seed": 3}
    assert all(r["refused"] is None for r in received), received

    # The host's model counts among the served ones (queue depths per model, operators only),
    # and the public status names no model.
    operator = procs.create_key("direct-ops", admin=True)
    view = a.http.get("/api/v1/cluster", headers={"Authorization": f"Bearer {operator}"})
    assert view.json()["queued"] == {"llama3": 0}, view.text
    public = a.status()
    assert public["queue_depth"] == 0 and "queued" not in public, public
    assert "llama3" not in json.dumps(public), public
    # The host itself answered all three, and nobody holds a lease any more.
    assert host.stats()["completed"] == 3, host.stats()
    wait_until(lambda: host_info(a)["leases"] == 0, "the host's leases given back")
    # A model the host does not have is not placed on it.
    missing = a.request(key, model="mistral", prompt="x")
    assert missing.status_code == 503, missing.text
    assert missing.json()["error"]["code"] == "no_node_for_model"


async def test_the_hosts_parallel_budget_holds_across_instances(
    procs, redis_server, tmp_path
) -> None:
    host = start(procs, redis_server, tmp_path, max_parallel=1, GEMMANET_QUEUE_TIMEOUT_S="0.5")
    a, b = procs.two_instances()
    monitor(procs, "m1")
    wait_until(lambda: host_state(a) == "ok" and host_state(b) == "ok", "fresh host facts")
    host.configure(chunk_delay_ms=500)
    key = procs.create_key("budget")
    answers: dict[str, httpx.Response] = {}

    async def ask(coord: Coordinator, prompt: str) -> None:
        async with httpx.AsyncClient(base_url=coord.url, timeout=30) as client:
            answers[prompt] = await client.post(
                "/api/v1/request",
                json={"model": "llama3", "prompt": prompt},
                headers={"Authorization": f"Bearer {key}"},
            )

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ask, a, "a slow answer of six words")  # 2.5 s on the host
        await trio.sleep(0.8)
        nursery.start_soon(ask, b, "from b")  # A's lease holds the only slot
    assert answers["a slow answer of six words"].status_code == 200
    busy = answers["from b"]
    assert busy.status_code == 503, busy.text
    assert busy.json()["error"]["code"] == "all_nodes_busy" and "Retry-After" in busy.headers
    assert host.stats()["requests"] == 1  # B never called the host
    wait_until(lambda: host_info(b)["leases"] == 0, "the lease given back")
    host.configure(chunk_delay_ms=0)
    assert b.request(key, model="llama3", prompt="now b").status_code == 200


def test_a_host_whose_facts_go_stale_gets_no_work_until_they_are_fresh_again(
    procs, redis_server, tmp_path
) -> None:
    host = start(procs, redis_server, tmp_path)
    a = procs.coordinator(GEMMANET_INSTANCE_ID="A")
    first = monitor(procs, "m1")
    wait_until(lambda: host_state(a) == "ok", "fresh host facts")
    key = procs.create_key("stale")
    assert a.request(key, model="llama3", prompt="before").status_code == 200

    first.send_signal(signal.SIGKILL)  # nobody refreshes the facts any more
    killed = time.monotonic()
    wait_until(lambda: host_state(a) == "stale", "stale host facts", timeout_s=10)
    print(f"host stale {time.monotonic() - killed:.2f} s after its monitor was killed")
    refused = a.request(key, model="llama3", prompt="while stale")
    assert refused.status_code == 503, refused.text
    assert refused.json()["error"]["code"] == "no_node_for_model"
    assert host_info(a)["models"] == []
    assert host.stats()["requests"] == 1  # nothing reached the host

    monitor(procs, "m2")  # a new epoch, fresh facts
    wait_until(lambda: host_state(a) == "ok", "fresh facts again", timeout_s=10)
    again = a.request(key, model="llama3", prompt="after")
    assert again.status_code == 200 and again.json()["output"] == "after", again.text
    assert host.stats()["requests"] == 2


def test_a_failing_host_gives_502_a_slow_one_504_and_the_lease_is_given_back(
    procs, redis_server, tmp_path
) -> None:
    host = start(procs, redis_server, tmp_path)
    a = procs.coordinator(GEMMANET_INSTANCE_ID="A")
    monitor(procs, "m1")
    wait_until(lambda: host_state(a) == "ok", "fresh host facts")
    key = procs.create_key("fail")

    host.configure(fail="midstream")
    failed = a.request(key, model="llama3", prompt="one two three")
    assert failed.status_code == 502, failed.text
    error = failed.json()["error"]
    assert error["code"] == "node_error" and HOST in error["message"], error
    wait_until(lambda: host_info(a)["leases"] == 0, "the lease given back after a 502")

    host.configure(fail=None, chunk_delay_ms=1500)
    slow = a.request(key, model="llama3", prompt="one two three four", timeout_s=1)
    assert slow.status_code == 504, slow.text
    assert slow.json()["error"]["code"] == "task_timeout", slow.text
    wait_until(lambda: host_info(a)["leases"] == 0, "the lease given back after a 504")
    # The call was stopped with its task: the host saw its client leave (not at the call's
    # own backstop, 5 s past the deadline).
    wait_until(lambda: host.stats()["aborted"] == 1, "the host call dropped", timeout_s=3)
    assert host_info(a)["in_flight"] == 0


def test_a_single_instance_on_the_embedded_store_places_nothing_on_hosts(procs, tmp_path) -> None:
    # The embedded backend, no Redis: the instance elects itself monitor (GEMMANET_MONITOR=1)
    # and the facts are fresh, but a process-local store cannot share a host's capacity.
    host = FakeHost(procs)
    capacity = tmp_path / "capacity.toml"
    capacity.write_text(f'[hosts."{HOST}"]\nurl = "{host.url}"\nkind = "ollama"\n')
    env = {"GEMMANET_CAPACITY_FILE": str(capacity), "GEMMANET_MONITOR": "1", **FAST}
    refused = procs.cli("serve", env={**procs.env, **env, "GEMMANET_HOST_PLACEMENT": "on"})
    assert refused.returncode == 2 and refused.stdout == "", refused
    assert refused.stderr.splitlines() == [
        (
            "gemmanet: GEMMANET_HOST_PLACEMENT=on needs GEMMANET_REDIS_URL: direct hosts are "
            "shared capacity, which a process-local (embedded) store cannot account for"
        )
    ], refused.stderr

    solo = procs.coordinator(**env)  # the default, gated: nobody can switch it on here
    wait_until(lambda: host_state(solo) == "ok", "fresh host facts")
    key = procs.create_key("solo")
    answer = solo.request(key, model="llama3", prompt="all by myself")
    assert answer.status_code == 503, answer.text
    assert answer.json()["error"]["code"] == "no_node_for_model"
    assert host.requests() == []
