"""Round trips the cross-instance benchmark times for scale, beside the hop itself: a raw pub/sub
lap through ``RedisCoordination`` (its bus client), a bare socket PING, and Django Channels'
Redis pub/sub layer (``channels_probe``, in a process of its own: it is asyncio)."""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Protocol

import trio

from coordinator.coordination.redis.coordination import RedisCoordination
from tools.bench._harness import ROOT

REQUEST_TIMEOUT_S = 10.0


class Sink(Protocol):
    def ok(self, kind: str, latency_s: float) -> None: ...
    def error(self, kind: str, label: str) -> None: ...


class PubSubProbe:
    """PUBLISH on ``ping``; a second client's subscriber republishes on ``pong``; time the lap."""

    def __init__(self, url: str, prefix: str, kind: str) -> None:
        self.url = url
        self.prefix = prefix
        self.kind = kind
        self._waiting: dict[bytes, trio.Event] = {}
        self._received: dict[bytes, float] = {}
        self._next = 0
        self.sender: RedisCoordination | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with (
            RedisCoordination(self.url, key_prefix=self.prefix) as sender,
            RedisCoordination(self.url, key_prefix=self.prefix) as echoer,
            sender.pubsub.subscribe("pong") as pongs,
            echoer.pubsub.subscribe("ping") as pings,
            trio.open_nursery() as nursery,
        ):

            async def echo() -> None:
                async for message in pings:
                    await echoer.pubsub.publish("pong", message)

            async def collect() -> None:
                async for message in pongs:
                    self._received[message] = trio.current_time()
                    event = self._waiting.pop(message, None)
                    if event is not None:
                        event.set()

            nursery.start_soon(echo)
            nursery.start_soon(collect)
            self.sender = sender
            task_status.started()
            try:
                await trio.sleep_forever()
            finally:
                self.sender = None
                nursery.cancel_scope.cancel()

    async def round_trip(self, scheduled: float, sink: Sink | None) -> None:
        assert self.sender is not None
        self._next += 1
        token = b"%d" % self._next
        event = self._waiting[token] = trio.Event()
        try:
            await self.sender.pubsub.publish("ping", token)
            with trio.move_on_after(REQUEST_TIMEOUT_S):
                await event.wait()
        except Exception as exc:  # noqa: BLE001 - counted, the run goes on
            if sink is not None:
                sink.error(self.kind, type(exc).__name__)
            return
        finally:
            self._waiting.pop(token, None)
        received = self._received.pop(token, None)
        if sink is None:
            return
        if received is None:
            sink.error(self.kind, "timeout")
        else:
            sink.ok(self.kind, received - scheduled)


class SocketProbe:
    """A PING and its +PONG over one bare trio socket to the same Redis: the floor."""

    kind = "socket"

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self._stream: trio.SocketStream | None = None
        self._lock = trio.Lock()  # one PING in flight: the reply is read by its sender

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with await trio.open_tcp_stream(self.host, self.port) as stream:
            self._stream = stream
            task_status.started()
            await trio.sleep_forever()

    async def round_trip(self, scheduled: float, sink: Sink | None) -> None:
        assert self._stream is not None
        try:
            async with self._lock:
                await self._stream.send_all(b"*1\r\n$4\r\nPING\r\n")
                reply = b""
                while not reply.endswith(b"\r\n"):
                    reply += await self._stream.receive_some(64)
        except Exception as exc:  # noqa: BLE001 - counted, the run goes on
            if sink is not None:
                sink.error(self.kind, type(exc).__name__)
            return
        if sink is not None:
            sink.ok(self.kind, trio.current_time() - scheduled)


async def channels_round_trips(
    url: str, rate: float, warmup_s: float, duration_s: float
) -> dict[str, Any]:
    """Run ``tools.bench.channels_probe`` for the same span; its result (``missing`` when
    ``channels_redis`` is not installed)."""
    command = [sys.executable, "-m", "tools.bench.channels_probe", "--url", url,
               "--rate", str(rate), "--warmup", str(warmup_s), "--duration", str(duration_s)]  # fmt: skip
    result = await trio.run_process(
        command,
        capture_stdout=True,
        capture_stderr=True,
        check=False,
        cwd=ROOT,
        env=dict(os.environ),
    )
    if result.returncode != 0:
        return {"failed": result.stderr.decode(errors="replace")[-500:]}
    data: dict[str, Any] = json.loads(result.stdout.decode().strip().splitlines()[-1])
    return data
