"""The bounds of every read from a model server, without a socket
(protocol/model_servers/bounded_reads.py): the line splitter both callers feed raw bytes, the
error body, the whole body. Over real sockets: tests/coordinator/test_host_bounds.py."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.model_servers import (
    MAX_ERROR_BODY_BYTES,
    MAX_LINE_BYTES,
    MAX_STREAM_BYTES,
    HostError,
    LineSplitter,
    bounded_body,
    encoded,
    lines_of,
    whole_body,
)


def split(pieces: Iterable[bytes], **bounds: int) -> list[str]:
    splitter = LineSplitter("ollama", **bounds)
    lines = [line for piece in pieces for line in splitter.feed(piece)]
    return lines + splitter.end()


def cut(body: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(c, len(body)) for c in cuts})
    return [body[a:b] for a, b in zip([0, *points], [*points, len(body)], strict=True)]


@given(
    st.lists(st.sampled_from(["a", "é", "\n", "\r", "\r\n", " ", "\u2028", "\x85", "{}"])),
    st.lists(st.integers(0, 64)),
)
def test_any_cutting_of_a_body_gives_its_lines(parts: list[str], cuts: list[int]) -> None:
    body = "".join(parts).encode()
    expected = re.split("\r\n|\r|\n", "".join(parts))
    if expected[-1] == "":
        expected.pop()  # a body that ends with a line break has no line after it
    assert split(cut(body, cuts)) == expected


def test_only_cr_and_lf_end_a_line() -> None:
    # httpx's aiter_lines also cut at U+2028, U+0085 and the like (str.splitlines), which a
    # server's JSON may carry unescaped inside a string.
    assert split([b'{"response": "a\xe2\x80\xa8b\xc2\x85c"}\r\n\r', b"\n"]) == [
        '{"response": "a\u2028b\x85c"}',
        "",
    ]


def test_a_line_is_held_to_its_bound_however_it_comes() -> None:
    assert split([b"x" * 8 + b"\n"], max_line_bytes=8) == ["x" * 8]
    with pytest.raises(HostError, match="ollama: a stream line ran past 8 bytes"):
        split([b"x" * 9 + b"\n"], max_line_bytes=8)
    with pytest.raises(HostError, match="ran past 8 bytes"):
        split([b"xxx", b"xxx", b"xxx"], max_line_bytes=8)  # never held past 8
    with pytest.raises(HostError, match="ran past 8 bytes"):
        split([b"a\n" + b"x" * 9], max_line_bytes=8)  # an unended line at the end of a piece
    assert MAX_LINE_BYTES == 1024 * 1024


def test_the_splitter_never_holds_more_than_a_line() -> None:
    splitter = LineSplitter("openai", max_line_bytes=1000)
    for _ in range(99):
        splitter.feed(b"y" * 10)
    assert splitter.end() == ["y" * 990]
    splitter.feed(b"y" * 990)
    with pytest.raises(HostError):
        splitter.feed(b"y" * 11)


def test_a_stream_is_held_to_its_total() -> None:
    splitter = LineSplitter("openai", max_total_bytes=100)
    assert splitter.feed(b": keep-alive\n\n" * 7) == [": keep-alive", ""] * 7  # 98 bytes
    with pytest.raises(HostError, match="openai: the stream ran past 100 bytes"):
        splitter.feed(b"\n\n\n")
    assert MAX_STREAM_BYTES == 128 * 1024 * 1024


async def _pieces(pieces: Iterable[bytes], read: list[bytes]) -> AsyncIterator[bytes]:
    for piece in pieces:
        read.append(piece)
        yield piece


async def test_lines_of_reads_a_stream_to_its_last_unended_line() -> None:
    read: list[bytes] = []
    lines = [line async for line in lines_of(_pieces([b"a\nb", b"c\r\n", b"d"], read), "x")]
    assert lines == ["a", "bc", "d"]


async def test_an_error_body_stops_at_4_kib_even_in_one_huge_piece() -> None:
    read: list[bytes] = []
    body = await bounded_body(_pieces([b"x" * 10_000_000, b"never read"], read))
    assert body == b"x" * MAX_ERROR_BODY_BYTES and len(read) == 1


async def test_a_whole_body_is_read_to_its_limit_and_no_further() -> None:
    read: list[bytes] = []
    assert await whole_body(_pieces([b"{}"] * 3, read), limit=6) == b"{}{}{}"
    read.clear()
    assert await whole_body(_pieces([b"{}"] * 9, read), limit=6) is None
    assert len(read) == 4  # the piece that went past the limit was the last one read


@pytest.mark.parametrize(
    ("value", "compressed"),
    [(None, False), ("", False), ("identity", False), ("gzip", True), ("identity, br", True)],
)
def test_only_a_body_as_sent_counts_as_unencoded(value: str | None, compressed: bool) -> None:
    assert encoded(value) is compressed
