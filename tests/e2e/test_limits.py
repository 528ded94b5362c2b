"""Limits that agree end to end (issue 13): what the HTTP API accepts always fits in what a node
accepts, so no client input can close a node's connection; and hostile bodies end in a 4xx with
the JSON error body, never a 500 and a traceback in the log."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest
import trio

from protocol import MAX_PROMPT_BYTES, Assign, Cancel, Chunk
from tests.fixtures.processes import Coordinator, Processes, wait_until
from tests.fixtures.raw_node import raw_node

pytestmark = pytest.mark.e2e


async def _post(coord: Coordinator, key: str, body: dict[str, object]) -> httpx.Response:
    async with httpx.AsyncClient(base_url=coord.url, timeout=60) as client:
        return await client.post(
            "/api/v1/request", json=body, headers={"Authorization": f"Bearer {key}"}
        )


def test_largest_prompt_is_answered_and_a_larger_one_refused_before_placement(
    procs: Processes,
) -> None:
    coord = procs.coordinator()
    procs.node(coord, "big-1", extra=("--latency-ms", "1500", "--max-parallel", "4"))
    key = procs.create_key("client")
    connected_at = coord.nodes()[0]["connected_at"]
    at_limit = "a" * MAX_PROMPT_BYTES
    # 1,048,500 bytes: the body is still under 1 MiB, but its assign would not be (the bug).
    cases = {
        "other": "a task already running on the node",
        "at_limit": at_limit,
        "one_over": at_limit + "b",
        "body_fits": "c" * 1_048_500,
    }
    answers: dict[str, httpx.Response] = {}

    async def one(name: str, prompt: str) -> None:
        answers[name] = await _post(coord, key, {"model": "echo", "prompt": prompt})

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(one, "other", cases["other"])
            await trio.sleep(0.5)  # "other" is running on the node when the big ones arrive
            for name in ("one_over", "body_fits", "at_limit"):
                nursery.start_soon(one, name, cases[name])

    trio.run(main)
    for name in ("one_over", "body_fits"):
        r = answers[name]
        assert r.status_code == 413, (name, r.status_code, r.text[:300])
        error = r.json()["error"]
        assert error["code"] == "payload_too_large"
        assert f"{MAX_PROMPT_BYTES:,}" in error["message"], error["message"]
    assert answers["at_limit"].status_code == 200, answers["at_limit"].text[:300]
    assert answers["at_limit"].json()["output"] == at_limit
    assert answers["other"].status_code == 200, answers["other"].text[:300]
    assert answers["other"].json()["output"] == cases["other"]
    # The same connection still serves: never dropped and reconnected.
    assert [n["connected_at"] for n in coord.nodes()] == [connected_at]


def test_deeply_nested_body_is_a_400_without_a_traceback(procs: Processes) -> None:
    coord = procs.coordinator()
    key = procs.create_key("client")
    body = b'{"model": "echo", "prompt": "x", "junk": ' + b"[" * 1000 + b"]" * 1000 + b"}"
    for path in ("/api/v1/request", "/api/v1/tasks/t-1/rating"):
        r = httpx.post(
            coord.url + path,
            content=body,
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
            timeout=10,
        )
        assert r.status_code == 400, (path, r.status_code, r.text)
        assert r.json()["error"]["code"] == "malformed_json"
        assert "nest" in r.json()["error"]["message"]
    log = Path(coord.proc.log_path).read_text()  # type: ignore[attr-defined]
    assert "Traceback" not in log, log[-2000:]


@pytest.mark.redis
@pytest.mark.parametrize("bus", ["pubsub", "streams"])
def test_largest_prompt_crosses_the_instance_bus(
    procs: Processes, redis_server: object, bus: str
) -> None:
    """The bus.assign a requester sends to the owner of the node is bigger than the node's
    assign: the largest prompt the API accepts fits in it too, both ways across the bus."""
    shared = procs.share_redis(redis_server, f"lim{os.getpid()}{bus}", GEMMANET_BUS=bus)
    a, b = shared.two_instances()
    shared.node(a, "on-a")
    wait_until(lambda: b.has_node("on-a"), "B sees the node of A")
    key = shared.create_key("client")
    prompt = "\u00e9" * (MAX_PROMPT_BYTES // 2)  # two UTF-8 bytes each: exactly the limit
    r = b.request(key, model="echo", prompt=prompt)
    assert r.status_code == 200, r.text[:300]
    assert r.json()["output"] == prompt and r.json()["node_id"] == "on-a"
    r = b.request(key, model="echo", prompt=prompt + "a")
    assert r.status_code == 413 and r.json()["error"]["code"] == "payload_too_large"
    assert b.request(key, model="echo", prompt="still here").json()["output"] == "still here"


def _peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


async def test_a_node_streaming_to_a_stalled_reader_cannot_grow_the_coordinator(
    procs: Processes,
) -> None:
    """Issue 13, item 4: a client stops reading its stream while a node streams 32 MiB. A task
    streams at most what its result could carry (~1 MiB): past that it fails (502
    ``node_error`` as the stream's last event), the node is told to cancel, and the
    coordinator's peak memory grows by a few MiB, not by what the node sent."""
    coord = procs.coordinator()
    token, key = procs.enroll("firehose"), procs.create_key("stalled")
    piece, pieces = "z" * 65536, 512  # 32 MiB
    async with raw_node(coord.url, "firehose", token) as node:
        await trio.to_thread.run_sync(wait_until, lambda: coord.has_node("firehose"), "node")
        peak_before = _peak_rss_mib(coord.proc.pid)
        client = trio.socket.socket()
        # A small receive buffer, so the kernel cannot absorb the stream for the client.
        client.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_RCVBUF, 4096)
        host, port = coord.url.removeprefix("http://").split(":")
        await client.connect((host, int(port)))
        body = b'{"model": "echo", "prompt": "go", "stream": true}'
        await client.send(
            b"POST /api/v1/request HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {key}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        assign = await node.receive()
        assert isinstance(assign, Assign), assign
        cancelled = trio.Event()

        async def watch_for_cancel() -> None:
            envelope = await node.receive(timeout=60)
            assert isinstance(envelope, Cancel) and envelope.task_id == assign.task_id
            cancelled.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch_for_cancel)
            for seq in range(pieces):
                await node.send(Chunk(task_id=assign.task_id, seq=seq, delta=piece))
            await trio.sleep(1)  # the coordinator reads what is still in its socket buffer
            grown = _peak_rss_mib(coord.proc.pid) - peak_before
            assert grown < 16, f"peak RSS grew by {grown:.0f} MiB"
            with trio.fail_after(20):
                await cancelled.wait()
        # The client, reading at last, gets what fitted and then the failure, in order.
        received = b""
        with trio.fail_after(20):
            while b"event: error" not in received and b'"error"' not in received[-400:]:
                received += await client.recv(1 << 20)
        client.close()
        assert received.startswith(b"HTTP/1.1 200"), received[:200]
        assert b'"code":"node_error"' in received[-400:], received[-400:]
        assert coord.healthy() and coord.has_node("firehose")  # the node was not disconnected
