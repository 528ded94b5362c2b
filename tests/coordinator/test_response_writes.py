"""One socket write per response (coordinator/server/hypercorn_patches.py): Hypercorn's HTTP/1.1
protocol object driven directly, every write it asks the TCP server for recorded.

A response that declares its length leaves in one write (head and body together); a streamed
one still sends its head at once (an SSE client sees the headers before the first token)."""

from __future__ import annotations

import h11
from hypercorn.config import Config
from hypercorn.events import Closed, RawData
from hypercorn.protocol.events import Body, EndBody, Response, StreamClosed
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.trio.worker_context import WorkerContext

from coordinator.server import hypercorn_patches

REQUEST = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"


class Recorded:
    """A protocol that has read one request, and the raw writes it made since."""

    def __init__(self) -> None:
        hypercorn_patches.apply()
        self.writes: list[bytes] = []
        self.closed = False

        async def send(event: object) -> None:
            if isinstance(event, RawData):
                self.writes.append(event.data)
            self.closed = self.closed or isinstance(event, Closed)

        self.protocol = H11Protocol(
            None,  # type: ignore[arg-type]  # the app is never called: events go in directly
            Config(),
            WorkerContext(None),
            None,  # type: ignore[arg-type]
            {},  # type: ignore[arg-type]
            False,
            ("127.0.0.1", 1),
            ("127.0.0.1", 2),
            send,
        )
        self.protocol.connection.receive_data(REQUEST)
        assert isinstance(self.protocol.connection.next_event(), h11.Request)
        assert isinstance(self.protocol.connection.next_event(), h11.EndOfMessage)

    async def respond(self, headers: list[tuple[bytes, bytes]], *chunks: bytes) -> None:
        await self.protocol.stream_send(Response(stream_id=1, headers=headers, status_code=200))
        for chunk in chunks:
            await self.protocol.stream_send(Body(stream_id=1, data=chunk))
        await self.protocol.stream_send(EndBody(stream_id=1))
        await self.protocol.stream_send(StreamClosed(stream_id=1))


async def test_a_response_with_a_length_is_one_write() -> None:
    rec = Recorded()
    body = b'{"ok":true}'
    await rec.respond([(b"content-length", str(len(body)).encode())], body)
    assert len(rec.writes) == 1
    head, _, sent = rec.writes[0].partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"content-length: 11" in head.lower()
    assert sent == body
    # h11 agrees the response is complete: the connection is ready for the next request
    assert rec.protocol.connection.our_state is h11.IDLE


async def test_a_body_in_chunks_sends_the_head_with_the_first() -> None:
    rec = Recorded()
    await rec.respond([(b"content-length", b"6")], b"abc", b"def")
    assert len(rec.writes) == 2
    assert rec.writes[0].endswith(b"\r\n\r\nabc")
    assert rec.writes[1] == b"def"


async def test_an_empty_body_still_sends_the_head() -> None:
    rec = Recorded()
    await rec.respond([(b"content-length", b"0")])
    assert len(rec.writes) == 1
    assert rec.writes[0].startswith(b"HTTP/1.1 200 OK\r\n")
    assert rec.writes[0].endswith(b"\r\n\r\n")


async def test_a_streamed_response_sends_its_head_before_any_chunk() -> None:
    rec = Recorded()
    await rec.protocol.stream_send(
        Response(stream_id=1, headers=[(b"content-type", b"text/event-stream")], status_code=200)
    )
    # the head is out before the app has produced anything
    assert len(rec.writes) == 1
    assert rec.writes[0].startswith(b"HTTP/1.1 200 OK\r\n")
    await rec.protocol.stream_send(Body(stream_id=1, data=b"data: x\n\n"))
    assert len(rec.writes) == 2


async def test_each_chunk_of_a_stream_is_one_write_of_its_own_frame() -> None:
    rec = Recorded()
    await rec.protocol.stream_send(
        Response(stream_id=1, headers=[(b"content-type", b"text/event-stream")], status_code=200)
    )
    chunks = [b"data: a\n\n", b"data: " + b"b" * 5000 + b"\n\n", b"data: c\n\n"]
    for chunk in chunks:
        await rec.protocol.stream_send(Body(stream_id=1, data=chunk))
    await rec.protocol.stream_send(EndBody(stream_id=1))
    assert rec.writes[1:] == [b"%x\r\n%s\r\n" % (len(c), c) for c in chunks] + [b"0\r\n\r\n"]
    assert rec.protocol.connection.our_state is h11.DONE


async def test_a_stream_closed_before_its_body_still_gets_the_head_first() -> None:
    rec = Recorded()
    await rec.protocol.stream_send(
        Response(stream_id=1, headers=[(b"content-length", b"5")], status_code=200)
    )
    assert rec.writes == []
    # the app gave up before its body: the head goes out, then Hypercorn closes the connection
    await rec.protocol.stream_send(StreamClosed(stream_id=1))
    assert len(rec.writes) == 1
    assert rec.writes[0].startswith(b"HTTP/1.1 200 OK\r\n")
    assert rec.closed
