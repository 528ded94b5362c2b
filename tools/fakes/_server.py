"""Plumbing shared by the fake model servers: a tiny ASGI base class served by Hypercorn's trio
worker, knobs to inject failures, records for assertions, and a ``python -m`` entry point.

Each fake answers with a deterministic transformation of what it was asked: a raw prompt
itself, a conversation's last user message, word by word (each piece one word plus its
trailing whitespace), so a test can assert on the output. It honours the token bound (cut
after N words, finish reason ``length``) and stop strings (cut before the first, ``stop``), and
counts words as tokens: the prompt's (every message's content) and the answer's.

Every generation request is recorded (``requests``, with its ``paths``), and checked against
the real client library's request types (``_checks``); one they refuse gets a 400 in the
server's error shape and is recorded in ``refused`` too, so a test sees a drifted field.

Failure modes (``server.fail``, ``--fail``, or ``POST /_fake/config {"fail": ...}``):

* ``"http"`` - the request is refused with HTTP 500 and the server's error body;
* ``"midstream"`` - one piece, then the format's in-stream error record;
* ``"truncate"`` - one piece, then the body ends without the final record.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import trio
from hypercorn.config import Config
from hypercorn.trio import serve

FAIL_MODES = ("http", "midstream", "truncate")

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_WORD_RE = re.compile(r"^\s+|\S+\s*")


def words(text: str) -> list[str]:
    """``text`` as word-plus-trailing-whitespace pieces that join back to it exactly."""
    return _WORD_RE.findall(text)


def answer_of(
    text: str, *, max_tokens: int | None = None, stop: Sequence[str] | None = None
) -> tuple[str, str]:
    """``text`` cut before the first stop string (``stop``) or after ``max_tokens`` words
    (``length``), and the finish reason."""
    if stop:
        cuts = [text.find(s) for s in stop if s and s in text]
        if cuts:
            return _bounded(text[: min(cuts)], max_tokens)
    return _bounded(text, max_tokens)


def _bounded(text: str, max_tokens: int | None) -> tuple[str, str]:
    if max_tokens is None or max_tokens < 0 or len(text.split()) <= max_tokens:
        return text, "stop"
    kept: list[str] = []
    count = 0
    for piece in words(text):
        if piece.strip():
            if count == max_tokens:
                break
            count += 1
        kept.append(piece)
    return "".join(kept).rstrip(), "length"


def word_count(*texts: str) -> int:
    """Tokens as the fakes count them: words."""
    return sum(len(text.split()) for text in texts)


@dataclass(frozen=True)
class Refusal:
    """A request the real library's types refused, and why (``index``: in ``requests``)."""

    index: int
    path: str
    body: Any
    reason: str


class ClientGone(Exception):
    """The client disconnected before the request body was read."""


class Request:
    def __init__(self, scope: Scope, body: bytes) -> None:
        self.method: str = scope["method"]
        self.path: str = scope["path"]
        self.headers = {
            k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]
        }
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body)


class Response:
    """A whole response, or a streamed one when ``stream`` is given."""

    def __init__(
        self,
        status: int = 200,
        body: Any = None,
        *,
        content_type: str = "application/json",
        stream: AsyncIterator[bytes] | None = None,
    ) -> None:
        self.status = status
        self.content_type = content_type
        self.stream = stream
        if body is None:
            self.body = b""
        elif isinstance(body, bytes):
            self.body = body
        elif isinstance(body, str):
            self.body = body.encode()
        else:
            self.body = json.dumps(body).encode()


