"""Faults under real processes, real sockets and a real Redis: Redis dying and coming back while
clients keep sending requests to two instances, the requesting instance dying while a node on
the owner works for it, and a streaming client hanging up mid-stream."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import trio

from protocol import Assign, Cancel, Chunk, Result
from tests.fixtures.processes import Coordinator, Processes, open_loop, wait_until
from tests.fixtures.raw_node import raw_node

pytestmark = pytest.mark.e2e


# -- helpers ----------------------------------------------------------------------------------


@pytest.fixture
def shared(procs: Processes, redis_server) -> Processes:
    """Processes sharing one private Redis (the test may stop and restart it)."""
    return procs.share_redis(redis_server, f"fx{os.getpid()}")


async def await_until(
    predicate: Callable[[], Awaitable[Any]], what: str, timeout_s: float = 10.0
) -> Any:
    """``wait_until`` for async tests: polls without blocking trio, so raw nodes keep beating."""
    last: Exception | None = None
    with trio.move_on_after(timeout_s):
        while True:
            try:
                value = await predicate()
                if value:
                    return value
            except Exception as exc:  # noqa: BLE001 - keep polling, report the last one
                last = exc
            await trio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what} (last error: {last!r})")


async def get_json(coord: Coordinator, path: str, key: str | None = None) -> Any:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with httpx.AsyncClient(base_url=coord.url, timeout=5) as client:
        response = await client.get(path, headers=headers)
        response.raise_for_status()
        return response.json()


async def diagnostics(coord: Coordinator) -> dict[str, Any]:
    return (await get_json(coord, "/api/v1/status"))["diagnostics"]  # type: ignore[no-any-return]


async def node_in_flight(coord: Coordinator, node_id: str) -> int | None:
    nodes = (await get_json(coord, "/api/v1/nodes", coord.probe_key))["nodes"]
    return next((n["in_flight"] for n in nodes if n["node_id"] == node_id), None)


def redis_subscribers(shared: Processes, channel: str) -> int:
    """PUBSUB NUMSUB straight from the server, not through the code under test."""
    prefix = shared.env["GEMMANET_KEY_PREFIX"]
    reply = shared.redis.raw_command("PUBSUB", "NUMSUB", f"{prefix}:{channel}")  # type: ignore[attr-defined]
    return int(reply.rsplit(b":", 1)[1].strip())


# -- 1. Redis stopped and restarted under load --------------------------------------------------


@dataclass
class Outcome:
    target: str
    prompt: str
    started: float
    finished: float
    status: int | None  # None: no HTTP answer at all (client timeout or broken connection)
    body: Any = None
    retry_after: str | None = None
    failure: str | None = None

    @property
    def took(self) -> float:
        return self.finished - self.started


RATE_HZ = 20.0
CLIENT_TIMEOUT_S = 10.0


@pytest.mark.redis
async def test_redis_restart_under_load_answers_every_request_and_recovers(shared) -> None:
    shared.env["GEMMANET_RATE_LIMIT"] = "100000/minute"
    a, b = shared.two_instances()
    latency = ("--max-parallel", "32", "--latency-ms", "100-400")
    shared.node(a, "n-a", extra=latency)
    shared.node(b, "n-b", extra=latency)
    wait_until(lambda: len(a.nodes()) == 2 and len(b.nodes()) == 2, "both nodes everywhere")
    key = shared.create_key("load")
    coords = {"A": a, "B": b}
    outcomes: list[Outcome] = []
    # A fresh connection per request: a keep-alive connection that carried an early error
    # answer can hang (see test_early_error_answer_leaves_keep_alive_connection_usable).
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=0)
    clients = {
        name: httpx.AsyncClient(base_url=c.url, timeout=CLIENT_TIMEOUT_S, limits=limits)
        for name, c in coords.items()
    }

    async def one(i: int) -> None:
        target, prompt = "AB"[i % 2], f"p{i}"
        started = time.monotonic()
        try:
            r = await clients[target].post(
                "/api/v1/request",
                json={"model": "echo", "prompt": prompt},
                headers={"Authorization": f"Bearer {key}"},
            )
        except httpx.HTTPError as exc:
            outcomes.append(
                Outcome(target, prompt, started, time.monotonic(), None, failure=repr(exc))
            )
            return
        try:
            body: Any = r.json()
        except ValueError:
            body = r.text
        outcomes.append(
            Outcome(
                target,
                prompt,
                started,
                time.monotonic(),
                r.status_code,
                body,
                r.headers.get("Retry-After"),
            )
        )

    stop = trio.Event()
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(open_loop, one, RATE_HZ, stop)
            await trio.sleep(1.5)
            stopped_at = time.monotonic()
            await trio.to_thread.run_sync(shared.redis.stop)
            await trio.sleep(2.0)
            await trio.to_thread.run_sync(shared.redis.start)
            restarted_at = time.monotonic()
            await trio.sleep(4.0)
            load_ended_at = time.monotonic()
            stop.set()
    finally:
        for client in clients.values():
            await client.aclose()

    outcomes.sort(key=lambda o: o.started)
    summary = [
        (o.target, round(o.started - stopped_at, 2), o.status, round(o.took, 2)) for o in outcomes
    ]
    assert len(outcomes) >= 0.8 * RATE_HZ * 7.5, summary

    # Every request got an HTTP answer, none hung up to the client timeout.
    no_answer = [o for o in outcomes if o.status is None]
    assert not no_answer, [(o.target, o.started - stopped_at, o.failure) for o in no_answer]
    assert max(o.took for o in outcomes) < CLIENT_TIMEOUT_S - 1, summary

    # Every failure is a 502 or a 503 with the JSON error body; a 503 says when to retry.
    for o in outcomes:
        if o.status == 200:
            assert o.body["output"] == o.prompt and o.body["node_id"] in {"n-a", "n-b"}, o
            continue
        assert o.status in (502, 503), (o.status, o.body)
        assert isinstance(o.body, dict) and set(o.body) == {"error"}, o.body
        assert isinstance(o.body["error"]["code"], str) and o.body["error"]["message"], o.body
        if o.status == 503:
            assert o.retry_after is not None and int(o.retry_after) >= 1, o

    # Before the outage everything worked.
    before = [o for o in outcomes if o.finished < stopped_at]
    assert before and all(o.status == 200 for o in before), summary

    # During the outage clients are told at once that coordination is unavailable.
    during = [o for o in outcomes if stopped_at + 0.2 <= o.started < restarted_at - 0.2]
    refused = [o for o in during if o.status == 503]
    assert len(refused) >= len(during) // 2, summary
    assert any(o.body["error"]["code"] == "coordination_unavailable" for o in refused), summary
    slow = [o for o in outcomes if o.status == 503 and o.took >= 1.5]
    assert not slow, [(o.target, o.started - stopped_at, o.took) for o in slow]
    # Tasks caught crossing the bus when it went away end with 502 at once, not at a timeout.
    slow = [o for o in outcomes if o.status == 502 and o.took >= 2.5]
    assert not slow, [(o.target, o.started - stopped_at, o.took, o.body) for o in slow]

    # Once Redis is back both instances serve again: the last second is all 200, on both.
    tail = [o for o in outcomes if o.started >= load_ended_at - 1.0]
    assert tail and all(o.status == 200 for o in tail), summary
    assert {o.target for o in tail} == {"A", "B"}
    # ... and each reaches the node of the other again (the registry was rebuilt in Redis).
    recovered = {
        (o.target, o.body["node_id"])
        for o in outcomes
        if o.status == 200 and o.started >= restarted_at + 2
    }
    assert {("A", "n-b"), ("B", "n-a")} <= recovered, recovered


# -- 2. the requesting instance dies while the owner's node works for it -----------------------


@pytest.mark.redis
@pytest.mark.parametrize("answer", ["chunk", "result", "silent"])
async def test_requester_killed_leaves_nothing_behind_on_the_owner(shared, answer) -> None:
    """B places a task on a node connected to A, then B is kill -9'd. Whatever the node does
    next, A ends up forwarding nothing and the node's slot is free again, within about a
    second — not at the task's timeout:

    * ``chunk``: the node streams on; A's sweep (B has no inbox any more) or the PUBLISH of the
      chunk reaching nobody makes A forget the forward and send the node a Cancel
      (``requester_gone``). A later Result is dropped.
    * ``result``: the node answers; A forgets the forward (if its sweep got there first, the
      node also got a Cancel, which it may ignore: the task is over).
    * ``silent``: the node never answers; A's sweep cancels it (``requester_gone``) within
      about a second of B's death, far before the task timeout plus grace.
    """
    a, b = shared.two_instances()
    key = shared.create_key("client")
    timeout_s = 1.0
    async with raw_node(a.url, "worker", shared.enroll("worker")) as node:
        await await_until(lambda: trio.to_thread.run_sync(b.has_node, "worker"), "B sees worker")
        client_failures: list[BaseException] = []

        async def client() -> None:
            try:
                async with httpx.AsyncClient(base_url=b.url, timeout=30) as http:
                    await http.post(
                        "/api/v1/request",
                        json={
                            "model": "echo",
                            "prompt": "orphan",
                            "stream": answer == "chunk",
                            "timeout_s": timeout_s,
                        },
                        headers={"Authorization": f"Bearer {key}"},
                    )
            except httpx.HTTPError as exc:
                client_failures.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(client)
            assign = await node.receive()
            assert isinstance(assign, Assign) and assign.prompt == "orphan"
            assigned_at = time.monotonic()
            assert (await diagnostics(a))["forwarded_in_flight"] == 1
            assert await node_in_flight(a, "worker") == 1
            os.kill(b.proc.pid, signal.SIGKILL)
        # The client lost its connection with B; B's bus inbox is gone from Redis.
        assert client_failures, "the client of the killed instance got an answer"
        await await_until(lambda: _no_subscribers(shared, "inst:bus:B"), "B's inbox unsubscribed")
        killed_at = time.monotonic()

        if answer == "chunk":
            await node.send(Chunk(task_id=assign.task_id, seq=0, delta="orph"))
            cancel = await node.receive(timeout=3)
            assert isinstance(cancel, Cancel), cancel
            assert cancel.task_id == assign.task_id and cancel.reason == "requester_gone"
            assert (await diagnostics(a))["forwarded_in_flight"] == 0
            # The node finishes anyway: A drops that answer, it reaches nobody.
            # An answer after the task's end is a "duplicate" (A remembers the task ended).
            before = (await diagnostics(a))["dropped_answers"]["duplicate"]
            await node.send(Result(task_id=assign.task_id, output="orphan", chunks=1))
            await await_until(lambda: _dropped_late_above(a, before), "the late result dropped", 3)
        elif answer == "result":
            await node.send(Result(task_id=assign.task_id, output="orphan"))
            await await_until(
                lambda: _forwarded_is(a, 0), "A forgets the forward after the answer", 3
            )
            # If anything reaches the node now, it can only be A's cancel of that same task.
            with trio.move_on_after(1.0):
                envelope = await node.receive(timeout=2)
                assert isinstance(envelope, Cancel) and envelope.task_id == assign.task_id
                assert envelope.reason == "requester_gone"
        else:
            cancel = await node.receive(timeout=5)
            cancelled_after = time.monotonic() - killed_at
            assert isinstance(cancel, Cancel), cancel
            assert cancel.task_id == assign.task_id and cancel.reason == "requester_gone"
            # within a beat or two of B's inbox closing; the task timeout plus grace is 6 s
            assert cancelled_after < 2.0, cancelled_after
            assert time.monotonic() - assigned_at < timeout_s + 5
            assert (await diagnostics(a))["forwarded_in_flight"] == 0

        # The node's slot is free again: A places a new task there and it is served.
        await await_until(lambda: _in_flight_is(a, "worker", 0), "worker's slot freed", 3)
        async with trio.open_nursery() as nursery:
            responses: list[httpx.Response] = []

            async def again() -> None:
                async with httpx.AsyncClient(base_url=a.url, timeout=10) as http:
                    responses.append(
                        await http.post(
                            "/api/v1/request",
                            json={"model": "echo", "prompt": "next"},
                            headers={"Authorization": f"Bearer {key}"},
                        )
                    )

            nursery.start_soon(again)
            assign2 = await node.receive()
            assert isinstance(assign2, Assign) and assign2.prompt == "next"
            await node.send(Result(task_id=assign2.task_id, output="next"))
        assert responses[0].status_code == 200 and responses[0].json()["output"] == "next"
        assert (await diagnostics(a))["forwarded_in_flight"] == 0


async def _no_subscribers(shared: Processes, channel: str) -> bool:
    return await trio.to_thread.run_sync(redis_subscribers, shared, channel) == 0


async def _forwarded_is(coord: Coordinator, value: int) -> bool:
    return (await diagnostics(coord))["forwarded_in_flight"] == value


async def _in_flight_is(coord: Coordinator, node_id: str, value: int) -> bool:
    return await node_in_flight(coord, node_id) == value


async def _dropped_late_above(coord: Coordinator, before: int) -> bool:
    return (await diagnostics(coord))["dropped_answers"]["duplicate"] > before


# -- 3. a streaming client hangs up mid-stream --------------------------------------------------


async def test_stream_client_disconnect_mid_stream_cancels_on_the_node(procs) -> None:
    coord = procs.coordinator()
    key = procs.create_key("client")
    async with (
        raw_node(coord.url, "streamer", procs.enroll("streamer")) as node,
        httpx.AsyncClient(base_url=coord.url, timeout=10) as http,
    ):
        async with trio.open_nursery() as nursery:
            got_first = trio.Event()
            events: list[dict[str, Any]] = []

            async def client() -> None:
                async with http.stream(
                    "POST",
                    "/api/v1/request",
                    json={"model": "echo", "prompt": "one two three four", "stream": True},
                    headers={"Authorization": f"Bearer {key}"},
                ) as response:
                    assert response.status_code == 200
                    async for line in response.aiter_lines():
                        if line.startswith("data: "):
                            events.append(json.loads(line[6:]))
                            got_first.set()
                            return  # leaving the block closes the connection mid-stream

            nursery.start_soon(client)
            assign = await node.receive()
            assert isinstance(assign, Assign) and assign.stream
            await node.send(Chunk(task_id=assign.task_id, seq=0, delta="one "))
            with trio.fail_after(5):
                await got_first.wait()
        assert events == [{"delta": "one "}]
        # The client is gone: the node is told to stop, and the slot is freed.
        cancel = await node.receive(timeout=5)
        assert isinstance(cancel, Cancel) and cancel.task_id == assign.task_id, cancel
        await await_until(
            lambda: _status_in_flight_is(coord, 0), "in_flight back to 0", timeout_s=5
        )
        assert await node_in_flight(coord, "streamer") == 0
        # Whatever the node still sends for it is dropped, and the node keeps serving.
        await node.send(Chunk(task_id=assign.task_id, seq=1, delta="two "))
        await node.send(Result(task_id=assign.task_id, output="one two", chunks=2))
        async with trio.open_nursery() as nursery:
            responses: list[httpx.Response] = []

            async def again() -> None:
                responses.append(
                    await http.post(
                        "/api/v1/request",
                        json={"model": "echo", "prompt": "fresh"},
                        headers={"Authorization": f"Bearer {key}"},
                    )
                )

            nursery.start_soon(again)
            assign2 = await node.receive()
            assert isinstance(assign2, Assign) and assign2.prompt == "fresh"
            await node.send(Result(task_id=assign2.task_id, output="fresh"))
        assert responses[0].status_code == 200 and responses[0].json()["output"] == "fresh"
    dropped = (await get_json(coord, "/api/v1/status"))["diagnostics"]["dropped_answers"]
    assert sum(dropped.values()) >= 2, dropped


async def _status_in_flight_is(coord: Coordinator, value: int) -> bool:
    return (await get_json(coord, "/api/v1/status"))["in_flight"] == value


# -- 4. an error answered before the request body was read -------------------------------------


def _read_response(sock: socket.socket) -> bytes | None:
    """One whole HTTP response (headers plus Content-Length body); None when the server
    closed the connection before sending anything."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return None if not data else data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        (
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        ),
        0,
    )
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return data


