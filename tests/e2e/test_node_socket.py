"""The node WebSocket of a real coordinator process, driven by hand-played nodes: replace,
authentication, protocol errors, answers from the wrong connection, replays, disconnects,
silence, cancel."""

from __future__ import annotations

import itertools
import time

import httpx
import pytest
import trio

from protocol import (
    Assign,
    Cancel,
    Chunk,
    CloseCode,
    Error,
    Heartbeat,
    Hello,
    Result,
    TaskErrorCode,
)
from tests.fixtures.processes import Coordinator, Processes, wait_until
from tests.fixtures.raw_node import raw_node

pytestmark = pytest.mark.e2e


@pytest.fixture
def coord(procs: Processes) -> Coordinator:
    return procs.coordinator()


@pytest.fixture
def key(procs: Processes) -> str:
    return procs.create_key("client")


async def post(coord: Coordinator, key: str, **body: object) -> httpx.Response:
    async with httpx.AsyncClient(base_url=coord.url, timeout=30) as client:
        return await client.post(
            "/api/v1/request", json=body, headers={"Authorization": f"Bearer {key}"}
        )


def spawn_request(
    nursery: trio.Nursery, coord: Coordinator, key: str, **body: object
) -> list[httpx.Response]:
    """Start a client request in the background; its response lands in the returned list."""
    results: list[httpx.Response] = []

    async def client() -> None:
        results.append(await post(coord, key, **body))

    nursery.start_soon(client)
    return results


async def test_second_connection_replaces_the_first_with_4000(procs, coord) -> None:
    token = procs.enroll("dup")
    async with (
        raw_node(coord.url, "dup", token) as first,
        raw_node(coord.url, "dup", token) as second,
    ):
        assert await first.close_code() == CloseCode.REPLACED
        assert second.welcome is not None
        assert coord.status()["online_nodes"] == 1


async def test_bad_token_is_4001(procs, coord) -> None:
    procs.enroll("n1")
    async with raw_node(coord.url, "n1", "gnn_wrong", handshake=False) as node:
        await node.send(Hello(node_id="n1", token="gnn_wrong", models=["echo"]))
        assert await node.close_code() == CloseCode.AUTH_FAILED
    async with raw_node(coord.url, "never-enrolled", "x", handshake=False) as node:
        await node.send(Hello(node_id="never-enrolled", token="gnn_x", models=["echo"]))
        assert await node.close_code() == CloseCode.AUTH_FAILED


@pytest.mark.parametrize(
    "payload",
    [
        "not json at all",
        '{"v": 1, "type": "result", "task_id": "t", "output": "x"}',  # not a hello first
        '{"v": 99, "type": "hello", "node_id": "n1", "token": "t", "models": ["echo"]}',
    ],
)
async def test_bad_first_envelope_is_4002(procs, coord, payload) -> None:
    procs.enroll("n1")
    async with raw_node(coord.url, "n1", "x", handshake=False) as node:
        await node.send_raw(payload)
        assert await node.close_code() == CloseCode.PROTOCOL_ERROR


async def test_garbage_after_hello_is_4002_and_others_are_undisturbed(procs, coord, key) -> None:
    async with (
        raw_node(coord.url, "good", procs.enroll("good")) as good,
        raw_node(coord.url, "bad", procs.enroll("bad"), models=("other",)) as bad,
    ):
        async with trio.open_nursery() as nursery:
            results = spawn_request(nursery, coord, key, model="echo", prompt="still fine")
            assign = await good.receive()
            assert isinstance(assign, Assign)
            await bad.send_raw('{"v": 1, "type": "chunk", "task_id": 5}')
            assert await bad.close_code() == CloseCode.PROTOCOL_ERROR
            await good.send(Result(task_id=assign.task_id, output="still fine"))
        assert results[0].status_code == 200 and results[0].json()["output"] == "still fine"


async def test_only_the_assigned_connection_may_answer(procs, coord, key) -> None:
    async with (
        raw_node(coord.url, "a", procs.enroll("a")) as a,
        raw_node(coord.url, "b", procs.enroll("b"), models=("other",)) as b,
    ):
        async with trio.open_nursery() as nursery:
            results = spawn_request(nursery, coord, key, model="echo", prompt="p")
            assign = await a.receive()
            assert isinstance(assign, Assign)
            # A different node tries to answer a's task: it must not reach the client.
            await b.send(Result(task_id=assign.task_id, output="forged"))
            await b.send(Chunk(task_id=assign.task_id, seq=0, delta="forged"))
            await trio.sleep(0.3)
            await a.send(Result(task_id=assign.task_id, output="genuine"))
        assert results[0].json()["output"] == "genuine"
    dropped = coord.status()["diagnostics"]["dropped_answers"]
    assert dropped["wrong_source"] == 2


async def test_replayed_chunks_and_results_are_delivered_once(procs, coord, key) -> None:
    async with raw_node(coord.url, "a", procs.enroll("a")) as a:
        async with trio.open_nursery() as nursery:
            results = spawn_request(nursery, coord, key, model="echo", prompt="x y", stream=True)
            assign = await a.receive()
            assert isinstance(assign, Assign) and assign.stream
            for envelope in [
                Chunk(task_id=assign.task_id, seq=0, delta="x "),
                Chunk(task_id=assign.task_id, seq=0, delta="x "),
                Chunk(task_id=assign.task_id, seq=1, delta="y"),
                Chunk(task_id=assign.task_id, seq=0, delta="x "),
                Result(task_id=assign.task_id, output="x y", chunks=2),
                Result(task_id=assign.task_id, output="again", chunks=2),
            ]:
                await a.send(envelope)
        text = results[0].text
        assert text.count('"delta"') == 2 and text.count('"done"') == 1
        assert "again" not in text


