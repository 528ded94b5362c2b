"""Simulated nodes and the in-memory sockets they speak the node protocol over (half of them
offer v2 and report usage, half speak only v1 and get conversations as transcripts).

The instance side of a socket is served by the production ``serve_node_socket``; the node side
is a small honest agent — or, when told to, a forger that answers tasks it was never given."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec
import trio

from protocol import (
    Assign,
    Cancel,
    Chunk,
    CloseCode,
    Heartbeat,
    Hello,
    Result,
    Usage,
    Welcome,
    decode_node,
    encode,
    stamped,
    transcript,
)
from sim.faults import Gate
from sim.trace import Trace


class SocketClosed(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


_CLOSE = object()


class InstanceSide:
    """What ``serve_node_socket`` sees: like Quart's websocket, a peer that goes away cancels
    the handler instead of raising from ``receive``."""

    def __init__(self, pair: SocketPair, gate: Gate) -> None:
        self._pair, self._gate = pair, gate
        self.handler_scope = trio.CancelScope()

    async def accept(self) -> None:
        await self._gate.wait()

    async def receive(self) -> str | bytes:
        item = await self._pair.to_instance_recv.receive()
        await self._gate.wait()
        if item is _CLOSE:
            self.handler_scope.cancel()
            await trio.sleep_forever()
        return item  # type: ignore[return-value]

    async def send(self, data: str | bytes) -> None:
        await self._gate.wait()
        self._pair.deliver_to_node(data)

    async def close(self, code: int, reason: str = "") -> None:
        self._pair.deliver_to_node(SocketClosed(code))


class SocketPair:
    def __init__(self) -> None:
        self.to_instance_send, self.to_instance_recv = trio.open_memory_channel[object](math.inf)
        self.to_node_send, self.to_node_recv = trio.open_memory_channel[object](math.inf)
        self.closed_by_node = False

    def deliver_to_node(self, item: object) -> None:
        try:
            self.to_node_send.send_nowait(item)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    async def node_send(self, data: str) -> None:
        if self.closed_by_node:
            raise SocketClosed(1000)
        try:
            self.to_instance_send.send_nowait(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            raise SocketClosed(CloseCode.ABNORMAL_CLOSURE) from None

    async def node_receive(self) -> str:
        item = await self.to_node_recv.receive()
        if isinstance(item, SocketClosed):
            raise item
        return item  # type: ignore[return-value]

    def node_close(self) -> None:
        if not self.closed_by_node:
            self.closed_by_node = True
            try:
                self.to_instance_send.send_nowait(_CLOSE)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass


@dataclass
class SimNode:
    node_id: str
    token: str
    models: list[str]
    max_parallel: int
    latency: tuple[float, float]
    rng: random.Random
    trace: Trace
    # Set by the world: connects a socket pair to an instance; returns the instance id.
    connect: Callable[[SocketPair, str | None], str | None]
    forger: bool = False
    home: str | None = None
    #: GPU memory budget sent in the hello (None: the node does not say)
    vram_gb: float | None = None
    #: offers protocol v2 in its hello (and then reports usage), or speaks only v1
    speaks_v2: bool = False
    #: the version of the current connection (its welcome's)
    protocol: int = 1
    slow_until: float = 0.0
    #: the heartbeat interval of the current connection (its welcome's, or what it was told)
    interval_s: float = 1.0
    tasks: dict[str, trio.CancelScope] = field(default_factory=dict)
    current: SocketPair | None = None
    instance: str | None = None

    async def run(self) -> None:
        backoff = 0.2
        while True:
            pair = SocketPair()
            instance = self.connect(pair, self.home)
            if instance is None:
                await trio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            self.current, self.instance = pair, instance
            code = await self._session(pair, instance)
            self.current = None
            self.trace.emit("node.disconnected", node=self.node_id, instance=instance, code=code)
            if code == CloseCode.REPLACED:
                return  # replaced: a real agent exits rather than fight its twin
            await trio.sleep(backoff * (0.5 + self.rng.random()))
            backoff = min(backoff * 2, 2.0)

    def drop_connection(self, move_to: str | None) -> None:
        """Fault: lose the connection; reconnect (maybe to another instance)."""
        self.home = move_to
        if self.current is not None:
            self.current.node_close()
            self.current.deliver_to_node(SocketClosed(CloseCode.ABNORMAL_CLOSURE))

    async def _session(self, pair: SocketPair, instance: str) -> int:
        code: int = CloseCode.ABNORMAL_CLOSURE
        try:
            await self._speak(pair, instance)
        except* SocketClosed as group:
            code = _first_code(group)
        pair.node_close()
        for scope in self.tasks.values():
            scope.cancel()
        self.tasks.clear()
        return code

    async def _speak(self, pair: SocketPair, instance: str) -> None:
        await pair.node_send(
            encode(
                Hello(
                    node_id=self.node_id,
                    token=self.token,
                    models=self.models,
                    max_parallel=self.max_parallel,
                    vram_gb=self.vram_gb,
                    protocols=[1, 2] if self.speaks_v2 else msgspec.UNSET,
                )
            ).decode()
        )
        welcome = decode_node(await pair.node_receive())
        assert isinstance(welcome, Welcome)
        self.protocol = welcome.v
        self.interval_s = welcome.heartbeat_interval_s
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._beat, pair)
            while True:
                envelope = decode_node(await pair.node_receive())
                if isinstance(envelope, Heartbeat) and envelope.interval_s is not msgspec.UNSET:
                    self.interval_s = envelope.interval_s  # as the agent does
                elif isinstance(envelope, Assign):
                    scope = trio.CancelScope()
                    self.tasks[envelope.task_id] = scope
                    # Counted here, at the node: what it is asked to run at once.
                    self.trace.emit(
                        "node.assign",
                        node=self.node_id,
                        instance=instance,
                        task=envelope.task_id,
                        running=len(self.tasks),
                        max_parallel=self.max_parallel,
                        protocol=self.protocol,
                        v=envelope.v,
                    )
                    nursery.start_soon(self._work, pair, envelope, scope)
                    if self.forger:
                        nursery.start_soon(self._forge, envelope)
                elif isinstance(envelope, Cancel):
                    cancelled = self.tasks.pop(envelope.task_id, None)
                    if cancelled is not None:
                        cancelled.cancel()

    async def _beat(self, pair: SocketPair) -> None:
        while True:
            await trio.sleep(self.interval_s)
            await pair.node_send(encode(Heartbeat(in_flight=len(self.tasks))).decode())

    async def _work(self, pair: SocketPair, assign: Assign, scope: trio.CancelScope) -> None:
        with scope:
            low, high = self.latency
            delay = self.rng.uniform(low, high)
            if trio.current_time() < self.slow_until:
                delay *= 10
            # The echo answer: the prompt, or a conversation's transcript.
            text = assign.prompt
            if text is None:
                assert assign.messages is not msgspec.UNSET
                text = transcript(assign.messages)
            words = text.split(" ")
            chunks = [w + " " for w in words[:-1]] + [words[-1]]
            if assign.stream:
                for seq, chunk in enumerate(chunks):
                    await trio.sleep(delay / len(chunks))
                    await pair.node_send(
                        encode(Chunk(task_id=assign.task_id, seq=seq, delta=chunk)).decode()
                    )
            else:
                await trio.sleep(delay)
            result = Result(
                task_id=assign.task_id,
                output=text,
                chunks=len(chunks) if assign.stream else 0,
            )
            if self.protocol >= 2:
                usage = Usage(prompt_tokens=len(words), completion_tokens=len(text.split()))
                result = stamped(msgspec.structs.replace(result, usage=usage))
            await pair.node_send(encode(result).decode())
            self.trace.emit("node.answer", node=self.node_id, task=assign.task_id)
        self.tasks.pop(assign.task_id, None)

    async def _forge(self, assign: Assign) -> None:
        """A hostile node: answer the task under a different identity's connection. The forger
        learns the task id of its own assignment and replays it on a second connection."""
        twin = SocketPair()
        if self.connect(twin, None) is None:
            return
        try:
            await twin.node_send(
                encode(
                    Hello(node_id=self.node_id + "-x", token=self.token + "-x", models=["forged"])
                ).decode()
            )
            await twin.node_receive()
            await twin.node_send(
                encode(Result(task_id=assign.task_id, output="FORGED", chunks=0)).decode()
            )
            await trio.sleep(0.05)
        except SocketClosed:
            pass
        finally:
            twin.node_close()


def _first_code(group: BaseExceptionGroup[BaseException]) -> int:
    for exc in group.exceptions:
        if isinstance(exc, SocketClosed):
            return exc.code
        if isinstance(exc, BaseExceptionGroup):
            return _first_code(exc)
    return CloseCode.ABNORMAL_CLOSURE