def _early_error_then_next_request(host: str, port: int, path: str) -> str | None:
    """POST ``path`` with an unknown key, the body sent only after the 401 came back, then
    one more request on the same connection. None when the connection stayed usable (or was
    closed with ``Connection: close``); otherwise what went wrong."""
    body = b'{"model": "echo", "prompt": "x", "score": 3}'
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer gnk_unknown\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection((host, port), timeout=3) as sock:
        sock.sendall(head)
        sock.settimeout(2)
        try:
            first = _read_response(sock)  # answered before the body was sent (the bug's trigger)
        except TimeoutError:
            first = None  # a server that reads the body first waits for it: fine
        sock.settimeout(1.5)
        time.sleep(0.2)  # the server has finished that request by now
        sock.sendall(body)
        if first is None:
            first = _read_response(sock)
        assert first is not None and first.startswith(b"HTTP/1.1 401"), first
        if b"connection: close" in first.lower():
            return None  # the server closes the connection: the client opens a new one
        sock.sendall(f"GET /healthz HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        try:
            second = _read_response(sock)
        except TimeoutError:
            return f"{path}: the next request on the keep-alive connection was never answered"
        if second is None or not second.startswith(b"HTTP/1.1 200"):
            return f"{path}: the next request got {second!r}"
    return None


def test_early_error_answer_leaves_keep_alive_connection_usable(procs) -> None:
    """An HTTP/1.1 client (httpx's async client does this) sends the headers and the body of a
    POST in separate writes; when the answer (here 401: unknown key) comes before the body,
    the connection must still serve its next request, or be closed with ``Connection: close``.
    Seen under load with keep-alive: ~5-20% of the requests following a 401/503 on the same
    connection hung until the client's timeout, until the routes read the body first."""
    coord = procs.coordinator()
    host, port = coord.url.removeprefix("http://").split(":")
    paths = ["/api/v1/request", "/api/v1/tasks/t-1/rating"]
    # warm up: the first request of a fresh process can be slow to answer
    assert (
        coord.http.post(paths[0], json={}, headers={"Authorization": "Bearer x"}).status_code == 401
    )
    problems = [_early_error_then_next_request(host, int(port), path) for path in paths]
    assert not [p for p in problems if p], problems
