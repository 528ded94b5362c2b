"""The node agent against a minimal fake coordinator speaking protocol v1 over real sockets."""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
from collections.abc import AsyncIterator, Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
from trio_websocket import (
    ConnectionClosed,
    WebSocketConnection,
    WebSocketRequest,
    serve_websocket,
)

from protocol import (
    MAX_OUTPUT_BYTES,
    PROTOCOL_VERSION,
    Assign,
    Cancel,
    Chunk,
    CloseCode,
    Error,
    Heartbeat,
    Hello,
    Result,
    TaskErrorCode,
    Welcome,
    decode_node,
    encode,
)
from protocol.model_servers import Generation
from tools.fakes.ollama import FakeOllama
from tools.node_agent import (
    AgentConfig,
    AgentExit,
    BackendError,
    EchoBackend,
    NodeAgent,
    OllamaBackend,
    UsageError,
    add_node_arguments,
    backoff_delay,
    coordinator_ws_url,
    run_node,
    split_words,
)

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "secret-token"
INTERVAL = 0.1
PROMPT = "  The quick brown fox\njumps over  the lazy dog. "


async def wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.005)


# --- fake coordinator --------------------------------------------------------------------------


class NodeConn:
    """The coordinator's end of one accepted node connection."""

    def __init__(self, ws: WebSocketConnection, hello: Hello) -> None:
        self.ws = ws
        self.hello = hello
        self.heartbeats: list[Heartbeat] = []
        self.raw_types: set[type] = set()
        self.close_code: int | None = None
        self.ended = trio.Event()
        self._frames_send, self._frames = trio.open_memory_channel[Any](1000)

    async def send(self, envelope: Any) -> None:
        await self.ws.send_message(encode(envelope).decode())

    async def recv(self, timeout: float = 5.0) -> Any:
        """The next frame other than a heartbeat."""
        with trio.fail_after(timeout):
            return await self._frames.receive()

    def pending(self) -> list[Any]:
        frames = []
        while True:
            try:
                frames.append(self._frames.receive_nowait())
            except (trio.WouldBlock, trio.EndOfChannel):
                return frames

    async def close(self, code: int, reason: str = "") -> None:
        await self.ws.aclose(code, reason)

    async def drop(self) -> None:
        """Lose the TCP connection without a close frame."""
        await self.ws._stream.aclose()  # a private attribute: simulating a dead link

    async def wait_closed(self, timeout: float = 5.0) -> int | None:
        with trio.fail_after(timeout):
            await self.ended.wait()
        return self.close_code

    async def _read(self) -> None:
        try:
            while True:
                raw = await self.ws.get_message()
                self.raw_types.add(type(raw))
                envelope = decode_node(raw)
                if isinstance(envelope, Heartbeat):
                    self.heartbeats.append(envelope)
                else:
                    await self._frames_send.send(envelope)
        except ConnectionClosed:
            pass
        finally:
            self.close_code = self.ws.closed.code if self.ws.closed else None
            self._frames_send.close()
            self.ended.set()