async def test_node_disconnect_mid_task_is_502_at_once(procs, coord, key) -> None:
    results: list[tuple[httpx.Response, float]] = []
    async with trio.open_nursery() as nursery, raw_node(coord.url, "a", procs.enroll("a")) as a:

        async def client() -> None:
            response = await post(coord, key, model="echo", prompt="p")
            results.append((response, time.monotonic()))

        nursery.start_soon(client)
        assert isinstance(await a.receive(), Assign)
        closed_at = time.monotonic()
        # leaving the block closed the socket mid-task
    response, answered_at = results[0]
    assert response.status_code == 502
    assert response.json()["error"]["code"] == TaskErrorCode.NODE_DISCONNECTED
    assert answered_at - closed_at < 1.0


async def test_stream_gets_error_event_when_node_dies_after_first_chunk(procs, coord, key) -> None:
    results: list[httpx.Response] = []
    async with trio.open_nursery() as nursery, raw_node(coord.url, "a", procs.enroll("a")) as a:

        async def client() -> None:
            results.append(await post(coord, key, model="echo", prompt="p q", stream=True))

        nursery.start_soon(client)
        assign = await a.receive()
        await a.send(Chunk(task_id=assign.task_id, seq=0, delta="p "))
        await trio.sleep(0.2)
    response = results[0]
    assert response.status_code == 200
    assert '"delta": "p "' in response.text or '"delta":"p "' in response.text
    assert (
        f'"{TaskErrorCode.NODE_DISCONNECTED}"' in response.text and '"status":502' in response.text
    )


async def test_node_error_is_502_node_error(procs, coord, key) -> None:
    async with raw_node(coord.url, "a", procs.enroll("a")) as a, trio.open_nursery() as nursery:
        results = spawn_request(nursery, coord, key, model="echo", prompt="p")
        assign = await a.receive()
        await a.send(Error(task_id=assign.task_id, code="backend_error", message="boom"))
    assert results[0].status_code == 502
    assert results[0].json()["error"]["code"] == "node_error"
    assert "boom" in results[0].json()["error"]["message"]


async def test_silent_node_is_dropped_and_its_task_fails(procs, coord, key) -> None:
    async with raw_node(coord.url, "quiet", procs.enroll("quiet")) as node:
        async with trio.open_nursery() as nursery:
            results = spawn_request(nursery, coord, key, model="echo", prompt="p")
            assert isinstance(await node.receive(), Assign)
            node.silence()
            started = time.monotonic()
        # heartbeat 0.5 s x 3 misses: dropped after 1.5-2 s, not after the 120 s task timeout
        assert results[0].status_code == 502
        assert time.monotonic() - started < 5
        assert await node.close_code() == CloseCode.HEARTBEAT_TIMEOUT
    assert coord.status()["online_nodes"] == 0


async def test_client_going_away_cancels_the_task_on_the_node(procs, coord, key) -> None:
    async with raw_node(coord.url, "a", procs.enroll("a")) as a:
        with trio.move_on_after(0.5) as scope:
            async with httpx.AsyncClient(base_url=coord.url) as client:
                await client.post(
                    "/api/v1/request",
                    json={"model": "echo", "prompt": "abandoned"},
                    headers={"Authorization": f"Bearer {key}"},
                )
        assert scope.cancelled_caught
        assign = await a.receive()
        assert isinstance(assign, Assign) and assign.prompt == "abandoned"
        cancel = await a.receive()
        assert isinstance(cancel, Cancel) and cancel.task_id == assign.task_id
    wait_until(lambda: coord.status()["in_flight"] == 0, "in_flight back to 0")


async def test_max_parallel_is_honoured(procs, coord, key) -> None:
    """A second request for a full node waits for its lease: the node never gets two tasks
    at once, and the second runs as soon as the first ends."""
    async with raw_node(coord.url, "single", procs.enroll("single"), max_parallel=1) as node:
        async with trio.open_nursery() as nursery:
            first = spawn_request(nursery, coord, key, model="echo", prompt="first")
            assign = await node.receive()
            second = spawn_request(nursery, coord, key, model="echo", prompt="second")
            with trio.move_on_after(1.0) as waited:
                await node.receive()  # nothing may arrive while the first runs
            assert waited.cancelled_caught and not second
            await node.send(Result(task_id=assign.task_id, output="first"))
            next_assign = await node.receive()
            assert next_assign.prompt == "second"
            await node.send(Result(task_id=next_assign.task_id, output="second"))
        assert first[0].status_code == 200 and second[0].status_code == 200
        assert second[0].json()["output"] == "second"


async def test_every_node_hears_the_coordinators_heartbeat_every_interval(procs, coord) -> None:
    """One timer sends the heartbeat to every connection (runtime/node_socket.py): each node
    gets one per interval (0.5 s here), whenever it connected, so its agent never declares a
    live coordinator dead (three missed: 1.5 s)."""
    heard: dict[str, list[float]] = {"early": [], "late": []}

    async def listen(node_id: str) -> None:
        async with raw_node(coord.url, node_id, procs.enroll(node_id)) as node:
            with trio.move_on_after(3.0):
                while True:
                    envelope = await node.receive(skip_heartbeats=False)
                    assert isinstance(envelope, Heartbeat), envelope
                    heard[node_id].append(trio.current_time())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(listen, "early")
        await trio.sleep(0.3)  # the second node joins between two ticks
        nursery.start_soon(listen, "late")
    for node_id, times in heard.items():
        assert len(times) >= 4, (node_id, times)  # 3 s at 0.5 s, with room for a slow start
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert max(gaps) < 1.2, (node_id, gaps)  # never near the 1.5 s of three misses
