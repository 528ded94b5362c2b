"""Model backends of the node agent, one small class each behind one interface.

``generate(request)`` takes a :class:`Generation` (the model, a prompt or a conversation, the
sampling options) and is an async generator of output deltas, then at most one :class:`Finish`
(usage and finish reason as the server reported them): the agent sends each delta as a Chunk
when the task streams, and joins them into the Result either way. Every failure
of the model server surfaces as :class:`BackendError` with a short, loggable message; anything
else escaping a backend is a bug. Backends own their HTTP client and are closed with ``aclose``.

* :class:`EchoBackend` - the reference model: answers with exactly the prompt (a conversation:
  its v1 transcript), counting words as tokens, honouring ``max_tokens`` and ``stop``.
* :class:`OllamaBackend` - Ollama's own API: ``POST /api/chat`` for a conversation, ``POST
  /api/generate`` for a raw prompt, NDJSON streams.
* :class:`OpenAIBackend` - an OpenAI-compatible server: ``POST /v1/chat/completions`` for a
  conversation, ``POST /v1/completions`` for a raw prompt, server-sent events.

Both HTTP backends send the conversation as it is and the options under the server's own names.
The wire formats are sans-IO in ``protocol/model_servers/``, shared with the coordinator's direct
hosts, and so are the bounds of every read (``bounded_reads.py``: a stream line at most 1 MiB, a
stream 128 MiB, an error body 4 KiB, ``/api/ps`` 1 MiB); what is left here is the httpx stream
that carries them (``_HttpBackend._stream``, the body asked for unencoded, its bytes fed in as
they come). The coordinator has its own copy of those few lines
(``coordinator/hosts/host_client.py``): the agent imports nothing of the coordinator, so a model
host runs it without the server's dependencies.
"""

from __future__ import annotations

import os
import random
import re
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import Any, Protocol

import httpx
import trio

from protocol import FinishReason, Usage, transcript
from protocol.model_servers import (
    UNENCODED,
    Finish,
    Generation,
    HostError,
    ServerCall,
    bounded_body,
    encoded,
    lines_of,
    load_json,
    ollama_call,
    openai_call,
    short,
    status_error,
    whole_body,
)
from tools.node_agent.settings import (
    DEFAULT_OLLAMA_URL,
    DEFAULT_OPENAI_URL,
    Latency,
    NodeSettings,
)

__all__ = [
    "Backend",
    "BackendError",
    "BackendUnreachable",
    "EchoBackend",
    "OllamaBackend",
    "OpenAIBackend",
    "make_backend",
    "split_words",
]

#: answers to the model-list check from a server that is up but keeps no list at that path
NO_MODEL_LIST = frozenset({404, 405, 501})
# One word plus the whitespace after it; leading whitespace is a piece of its own.
_WORD_RE = re.compile(r"^\s+|\S+\s*")
#: The model server failed, refused, or spoke something we cannot read (the wire formats
#: live in protocol/model_servers/, shared with the coordinator's direct hosts).
BackendError = HostError


class BackendUnreachable(HostError):
    """No connection to the model server could be made: the request never reached it (the
    task never ran, so the coordinator may place it on another node)."""


class Backend(Protocol):
    name: str

    def generate(self, request: Generation) -> AsyncIterator[str | Finish]: ...

    async def resident(self, models: tuple[str, ...]) -> list[str] | None:
        """Which of ``models`` are loaded in memory now (None: cannot tell). Sent in every
        heartbeat; the coordinator charges their size against the node's memory budget."""
        ...

    async def check(self) -> list[str] | None:
        """Whether the model server answers (``health.py``): the models it lists (None: it
        does not say); raises BackendError with what failed. Optional: a backend without it
        counts as always answering."""
        ...

    async def aclose(self) -> None: ...


def split_words(text: str) -> list[str]:
    """Split ``text`` into word-plus-trailing-whitespace pieces that join back to it exactly."""
    return _WORD_RE.findall(text)