class FakeCoordinator:
    def __init__(self, *, token: str = TOKEN, interval: float = INTERVAL) -> None:
        self.token = token
        self.interval = interval
        self.send_heartbeats = True
        self.welcome = True  # False: read the hello, then close with 1011 instead of welcoming
        self.hellos: list[Hello] = []
        self.paths: list[str] = []
        self.connect_times: list[float] = []
        self.conns: list[NodeConn] = []
        self._new_send, self._new = trio.open_memory_channel[NodeConn](100)
        self.url = ""

    async def run(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            server = await nursery.start(
                partial(serve_websocket, self._handle, "127.0.0.1", 0, None)
            )
            self.url = f"http://127.0.0.1:{server.port}"
            task_status.started(self.url)

    async def next_conn(self, timeout: float = 5.0) -> NodeConn:
        with trio.fail_after(timeout):
            return await self._new.receive()

    async def _handle(self, request: WebSocketRequest) -> None:
        self.connect_times.append(trio.current_time())
        ws = await request.accept()
        self.paths.append(request.path)
        hello = decode_node(await ws.get_message())
        assert isinstance(hello, Hello)
        self.hellos.append(hello)
        if hello.token != self.token:
            await ws.aclose(CloseCode.AUTH_FAILED, "authentication failed")
            return
        if not self.welcome:
            await ws.aclose(CloseCode.INTERNAL_ERROR, "not today")
            return
        n = len(self.conns)
        await ws.send_message(
            encode(
                Welcome(
                    instance_id="inst-a", conn_id=f"conn-{n}", heartbeat_interval_s=self.interval
                )
            ).decode()
        )
        conn = NodeConn(ws, hello)
        self.conns.append(conn)
        await self._new_send.send(conn)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(conn._read)
            if self.send_heartbeats:
                nursery.start_soon(self._heartbeat, conn)
            await conn.ended.wait()
            nursery.cancel_scope.cancel()

    async def _heartbeat(self, conn: NodeConn) -> None:
        try:
            while True:
                await conn.send(Heartbeat(in_flight=0))
                await trio.sleep(self.interval)
        except ConnectionClosed:
            pass


@pytest.fixture
async def coordinator(nursery: trio.Nursery) -> FakeCoordinator:
    coord = FakeCoordinator()
    await nursery.start(coord.run)
    return coord


# --- test backends -----------------------------------------------------------------------------


class GateBackend:
    """Yields one delta, then waits for ``release`` before the second; records cancellation."""

    name = "gate"

    def __init__(self) -> None:
        self.release = trio.Event()
        self.started: list[str] = []
        self.cancelled: list[str] = []

    async def generate(self, request: Generation) -> AsyncIterator[str]:
        prompt = request.input_text
        self.started.append(prompt)
        try:
            yield f"{prompt}:first "
            await self.release.wait()
            yield f"{prompt}:second"
        except trio.Cancelled:
            self.cancelled.append(prompt)
            raise

    async def resident(self, models: tuple[str, ...]) -> list[str] | None:
        return None

    async def aclose(self) -> None:
        pass


class BrokenBackend:
    name = "broken"

    async def generate(self, request: Generation) -> AsyncIterator[str]:
        yield "partial "
        if request.prompt == "bug":
            raise RuntimeError("unexpected thing")
        raise BackendError("ollama: HTTP 500: out of memory")

    async def resident(self, models: tuple[str, ...]) -> list[str] | None:
        return None

    async def aclose(self) -> None:
        pass


class FloodBackend:
    """A model that talks too much: 600,000 bytes, twice."""

    name = "flood"

    async def generate(self, request: Generation) -> AsyncIterator[str]:
        yield "x" * 600_000
        yield "y" * 600_000

    async def resident(self, models: tuple[str, ...]) -> list[str] | None:
        return None

    async def aclose(self) -> None:
        pass


class AgentRun:
    def __init__(self, agent: NodeAgent) -> None:
        self.agent = agent
        self.done = trio.Event()
        self.exit: AgentExit | None = None

    async def main(self) -> None:
        try:
            await self.agent.run()
        except AgentExit as exc:
            self.exit = exc
        finally:
            self.done.set()

    async def wait(self, timeout: float = 5.0) -> AgentExit | None:
        with trio.fail_after(timeout):
            await self.done.wait()
        return self.exit


def start_agent(
    nursery: trio.Nursery,
    url: str,
    backend: Any = None,
    *,
    token: str = TOKEN,
    models: tuple[str, ...] = ("gemma3:4b",),
    seed: int = 1,
    **config: Any,
) -> AgentRun:
    settings: dict[str, Any] = {
        "max_parallel": 4,
        "backoff_initial_s": 0.02,
        "backoff_max_s": 0.1,
        "handshake_timeout_s": 2.0,
        "close_timeout_s": 1.0,
    }
    settings.update(config)
    agent = NodeAgent(
        AgentConfig(
            ws_url=coordinator_ws_url(url), node_id="node-1", token=token, models=models, **settings
        ),
        backend if backend is not None else EchoBackend(),
        rng=random.Random(seed),
    )
    run = AgentRun(agent)
    nursery.start_soon(run.main)
    return run


def assign(task_id: str, prompt: str = PROMPT, *, stream: bool = True, **kw: Any) -> Assign:
    return Assign(
        task_id=task_id, model=kw.pop("model", "gemma3:4b"), prompt=prompt, stream=stream, **kw
    )


# --- pure pieces -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("base", "ws"),
    [
        ("http://127.0.0.1:8000", "ws://127.0.0.1:8000/ws/node"),
        ("http://127.0.0.1:8000/", "ws://127.0.0.1:8000/ws/node"),
        ("https://gemma.example", "wss://gemma.example/ws/node"),
        ("HTTPS://gemma.example:8443/gn/", "wss://gemma.example:8443/gn/ws/node"),
        ("ws://h:1/ws/node", "ws://h:1/ws/node"),
    ],
)
def test_websocket_address_derives_from_the_base_url(base: str, ws: str) -> None:
    assert coordinator_ws_url(base) == ws