class FakeModelServer:
    """Base of the fakes: subclasses implement :meth:`handle`."""

    kind = "fake"

    def __init__(
        self,
        *,
        models: Iterable[str] | None = None,
        chunk_delay_s: float = 0.0,
        fail: str | None = None,
    ) -> None:
        self.models: set[str] | None = set(models) if models else None
        self.chunk_delay_s = chunk_delay_s
        self.fail = fail
        self.url: str | None = None
        #: JSON bodies of the generation requests received, in order, and their paths.
        self.requests: list[Any] = []
        self.paths: list[str] = []
        #: the requests refused for not being what the real client library would send
        self.refused: list[Refusal] = []
        #: Authorization headers of those requests (None when absent).
        self.authorizations: list[str | None] = []
        #: Streams the server finished / streams the client walked away from.
        self.completed = 0
        self.aborted = 0
        self._aborted_event = trio.Event()

    # --- knobs -----------------------------------------------------------------------------

    def serves(self, model: str) -> bool:
        return self.models is None or model in self.models

    def prepare(self) -> None:
        """Load what checking requests needs now rather than at the first request."""

    def record(self, request: Request, body: Any) -> None:
        self.requests.append(body)
        self.paths.append(request.path)
        self.authorizations.append(request.headers.get("authorization"))

    def refuse(self, reason: str) -> None:
        """Marks the request recorded last as refused."""
        index = len(self.requests) - 1
        self.refused.append(Refusal(index, self.paths[index], self.requests[index], reason))

    async def wait_aborted(self, count: int = 1) -> None:
        """Wait until ``count`` streams were abandoned by their client."""
        while self.aborted < count:
            await self._aborted_event.wait()

    # --- ASGI ------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        try:
            request = Request(scope, await _read_body(receive))
        except ClientGone:
            return
        response = await self._control(request) or await self.handle(request)
        await _respond(response, send, receive, self)

    async def handle(self, request: Request) -> Response:
        raise NotImplementedError

    async def _control(self, request: Request) -> Response | None:
        # Lets an end-to-end test flip a fake running in another process.
        if request.path == "/_fake/config" and request.method == "POST":
            try:
                config = request.json()
                fail = config.get("fail", self.fail)
                if fail is not None and fail not in FAIL_MODES:
                    raise ValueError(fail)
                self.fail = fail
                if "chunk_delay_ms" in config:
                    self.chunk_delay_s = float(config["chunk_delay_ms"]) / 1000.0
            except (ValueError, TypeError, AttributeError):
                return Response(400, {"error": f"bad config; fail is one of {FAIL_MODES}"})
            return Response(200, self.stats())
        if request.path == "/_fake/stats" and request.method == "GET":
            return Response(200, self.stats())
        if request.path == "/_fake/requests" and request.method == "GET":
            return Response(200, self.received())
        return None

    def received(self) -> dict[str, Any]:
        """What arrived, for a test whose fake runs in another process."""
        refused = {r.index: r.reason for r in self.refused}
        return {
            "requests": [
                {"path": path, "body": body, "refused": refused.get(index)}
                for index, (path, body) in enumerate(zip(self.paths, self.requests, strict=True))
            ]
        }

    def stats(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "fail": self.fail,
            "chunk_delay_ms": self.chunk_delay_s * 1000.0,
            "requests": len(self.requests),
            "refused": len(self.refused),
            "completed": self.completed,
            "aborted": self.aborted,
        }

    def _note_aborted(self) -> None:
        self.aborted += 1
        self._aborted_event.set()
        self._aborted_event = trio.Event()

    # --- serving ---------------------------------------------------------------------------

    async def run(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Serve until cancelled; ``task_status.started(url)`` once listening (port 0: free)."""
        config = Config()
        config.bind = [f"{host}:{port}"]
        config.loglevel = "WARNING"
        config.accesslog = None
        config.graceful_timeout = 0.5
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(partial(serve, self, config, mode="asgi"))  # type: ignore[arg-type]
            self.url = binds[0]
            task_status.started(self.url)


async def _read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _respond(
    response: Response, send: Send, receive: Receive, server: FakeModelServer
) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": response.status,
            "headers": [
                (b"content-type", response.content_type.encode()),
                (b"cache-control", b"no-cache"),
            ],
        }
    )
    if response.stream is None:
        await send({"type": "http.response.body", "body": response.body, "more_body": False})
        return
    finished = False

    async def watch_disconnect(cancel_scope: trio.CancelScope) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        cancel_scope.cancel()

    # A client that leaves mid-stream cancels the generation, as a real model server does.
    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch_disconnect, nursery.cancel_scope)
        async for piece in response.stream:
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        # Counted once everything was sent: clients may hang up right after the final record.
        finished = True
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        nursery.cancel_scope.cancel()
    if finished:
        server.completed += 1
    else:
        server._note_aborted()


def serve_main(
    factory: Callable[[argparse.Namespace], FakeModelServer],
    argv: list[str] | None,
    *,
    prog: str,
    extra: Callable[[argparse.ArgumentParser], None] | None = None,
) -> int:
    """``python -m tools.fakes.X``: serve until SIGINT/SIGTERM, print the URL when ready."""
    parser = argparse.ArgumentParser(
        prog=prog, description=f"Run a fake {prog.split('.')[-1]} server."
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (default)")
    parser.add_argument(
        "--model",
        dest="models",
        action="append",
        default=None,
        help="serve only these models (repeatable; default: any name)",
    )
    parser.add_argument(
        "--chunk-delay-ms", type=float, default=0.0, help="pause between streamed pieces"
    )
    parser.add_argument("--fail", choices=FAIL_MODES, default=None, help="inject this failure")
    if extra is not None:
        extra(parser)
    args = parser.parse_args(argv)
    server = factory(args)
    server.prepare()  # before the URL is printed: the first request is not the slow one

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            url = await nursery.start(partial(server.run, host=args.host, port=args.port))
            # The last line of stdout is the URL, so a parent process can wait for readiness.
            print(f"{server.kind} fake listening on {url}", flush=True)
            print(url, flush=True)
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for _ in signals:
                    break
            nursery.cancel_scope.cancel()

    trio.run(main)
    return 0