class EchoBackend:
    """Answers with the prompt after a (possibly random) latency; streams it word by word."""

    name = "echo"

    def __init__(
        self,
        *,
        latency: Latency | None = None,
        chunk_delay_s: float = 0.0,
        rng: random.Random | None = None,
    ) -> None:
        self.latency = latency if latency is not None else Latency()
        self.chunk_delay_s = chunk_delay_s
        self._rng = rng if rng is not None else random.Random()

    async def generate(self, request: Generation) -> AsyncIterator[str | Finish]:
        delay = self.latency.sample_s(self._rng)
        if delay > 0:
            await trio.sleep(delay)
        answer, finish_reason = echo_answer(request)
        if not request.stream:
            if answer:
                yield answer
        else:
            for index, piece in enumerate(split_words(answer)):
                if index and self.chunk_delay_s > 0:
                    await trio.sleep(self.chunk_delay_s)
                yield piece
        usage = Usage(
            prompt_tokens=len(request.input_text.split()), completion_tokens=len(answer.split())
        )
        yield Finish(usage=usage, finish_reason=finish_reason)

    async def resident(self, models: tuple[str, ...]) -> list[str] | None:
        return list(models)  # the echo "model" is always loaded

    async def check(self) -> list[str] | None:
        return None  # nothing to reach: always answers

    async def aclose(self) -> None:
        return None


def echo_answer(request: Generation) -> tuple[str, FinishReason]:
    """What the echo model answers: the prompt (a conversation: its transcript), cut at the
    first stop string (``stop``) or after ``max_tokens`` words (``length``)."""
    text = request.prompt if request.messages is None else transcript(list(request.messages))
    text = text or ""
    options = request.options
    if options is not None and options.stop:
        cuts = [text.find(s) for s in options.stop if s in text]
        if cuts:
            text = text[: min(cuts)]
    if options is not None and options.max_tokens is not None:
        pieces = split_words(text)
        words = [p for p in pieces if p.strip()]
        if len(words) > options.max_tokens:
            kept: list[str] = []
            count = 0
            for piece in pieces:
                if piece.strip():
                    if count == options.max_tokens:
                        break
                    count += 1
                kept.append(piece)
            return "".join(kept).rstrip(), "length"
    return text, "stop"