@pytest.mark.parametrize(
    "bad", ["127.0.0.1:8000", "ftp://h", "http://", "http://h:99999", "http://h/?x=1"]
)
def test_bad_coordinator_urls_are_refused(bad: str) -> None:
    with pytest.raises(UsageError, match="--coordinator"):
        coordinator_ws_url(bad)


def test_backoff_is_exponential_with_full_jitter_and_a_cap() -> None:
    rng = random.Random(42)
    for attempt in range(12):
        ceiling = min(30.0, 0.5 * 2**attempt)
        samples = [backoff_delay(attempt, rng, initial_s=0.5, max_s=30.0) for _ in range(300)]
        assert all(0.0 <= s <= ceiling for s in samples)
        assert max(samples) > 0.9 * ceiling and min(samples) < 0.1 * ceiling  # full jitter
    assert backoff_delay(10_000, rng, initial_s=0.5, max_s=30.0) <= 30.0
    again = [backoff_delay(a, random.Random(5), initial_s=0.5, max_s=30.0) for a in range(8)]
    assert again == [
        backoff_delay(a, random.Random(5), initial_s=0.5, max_s=30.0) for a in range(8)
    ]


# --- connection --------------------------------------------------------------------------------


async def test_hello_welcome_and_heartbeats(
    coordinator: FakeCoordinator, nursery: trio.Nursery
) -> None:
    start_agent(
        nursery, coordinator.url, max_parallel=3, vram_gb=24.0, models=("gemma3:4b", "gemma3:27b")
    )
    conn = await coordinator.next_conn()
    assert coordinator.paths == ["/ws/node"]
    hello = conn.hello
    # The hello is v1, so any coordinator reads it, and offers every version the agent speaks.
    assert (hello.v, hello.node_id, hello.token) == (1, "node-1", TOKEN)
    assert hello.protocols == [1, PROTOCOL_VERSION]
    assert hello.models == ["gemma3:4b", "gemma3:27b"]
    assert (hello.max_parallel, hello.vram_gb) == (3, 24.0)
    assert hello.agent_version.startswith("gemmanet-node/")
    await wait_until(lambda: len(conn.heartbeats) >= 3)
    assert {hb.in_flight for hb in conn.heartbeats} == {0}
    assert conn.raw_types == {str}  # text frames
    assert conn.pending() == []


async def test_streamed_task_sends_ordered_chunks_then_the_result(
    coordinator: FakeCoordinator, nursery: trio.Nursery
) -> None:
    start_agent(nursery, coordinator.url)
    conn = await coordinator.next_conn()
    await conn.send(assign("t1"))
    pieces = split_words(PROMPT)
    chunks = [await conn.recv() for _ in pieces]
    assert chunks == [Chunk(task_id="t1", seq=i, delta=p) for i, p in enumerate(pieces)]
    assert await conn.recv() == Result(task_id="t1", output=PROMPT, chunks=len(pieces))


