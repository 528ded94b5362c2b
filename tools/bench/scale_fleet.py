"""Thousands of light nodes in one process, for ``tools.bench.scale``.

    python -m tools.bench.scale_fleet SPEC.json

A light node speaks protocol v1 over a real WebSocket and nothing more: ``hello``, a heartbeat
at the interval the ``welcome`` gives, and a ``result`` echoing the prompt for every ``assign``
(no backend, no journal; like a real agent it comes back later, with a growing jittered delay,
when told 1013 "try again later"), so one process can hold thousands of connections and the
benchmark measures the coordinator, not the agent. ``SPEC.json`` (mode 0600: it holds tokens):
``{"url": "http://host:port", "models": [...], "max_parallel": N, "connect_concurrency": K,
"nodes": [{"node_id": ..., "token": ...}]}``.

It prints ``connected N retries R`` on stdout once every node is welcomed (R: the 1013s it was
told on the way), or ``refused N ...`` and exits 1 when any node is refused otherwise, and runs until SIGTERM/SIGINT.
"""

from __future__ import annotations

import json
import random
import signal
import sys
from pathlib import Path
from typing import Any

import msgspec
import trio
import trio_websocket
from trio_websocket import ConnectionClosed, WebSocketConnection, open_websocket_url

from protocol import (
    MAX_FRAME_BYTES,
    Assign,
    CloseCode,
    Heartbeat,
    Hello,
    Result,
    Welcome,
    decode_node,
    encode,
)


def ws_url(http_url: str) -> str:
    return http_url.replace("http://", "ws://", 1).rstrip("/") + "/ws/node"


class LightNode:
    def __init__(self, node_id: str, token: str) -> None:
        self.node_id = node_id
        self.token = token
        self.interval_s = 2.0  # the welcome's, or what the coordinator asked for since

    async def run(
        self,
        url: str,
        hello: dict[str, Any],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        async with open_websocket_url(url, max_message_size=MAX_FRAME_BYTES) as ws:
            await ws.send_message(
                encode(Hello(node_id=self.node_id, token=self.token, **hello)).decode()
            )
            welcome = decode_node(await ws.get_message())
            if not isinstance(welcome, Welcome):
                raise TypeError(f"{self.node_id}: expected welcome, got {welcome!r}")
            task_status.started()
            async with trio.open_nursery() as nursery:
                self.interval_s = welcome.heartbeat_interval_s
                nursery.start_soon(self._beat, ws)
                await self._answer(ws)
                nursery.cancel_scope.cancel()

    async def _beat(self, ws: WebSocketConnection) -> None:
        beat = encode(Heartbeat()).decode()
        while True:
            await trio.sleep(self.interval_s)
            await ws.send_message(beat)

    async def _answer(self, ws: WebSocketConnection) -> None:
        try:
            while True:
                envelope = decode_node(await ws.get_message())
                if isinstance(envelope, Assign):
                    result = Result(task_id=envelope.task_id, output=envelope.prompt, chunks=0)
                    await ws.send_message(encode(result).decode())
                elif isinstance(envelope, Heartbeat) and envelope.interval_s is not msgspec.UNSET:
                    self.interval_s = envelope.interval_s
        except ConnectionClosed:
            return


async def serve(spec: dict[str, Any]) -> int:
    url = ws_url(spec["url"])
    hello = {"models": list(spec["models"]), "max_parallel": int(spec.get("max_parallel", 4))}
    limiter = trio.CapacityLimiter(int(spec.get("connect_concurrency", 100)))
    refused: list[str] = []
    connected = retries = 0

    async def one(node: LightNode) -> None:
        nonlocal connected, retries
        backoff_s = 0.5
        while True:
            try:
                async with limiter:
                    await nursery.start(node.run, url, hello)
                connected += 1
                return
            except ConnectionClosed as exc:
                if exc.reason.code != CloseCode.TRY_AGAIN_LATER:
                    refused.append(f"{node.node_id}: {exc}")
                    return
                # "Reconnect later", as a real agent does: with a growing, jittered delay.
                retries += 1
                await trio.sleep(backoff_s * (0.5 + random.random()))
                backoff_s = min(backoff_s * 2, 8.0)
            except (OSError, TypeError, trio_websocket.HandshakeError) as exc:
                refused.append(f"{node.node_id}: {exc}")
                return

    async def report() -> None:
        while connected + len(refused) < len(spec["nodes"]):
            await trio.sleep(0.05)
        if refused:
            print(f"refused {len(refused)} {refused[:3]}", flush=True)
            nursery.cancel_scope.cancel()
            return
        print(f"connected {connected} retries {retries}", flush=True)

    async def watch_signals() -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for _ in signals:
                nursery.cancel_scope.cancel()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch_signals)
        nursery.start_soon(report)
        for raw in spec["nodes"]:
            nursery.start_soon(one, LightNode(raw["node_id"], raw["token"]))
    return 1 if refused else 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m tools.bench.scale_fleet SPEC.json", file=sys.stderr)
        return 2
    return trio.run(serve, json.loads(Path(args[0]).read_text()))


if __name__ == "__main__":
    sys.exit(main())
