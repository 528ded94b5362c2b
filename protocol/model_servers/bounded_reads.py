"""How much of a model server's answer is read: every read has a bound, whatever the server sends.

The caller's HTTP client hands the body over as it comes off the socket (httpx's ``aiter_bytes``:
pieces of at most one socket read, 64 KiB), having asked for it unencoded (``UNENCODED``, which
every ``ServerCall`` sends). An answer that says it comes compressed anyway is refused unread
(``encoded``): a few KiB of gzip inflate to megabytes in one piece, which no bound here would
see coming. From there:

* a stream is cut into lines here (:class:`LineSplitter`, :func:`lines_of`), which holds at most
  ``MAX_LINE_BYTES`` of a line not yet ended: a longer line is a HostError, and so is a stream
  that runs past ``MAX_STREAM_BYTES`` in all (one that never ends, or says nothing for ever);
* an error answer (any status but 200) is read to its first ``MAX_ERROR_BODY_BYTES`` at most
  (:func:`bounded_body`), and the caller then closes the connection, the rest unread;
* a whole answer (the model lists the monitor polls, the agent's ``/api/ps``) is read to
  ``MAX_BODY_BYTES`` at most (:func:`whole_body`): a longer one is no answer.

So a server costs its caller at most about a line's bound of memory, whatever it sends; how long
it may take is the caller's own bound (a task's timeout, the monitor's poll timeout).
"""

from __future__ import annotations

import re
from collections.abc import AsyncGenerator, AsyncIterable

from protocol.codec import MAX_ENVELOPE_BYTES
from protocol.model_servers.server_call import HostError

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_ERROR_BODY_BYTES",
    "MAX_LINE_BYTES",
    "MAX_STREAM_BYTES",
    "LineSplitter",
    "bounded_body",
    "encoded",
    "lines_of",
    "whole_body",
]

#: the longest line of a stream (NDJSON record, server-sent-event field), its line break aside.
#: An honest line is one delta and a few hundred bytes of framing, and no delta can be longer
#: than a result's whole output (``MAX_OUTPUT_BYTES``, just under this): 1 MiB.
MAX_LINE_BYTES = MAX_ENVELOPE_BYTES
#: the most a stream may send in all, line breaks and framing included: 128 MiB. The output it
#: carries is at most a result's (1 MiB, which the callers hold it to already), but each delta
#: comes framed: Ollama's records take about 100-150 bytes a token, OpenAI's chunks 200-350, so
#: at 3-4 characters a token 1 MiB of output takes up to about 120 MiB. A total as small as the
#: largest result would cut a few thousand tokens of honest answer.
MAX_STREAM_BYTES = 128 * MAX_LINE_BYTES
#: how much of an error response is read: enough for any server's message, never a whole page
MAX_ERROR_BODY_BYTES = 4096
#: the longest whole answer read (a model list): 1 MiB, some 3,000 models in Ollama's
#: ``/api/tags`` shape and more in OpenAI's ``/v1/models``. Kept small because what it parses
#: into is larger again (1 MiB of ``[{}, {}, ...]`` is some 20 MiB of dicts).
MAX_BODY_BYTES = 1024 * 1024

_LINE_BREAK = re.compile(rb"\r\n|\r|\n")


def encoded(content_encoding: str | None) -> bool:
    """Whether a body comes compressed (a ``Content-Encoding`` other than identity)."""
    codings = (content_encoding or "").split(",")
    return any(coding.strip().lower() not in ("", "identity") for coding in codings)


class LineSplitter:
    """Bytes in, text lines out (``\\n``, ``\\r\\n`` or ``\\r`` ends one, as in NDJSON and
    server-sent events), holding no more than ``max_line_bytes`` of a line not yet ended."""

    def __init__(
        self,
        server: str,
        *,
        max_line_bytes: int | None = None,
        max_total_bytes: int | None = None,
    ) -> None:
        self.server = server
        # The module's bounds as they are now (a test may lower them).
        self._max_line = MAX_LINE_BYTES if max_line_bytes is None else max_line_bytes
        self._max_total = MAX_STREAM_BYTES if max_total_bytes is None else max_total_bytes
        self._partial = bytearray()
        self._total = 0
        # The last piece ended with \r: a \n opening the next one ends no second line.
        self._after_cr = False

    def feed(self, data: bytes) -> list[str]:
        """The lines ``data`` ends (the first may have begun in earlier pieces)."""
        if not data:
            return []
        self._total += len(data)
        if self._total > self._max_total:
            raise HostError(f"{self.server}: the stream ran past {self._max_total:,} bytes")
        start = 1 if self._after_cr and data[:1] == b"\n" else 0
        self._after_cr = data[-1:] == b"\r"
        lines: list[str] = []
        for found in _LINE_BREAK.finditer(data, start):
            end = found.start()
            self._check(len(self._partial) + end - start)
            if self._partial:
                self._partial += data[start:end]
                line = bytes(self._partial)
                self._partial.clear()
            else:
                line = data[start:end]
            lines.append(line.decode("utf-8", "replace"))
            start = found.end()
        if start < len(data):
            self._check(len(self._partial) + len(data) - start)
            self._partial += data[start:]
        return lines

    def end(self) -> list[str]:
        """The last line, when the stream ended without a line break after it."""
        if not self._partial:
            return []
        line = self._partial.decode("utf-8", "replace")
        self._partial.clear()
        return [line]

    def _check(self, size: int) -> None:
        if size > self._max_line:
            raise HostError(f"{self.server}: a stream line ran past {self._max_line:,} bytes")


async def lines_of(chunks: AsyncIterable[bytes], server: str) -> AsyncGenerator[str, None]:
    """The text lines of a stream of ``server``'s, within the bounds of :class:`LineSplitter`."""
    splitter = LineSplitter(server)
    async for chunk in chunks:
        for line in splitter.feed(chunk):
            yield line
    for line in splitter.end():
        yield line


async def bounded_body(chunks: AsyncIterable[bytes]) -> bytes:
    """The first ``MAX_ERROR_BODY_BYTES`` of an error response, read no further than that."""
    body = bytearray()
    async for piece in chunks:
        body += piece[: MAX_ERROR_BODY_BYTES - len(body)]
        if len(body) >= MAX_ERROR_BODY_BYTES:
            break
    return bytes(body)


async def whole_body(chunks: AsyncIterable[bytes], limit: int = MAX_BODY_BYTES) -> bytes | None:
    """The whole body, or None when it is longer than ``limit`` (read no further than that)."""
    body = bytearray()
    async for piece in chunks:
        if len(body) + len(piece) > limit:
            return None
        body += piece
    return bytes(body)