async def test_unstreamed_task_sends_only_the_result(
    coordinator: FakeCoordinator, nursery: trio.Nursery
) -> None:
    start_agent(nursery, coordinator.url)
    conn = await coordinator.next_conn()
    await conn.send(assign("t1", stream=False))
    await conn.send(assign("t2", "", stream=True))
    frames = [await conn.recv(), await conn.recv()]
    assert sorted(frames, key=lambda f: f.task_id) == [
        Result(task_id="t1", output=PROMPT, chunks=0),
        Result(task_id="t2", output="", chunks=0),
    ]


async def test_concurrent_streams_each_stay_in_order(
    coordinator: FakeCoordinator, nursery: trio.Nursery
) -> None:
    start_agent(nursery, coordinator.url, EchoBackend(chunk_delay_s=0.002))
    conn = await coordinator.next_conn()
    prompts = {f"t{i}": " ".join(f"w{i}.{j}" for j in range(15)) for i in range(4)}
    for task_id, prompt in prompts.items():
        await conn.send(assign(task_id, prompt))
    frames = [await conn.recv() for _ in range(4 * 16)]
    for task_id, prompt in prompts.items():
        mine = [f for f in frames if f.task_id == task_id]
        assert [f.seq for f in mine[:-1]] == list(range(15))
        assert "".join(f.delta for f in mine[:-1]) == prompt
        assert mine[-1] == Result(task_id=task_id, output=prompt, chunks=15)
    assert len({f.task_id for f in frames[:20]}) > 1  # they really ran side by side


async def test_a_model_not_served_is_refused(
    coordinator: FakeCoordinator, nursery: trio.Nursery
) -> None:
    start_agent(nursery, coordinator.url)
    conn = await coordinator.next_conn()
    await conn.send(assign("t1", model="llama3"))
    error = await conn.recv()
    assert (error.task_id, error.code) == ("t1", "model_not_served")
    assert "llama3" in error.message


async def test_max_parallel_is_honoured(
    coordinator: FakeCoordinator, nursery: trio.Nursery
) -> None:
    gate = GateBackend()
    start_agent(nursery, coordinator.url, gate, max_parallel=2)
    conn = await coordinator.next_conn()
    for task_id in ("t1", "t2", "t3"):
        await conn.send(assign(task_id, task_id, stream=False))
    busy = await conn.recv()
    assert (busy.task_id, busy.code) == ("t3", TaskErrorCode.NODE_BUSY)
    assert gate.started == ["t1", "t2"]
    seen = len(conn.heartbeats)
    await wait_until(lambda: len(conn.heartbeats) > seen)
    assert conn.heartbeats[-1].in_flight == 2
    gate.release.set()
    results = sorted([await conn.recv(), await conn.recv()], key=lambda f: f.task_id)
    assert results == [
        Result(task_id="t1", output="t1:first t1:second"),
        Result(task_id="t2", output="t2:first t2:second"),
    ]
    await conn.send(assign("t4", "t4", stream=False))
    assert await conn.recv() == Result(task_id="t4", output="t4:first t4:second")


async def test_cancel_stops_the_backend_and_sends_nothing(
    coordinator: FakeCoordinator, nursery: trio.Nursery
) -> None:
    gate = GateBackend()
    start_agent(nursery, coordinator.url, gate)
    conn = await coordinator.next_conn()
    await conn.send(assign("t1", "t1"))
    assert await conn.recv() == Chunk(task_id="t1", seq=0, delta="t1:first ")
    await conn.send(Cancel(task_id="t1", reason="client went away"))
    await wait_until(lambda: gate.cancelled == ["t1"])
    await conn.send(Cancel(task_id="unknown"))  # harmless
    gate.release.set()
    await conn.send(assign("t2", "t2", stream=False))
    assert await conn.recv() == Result(task_id="t2", output="t2:first t2:second")
    assert conn.pending() == []