class _HttpBackend:
    """Shared HTTP plumbing: one client, no read timeout (the task's timeout_s bounds it)."""

    name = "http"
    #: the health check (``check``): a GET of the server's model list, and its list's key
    #: and each entry's name key
    check_path = "/api/tags"
    listing = ("models", "name")

    def __init__(
        self,
        base_url: str,
        *,
        connect_timeout_s: float = 10.0,
        transport: httpx.AsyncBaseTransport | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(None, connect=connect_timeout_s),
            transport=transport,
            headers=headers,
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    async def resident(self, models: tuple[str, ...]) -> list[str] | None:
        return None

    async def check(self) -> list[str] | None:
        """``GET`` of the model list (``check_path``): answered with 200 and the list, read
        unencoded and to 1 MiB at most; the names it lists. A server that answers the path
        with 404, 405 or 501 is up but lists nothing (None: some OpenAI-compatible servers
        serve only the completion routes). The caller bounds the time."""
        url = f"{self.base_url}{self.check_path}"
        try:
            async with self._client.stream("GET", url, headers=UNENCODED) as response:
                if response.status_code in NO_MODEL_LIST:
                    return None  # it answers, but keeps no model list there: up, on trust
                if response.status_code != 200:
                    raise HostError(f"{self.name}: GET {url} answered HTTP {response.status_code}")
                if encoded(response.headers.get("content-encoding")):
                    raise HostError(f"{self.name}: GET {url}: the answer came compressed")
                body = await whole_body(response.aiter_bytes())
        except httpx.HTTPError as exc:
            raise HostError(f"{self.name}: GET {url}: {_failure(exc)}") from exc
        if body is None:
            raise HostError(f"{self.name}: GET {url}: the answer is longer than 1 MiB")
        list_key, name_key = self.listing
        try:
            items = load_json(body).get(list_key)
        except (ValueError, AttributeError):
            items = None
        if not isinstance(items, list):
            raise HostError(f"{self.name}: GET {url}: the answer has no {list_key!r} list")
        return [
            i[name_key] for i in items if isinstance(i, dict) and isinstance(i.get(name_key), str)
        ]

    async def _stream(self, call: ServerCall) -> AsyncGenerator[str | Finish, None]:
        """The output deltas of ``call``, then its Finish; every failure a BackendError."""
        try:
            async with self._client.stream(
                "POST", f"{self.base_url}{call.path}", json=call.body, headers=call.request_headers
            ) as response:
                if response.status_code != 200:
                    raise await _status_error(call.server, response)
                if encoded(response.headers.get("content-encoding")):
                    raise HostError(
                        f"{call.server}: the answer came compressed, none was asked for"
                    )
                lines = lines_of(response.aiter_bytes(), call.server)
                async with aclosing(lines), aclosing(call.read(lines)) as items:
                    async for item in items:
                        yield item
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise BackendUnreachable(_describe(call.server, self.base_url, exc)) from exc
        except httpx.HTTPError as exc:
            raise HostError(_describe(call.server, self.base_url, exc)) from exc


async def _status_error(server: str, response: httpx.Response) -> HostError:
    body = b""  # the status alone says enough, when the body cannot be read as it is
    if not encoded(response.headers.get("content-encoding")):
        try:
            body = await bounded_body(response.aiter_bytes())
        except httpx.HTTPError:
            pass
    return status_error(server, response.status_code, body)


def _describe(name: str, base_url: str, exc: httpx.HTTPError) -> str:
    if isinstance(exc, httpx.ConnectError):
        return f"{name}: cannot connect to {base_url}"
    if isinstance(exc, httpx.TimeoutException):
        return f"{name}: timed out talking to {base_url}"
    if isinstance(exc, (httpx.ReadError, httpx.RemoteProtocolError)):
        return f"{name}: connection to {base_url} lost mid-response"
    return short(f"{name}: {type(exc).__name__}: {exc}")


def _failure(exc: httpx.HTTPError) -> str:
    """What went wrong with a request that got no answer, in a few words for one log line."""
    what = {
        httpx.ConnectError: "cannot connect",
        httpx.ConnectTimeout: "timed out connecting",
        httpx.TimeoutException: "timed out",
        httpx.ReadError: "connection lost",
        httpx.RemoteProtocolError: "connection lost",
    }
    for kind, words in what.items():
        if isinstance(exc, kind):
            detail = str(exc)
            return short(f"{words} ({detail})") if detail else words
    return short(f"{type(exc).__name__}: {exc}")


class OllamaBackend(_HttpBackend):
    """Ollama's ``POST /api/chat`` / ``POST /api/generate``, read to the ``done`` record."""

    name = "ollama"

    def __init__(self, base_url: str = DEFAULT_OLLAMA_URL, **kwargs: Any) -> None:
        super().__init__(base_url, **kwargs)

    async def resident(self, models: tuple[str, ...]) -> list[str] | None:
        """``GET /api/ps``: the models Ollama holds in memory now."""
        try:
            async with self._client.stream(
                "GET", f"{self.base_url}/api/ps", headers=UNENCODED, timeout=2.0
            ) as response:
                if response.status_code != 200 or encoded(response.headers.get("content-encoding")):
                    return None
                body = await whole_body(response.aiter_bytes())
            if body is None:
                return None  # more than any list of loaded models
            loaded = {m.get("name") for m in load_json(body).get("models", [])}
        except (httpx.HTTPError, ValueError, AttributeError, TypeError):
            return None
        return [m for m in models if m in loaded]

    def generate(self, request: Generation) -> AsyncIterator[str | Finish]:
        # Always streams from the server (server_call.py): a cancelled task stops generation
        # at once by dropping the connection.
        return self._stream(ollama_call(request))


class OpenAIBackend(_HttpBackend):
    """An OpenAI-compatible ``POST /v1/chat/completions`` / ``POST /v1/completions`` (SSE)."""

    name = "openai"
    check_path = "/v1/models"
    listing = ("data", "id")

    def __init__(
        self, base_url: str = DEFAULT_OPENAI_URL, *, api_key: str | None = None, **kwargs: Any
    ) -> None:
        base_url = base_url.rstrip("/")
        # Accept both http://host:port and http://host:port/v1 as the server's address.
        base_url = base_url.removesuffix("/v1")
        if api_key is None:
            api_key = os.environ.get("OPENAI_API_KEY") or None
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
        super().__init__(base_url, headers=headers, **kwargs)

    def generate(self, request: Generation) -> AsyncIterator[str | Finish]:
        return self._stream(openai_call(request))


def make_backend(settings: NodeSettings, *, rng: random.Random) -> Backend:
    """The backend ``settings`` asks for; ``rng`` drives the echo backend's latency."""
    if settings.backend == "echo":
        return EchoBackend(latency=settings.latency, chunk_delay_s=settings.chunk_delay_s, rng=rng)
    if settings.backend == "ollama":
        return OllamaBackend(settings.backend_url or DEFAULT_OLLAMA_URL)
    if settings.backend == "openai":
        return OpenAIBackend(settings.backend_url or DEFAULT_OPENAI_URL)
    raise ValueError(f"unknown backend {settings.backend!r}")