async def test_backend_failures_become_error_frames(
    coordinator: FakeCoordinator, nursery: trio.Nursery
) -> None:
    start_agent(nursery, coordinator.url, BrokenBackend())
    conn = await coordinator.next_conn()
    await conn.send(assign("t1", "x", stream=False))
    assert await conn.recv() == Error(
        task_id="t1", code="backend_error", message="ollama: HTTP 500: out of memory"
    )
    await conn.send(assign("t2", "bug", stream=True))
    assert await conn.recv() == Chunk(task_id="t2", seq=0, delta="partial ")
    crash = await conn.recv()
    assert (crash.task_id, crash.code) == ("t2", "backend_error")
    assert "RuntimeError" in crash.message
    await conn.send(assign("t3", "x"))  # the node lives on
    assert (await conn.recv()).task_id == "t3"


@pytest.mark.parametrize("stream", [False, True])
async def test_an_output_too_large_for_a_result_is_an_error_not_a_lost_connection(
    coordinator: FakeCoordinator, nursery: trio.Nursery, stream: bool
) -> None:
    start_agent(nursery, coordinator.url, FloodBackend())
    conn = await coordinator.next_conn()
    await conn.send(assign("t1", "x", stream=stream))
    if stream:
        assert (await conn.recv()) == Chunk(task_id="t1", seq=0, delta="x" * 600_000)
    error = await conn.recv()
    assert isinstance(error, Error) and (error.task_id, error.code) == ("t1", "output_too_large")
    assert f"{MAX_OUTPUT_BYTES:,}" in error.message
    await conn.send(assign("t2", "x", stream=stream))  # the same connection serves on
    assert (await conn.recv()).task_id == "t2"


async def test_the_task_timeout_bounds_the_backend(
    coordinator: FakeCoordinator, nursery: trio.Nursery
) -> None:
    gate = GateBackend()
    start_agent(nursery, coordinator.url, gate)
    conn = await coordinator.next_conn()
    await conn.send(assign("t1", "t1", stream=False, timeout_s=0.1))
    error = await conn.recv()
    assert (error.task_id, error.code) == ("t1", "backend_timeout")
    assert gate.cancelled == ["t1"]


async def test_with_a_real_http_backend_cancel_reaches_the_model_server(
    coordinator: FakeCoordinator, nursery: trio.Nursery, fake_ollama: FakeOllama
) -> None:
    backend = OllamaBackend(fake_ollama.url)
    # The agent runs in a nursery of its own, stopped before its backend is closed: a heartbeat
    # due meanwhile would otherwise ask the closed client for the resident models.
    async with trio.open_nursery() as agent_nursery:
        start_agent(agent_nursery, coordinator.url, backend)
        conn = await coordinator.next_conn()
        await conn.send(assign("t1", "hello there"))
        assert [await conn.recv() for _ in range(3)] == [
            Chunk(task_id="t1", seq=0, delta="hello "),
            Chunk(task_id="t1", seq=1, delta="there"),
            Result(task_id="t1", output="hello there", chunks=2),
        ]
        fake_ollama.chunk_delay_s = 0.02
        await conn.send(assign("t2", "w " * 500))
        assert (await conn.recv()).seq == 0
        await conn.send(Cancel(task_id="t2"))
        with trio.fail_after(5):
            await fake_ollama.wait_aborted()
        fake_ollama.fail = "http"
        await conn.send(assign("t3", "x"))
        error = await conn.recv()
        assert (error.task_id, error.code) == ("t3", "backend_error")
        assert error.message == "ollama: HTTP 500: fake ollama: injected failure"
        assert conn.pending() == []
        agent_nursery.cancel_scope.cancel()
    await backend.aclose()


# --- refusals and reconnects -------------------------------------------------------------------


async def test_replaced_connection_exits_without_reconnecting(
    coordinator: FakeCoordinator, nursery: trio.Nursery
) -> None:
    run = start_agent(nursery, coordinator.url)
    conn = await coordinator.next_conn()
    await conn.close(CloseCode.REPLACED, "replaced")
    refused = await run.wait()
    assert refused is not None and refused.exit_code != 0
    assert refused.message == "replaced by a newer connection of node node-1"
    await trio.sleep(0.3)
    assert len(coordinator.hellos) == 1


async def test_bad_token_exits_without_reconnecting(
    coordinator: FakeCoordinator, nursery: trio.Nursery
) -> None:
    run = start_agent(nursery, coordinator.url, token="wrong")
    refused = await run.wait()
    assert refused is not None and refused.exit_code != 0
    assert refused.message == (
        "authentication failed for node node-1: wrong --token, or the node was revoked"
        " (gemmanet nodes enroll gives it a new token)"
    )
    await trio.sleep(0.3)
    assert len(coordinator.hellos) == 1


@pytest.mark.parametrize(
    "how",
    ["tcp", CloseCode.GOING_AWAY, CloseCode.INTERNAL_ERROR, CloseCode.PROTOCOL_ERROR],
)
async def test_a_lost_connection_reconnects_and_cancels_its_tasks(
    coordinator: FakeCoordinator, nursery: trio.Nursery, how: str | int
) -> None:
    gate = GateBackend()
    start_agent(nursery, coordinator.url, gate)
    conn = await coordinator.next_conn()
    await conn.send(assign("t1", "t1"))
    assert (await conn.recv()).seq == 0
    if how == "tcp":
        await conn.drop()
    else:
        await conn.close(int(how))
    await wait_until(lambda: gate.cancelled == ["t1"])
    again = await coordinator.next_conn()
    assert again.hello.node_id == "node-1"
    gate.release.set()
    await again.send(assign("t2", "t2", stream=False))
    assert await again.recv() == Result(task_id="t2", output="t2:first t2:second")


async def test_reconnect_backoff_doubles_with_seeded_jitter(
    coordinator: FakeCoordinator, nursery: trio.Nursery
) -> None:
    coordinator.welcome = False  # every attempt fails, so the backoff keeps growing
    start_agent(nursery, coordinator.url, seed=99, backoff_initial_s=0.04, backoff_max_s=0.3)
    await wait_until(lambda: len(coordinator.connect_times) >= 7)
    gaps = [b - a for a, b in zip(coordinator.connect_times, coordinator.connect_times[1:])]
    rng = random.Random(99)
    expected = [backoff_delay(k, rng, initial_s=0.04, max_s=0.3) for k in range(6)]
    for gap, delay in zip(gaps, expected):
        assert delay <= gap <= delay + 0.25


async def test_an_http_refusal_of_the_upgrade_is_retried(nursery: trio.Nursery) -> None:
    refusals: list[str] = []

    async def refuse(request: WebSocketRequest) -> None:
        refusals.append(request.path)
        await request.reject(503, body=b"starting up")

    server = await nursery.start(partial(serve_websocket, refuse, "127.0.0.1", 0, None))
    run = start_agent(nursery, f"http://127.0.0.1:{server.port}")
    await wait_until(lambda: len(refusals) >= 3)
    assert run.exit is None and not run.done.is_set()


async def test_a_silent_coordinator_is_declared_dead(
    coordinator: FakeCoordinator, nursery: trio.Nursery
) -> None:
    coordinator.send_heartbeats = False
    # A close handshake that may take a while on a loaded machine (four test workers on two
    # cores): the agent's verdict is what is timed, not the scheduler.
    start_agent(nursery, coordinator.url, close_timeout_s=5.0)
    conn = await coordinator.next_conn()
    start = trio.current_time()
    assert await conn.wait_closed() == 1001
    assert 3 * INTERVAL - 0.05 <= trio.current_time() - start <= 3 * INTERVAL + 1.0
    coordinator.send_heartbeats = True
    again = await coordinator.next_conn()
    await wait_until(lambda: len(again.heartbeats) >= 4)
    assert again.close_code is None  # heard from the coordinator: stays up


# --- drain -------------------------------------------------------------------------------------


async def test_drain_finishes_running_tasks_and_refuses_new_ones(
    coordinator: FakeCoordinator, nursery: trio.Nursery
) -> None:
    gate = GateBackend()
    run = start_agent(nursery, coordinator.url, gate, drain_s=5.0)
    conn = await coordinator.next_conn()
    await conn.send(assign("t1", "t1"))
    assert (await conn.recv()).seq == 0
    run.agent.request_drain()
    await conn.send(assign("t2", "t2"))
    refused = await conn.recv()
    assert (refused.task_id, refused.code) == ("t2", TaskErrorCode.NODE_DRAINING)
    gate.release.set()
    assert await conn.recv() == Chunk(task_id="t1", seq=1, delta="t1:second")
    assert await conn.recv() == Result(task_id="t1", output="t1:first t1:second", chunks=2)
    assert await conn.wait_closed() == 1000
    assert await run.wait() is None
    assert len(coordinator.hellos) == 1


async def test_drain_cancels_what_outlives_the_grace_period(
    coordinator: FakeCoordinator, nursery: trio.Nursery
) -> None:
    gate = GateBackend()
    run = start_agent(nursery, coordinator.url, gate, drain_s=0.2)
    conn = await coordinator.next_conn()
    await conn.send(assign("t1", "t1", stream=False))
    await wait_until(lambda: gate.started == ["t1"])
    start = trio.current_time()
    run.agent.request_drain()
    assert await conn.wait_closed() == 1000
    assert 0.2 <= trio.current_time() - start <= 0.6
    assert gate.cancelled == ["t1"]
    assert conn.pending() == []
    assert await run.wait() is None


async def test_a_second_drain_request_skips_the_grace_period(
    coordinator: FakeCoordinator, nursery: trio.Nursery
) -> None:
    gate = GateBackend()
    run = start_agent(nursery, coordinator.url, gate, drain_s=30.0)
    conn = await coordinator.next_conn()
    await conn.send(assign("t1", "t1", stream=False))
    await wait_until(lambda: gate.started == ["t1"])
    run.agent.request_drain()
    await trio.sleep(0.05)
    assert gate.cancelled == []
    run.agent.request_drain()
    assert await conn.wait_closed(timeout=2) == 1000
    assert gate.cancelled == ["t1"]
    assert await run.wait() is None


async def test_drain_while_disconnected_exits_at_once(nursery: trio.Nursery) -> None:
    with trio.socket.socket() as sock:
        await sock.bind(("127.0.0.1", 0))  # bound, never listening: connection refused
        port = sock.getsockname()[1]
        run = start_agent(
            nursery, f"http://127.0.0.1:{port}", backoff_initial_s=10.0, backoff_max_s=10.0
        )
        await wait_until(lambda: run.agent.attempts >= 1)
        await trio.sleep(0.05)
        run.agent.request_drain()
        assert await run.wait(timeout=1.0) is None


# --- command line ------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gemmanet node")
    add_node_arguments(parser)
    return parser


BASE_ARGS = [
    "--coordinator",
    "http://127.0.0.1:9",
    "--node-id",
    "n1",
    "--token",
    "t",
    "--model",
    "m",
    "--backend",
    "echo",
]


@pytest.mark.parametrize(
    ("extra", "flag"),
    [
        (["--latency-ms", "5-2"], "--latency-ms"),
        (["--latency-ms", "fast"], "--latency-ms"),
        (["--max-parallel", "0"], "--max-parallel"),
        (["--max-parallel", "two"], "--max-parallel"),
        (["--vram-gb", "-1"], "--vram-gb"),
        (["--drain-s", "-3"], "--drain-s"),
        (["--chunk-delay-ms", "inf"], "--chunk-delay-ms"),
        (["--seed", "x"], "--seed"),
        (["--node-id", "node 1"], "--node-id"),
        (["--max-parallel", "5000"], "--max-parallel"),
        (["--coordinator", "localhost:8000"], "--coordinator"),
        (["--backend-url", "nope"], "--backend-url"),
        (["--backend-check-s", "0"], "--backend-check-s"),
        (["--backend-check-s", "soon"], "--backend-check-s"),
        (["--backend-check-s", "7200"], "--backend-check-s"),
    ],
)
def test_bad_flag_values_exit_2_with_one_line(
    extra: list[str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_node(_parser().parse_args(BASE_ARGS + extra)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gemmanet node: error: ") and flag in err


def test_token_may_come_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [a for a in BASE_ARGS if a not in ("--token", "t")] + ["--max-parallel", "0"]
    monkeypatch.delenv("GEMMANET_NODE_TOKEN", raising=False)
    assert run_node(_parser().parse_args(args)) == 2
    assert "--token" in capsys.readouterr().err
    monkeypatch.setenv("GEMMANET_NODE_TOKEN", "from-env")
    assert run_node(_parser().parse_args(args)) == 2
    assert "--max-parallel" in capsys.readouterr().err  # got past the token check


# --- the real process --------------------------------------------------------------------------


def _agent_cmd(url: str, *extra: str, token: str = TOKEN) -> list[str]:
    return [
        sys.executable,
        "-m",
        "tools.node_agent",
        "--coordinator",
        url,
        "--node-id",
        "node-1",
        "--token",
        token,
        "--model",
        "gemma3:4b",
        "--backend",
        "echo",
        *extra,
    ]


async def _spawn(nursery: trio.Nursery, cmd: list[str]) -> tuple[trio.Process, dict[str, Any]]:
    out: dict[str, Any] = {}

    async def runner(task_status: trio.TaskStatus[trio.Process]) -> None:
        out["done"] = await trio.run_process(
            cmd,
            cwd=ROOT,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            task_status=task_status,
        )

    process = await nursery.start(runner)
    return process, out


@pytest.mark.parametrize(
    ("code", "exit_code", "line"),
    [
        (CloseCode.REPLACED, 3, "gemmanet node: replaced by a newer connection of node node-1"),
        (
            CloseCode.AUTH_FAILED,
            4,
            (
                "gemmanet node: authentication failed for node node-1: wrong --token, or the"
                " node was revoked (gemmanet nodes enroll gives it a new token)"
            ),
        ),
    ],
)
async def test_process_exits_with_the_reason_on_stderr(
    coordinator: FakeCoordinator, nursery: trio.Nursery, code: int, exit_code: int, line: str
) -> None:
    token = TOKEN if code == CloseCode.REPLACED else "wrong"
    process, out = await _spawn(nursery, _agent_cmd(coordinator.url, token=token))
    if code == CloseCode.REPLACED:
        conn = await coordinator.next_conn(timeout=15)
        await conn.close(CloseCode.REPLACED, "replaced")
    with trio.fail_after(15):
        await process.wait()
    assert process.returncode == exit_code
    await wait_until(lambda: "done" in out)
    assert out["done"].stderr.decode().splitlines()[-1] == line


async def test_process_drains_on_sigterm_and_exits_0(
    coordinator: FakeCoordinator, nursery: trio.Nursery
) -> None:
    process, out = await _spawn(
        nursery, _agent_cmd(coordinator.url, "--chunk-delay-ms", "30", "--drain-s", "5")
    )
    conn = await coordinator.next_conn(timeout=15)
    prompt = " ".join(f"w{i}" for i in range(10))
    await conn.send(assign("t1", prompt))
    assert (await conn.recv()).seq == 0
    process.send_signal(signal.SIGTERM)
    frames = [await conn.recv() for _ in range(10)]
    assert frames[-1] == Result(task_id="t1", output=prompt, chunks=10)
    assert await conn.wait_closed() == 1000
    with trio.fail_after(10):
        await process.wait()
    assert process.returncode == 0
    await wait_until(lambda: "done" in out)
    assert "draining" in out["done"].stderr.decode()
    assert len(coordinator.hellos) == 1
