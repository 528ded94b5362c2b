"""Model backends of the node agent, against the fake model servers' real wire formats."""

from __future__ import annotations

import random
import string
from collections.abc import AsyncIterator
from contextlib import aclosing

import httpx
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.model_servers import Finish, Generation
from tests.fixtures.fake_servers import assert_nothing_refused
from tools.fakes.ollama import FakeOllama
from tools.fakes.openai import FakeOpenAI
from tools.node_agent import (
    BackendError,
    EchoBackend,
    Latency,
    OllamaBackend,
    OpenAIBackend,
    UsageError,
    parse_latency,
    split_words,
)

PROMPT = "  The quick\tbrown fox\n\njumps over  the lazy dog. "


async def collect(backend: object, model: str, prompt: str, stream: bool = True) -> list[str]:
    request = Generation(model=model, prompt=prompt, stream=stream)
    generator: AsyncIterator[str | Finish] = backend.generate(request)  # type: ignore[attr-defined]
    async with aclosing(generator) as deltas:  # type: ignore[type-var]
        return [delta async for delta in deltas if isinstance(delta, str)]


# --- echo --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prompt", "pieces"),
    [
        ("", []),
        ("one", ["one"]),
        ("hello world", ["hello ", "world"]),
        ("hello world ", ["hello ", "world "]),
        ("  leading", ["  ", "leading"]),
        ("   ", ["   "]),
        ("a  b\n\tc", ["a  ", "b\n\t", "c"]),
        ("\u00e9t\u00e9 \u2003caf\u00e9", ["\u00e9t\u00e9 \u2003", "caf\u00e9"]),
    ],
)
async def test_echo_streams_word_by_word(prompt: str, pieces: list[str]) -> None:
    assert split_words(prompt) == pieces
    assert await collect(EchoBackend(), "m", prompt) == pieces


_TEXT = st.text(alphabet=st.sampled_from(list(string.ascii_letters + " \t\n\r\u00a0\u2003.,é")))


@settings(max_examples=200, deadline=None)
@given(prompt=_TEXT | st.text())
async def test_echo_chunks_join_back_to_the_prompt_exactly(prompt: str) -> None:
    chunks = await collect(EchoBackend(), "m", prompt)
    assert "".join(chunks) == prompt
    assert all(chunks), "no empty chunk"
    for index, chunk in enumerate(chunks):
        # Each chunk is one word plus its trailing whitespace; only a leading run of
        # whitespace may stand alone, and only as the first chunk.
        assert len(chunk.split()) == (0 if index == 0 and chunk.isspace() else 1)
        if index > 0:
            assert not chunk[0].isspace()


async def test_echo_without_streaming_answers_the_whole_prompt() -> None:
    assert await collect(EchoBackend(), "m", PROMPT, stream=False) == [PROMPT]
    assert await collect(EchoBackend(), "m", "", stream=False) == []


async def test_echo_fixed_latency_and_chunk_delay(autojump_clock: trio.abc.Clock) -> None:
    backend = EchoBackend(latency=Latency(250, 250), chunk_delay_s=0.1)
    start = trio.current_time()
    seen: list[float] = []
    async with aclosing(
        backend.generate(Generation(model="m", prompt="a b c", stream=True))
    ) as deltas:
        async for delta in deltas:
            if isinstance(delta, str):
                seen.append(trio.current_time() - start)
    assert seen == pytest.approx([0.25, 0.35, 0.45])


async def test_echo_latency_range_is_seeded(autojump_clock: trio.abc.Clock) -> None:
    async def latencies(seed: int) -> list[float]:
        backend = EchoBackend(latency=Latency(10, 50), rng=random.Random(seed))
        out = []
        for _ in range(20):
            start = trio.current_time()
            await collect(backend, "m", "x", stream=False)
            out.append((trio.current_time() - start) * 1000)
        return out

    first, again, other = await latencies(7), await latencies(7), await latencies(8)
    assert first == pytest.approx(again)
    assert first != pytest.approx(other)
    assert all(10 <= ms <= 50 for ms in first)
    assert max(first) - min(first) > 10  # actually spread over the range


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", Latency(0, 0)),
        ("25", Latency(25, 25)),
        ("5-20", Latency(5, 20)),
        (" 5 - 5 ", Latency(5, 5)),
        ("1.5-2", Latency(1.5, 2)),
    ],
)
def test_latency_flag_parses(text: str, expected: Latency) -> None:
    assert parse_latency(text) == expected


@pytest.mark.parametrize("text", ["5-2", "-5", "abc", "", "5-", "1-2-3", "nan"])
def test_latency_flag_rejects(text: str) -> None:
    with pytest.raises(UsageError, match="--latency-ms"):
        parse_latency(text)


# --- HTTP backends, parametrized over both fakes -----------------------------------------------


@pytest.fixture(params=["ollama", "openai"])
async def served(
    request: pytest.FixtureRequest, nursery: trio.Nursery
) -> AsyncIterator[tuple[FakeOllama | FakeOpenAI, OllamaBackend | OpenAIBackend]]:
    server: FakeOllama | FakeOpenAI = FakeOllama() if request.param == "ollama" else FakeOpenAI()
    url = await nursery.start(server.run)
    backend = OllamaBackend(url) if request.param == "ollama" else OpenAIBackend(url, api_key="")
    yield server, backend
    await backend.aclose()
    assert_nothing_refused(server)


@pytest.mark.parametrize("stream", [True, False])
async def test_http_backend_streams_the_answer(served, stream: bool) -> None:  # type: ignore[no-untyped-def]
    server, backend = served
    deltas = await collect(backend, "gemma3:4b", PROMPT, stream)
    assert deltas == split_words(PROMPT)
    assert "".join(deltas) == PROMPT
    with trio.fail_after(2):
        while server.completed < 1:  # the server's bookkeeping may trail the client a little
            await trio.sleep(0.005)
    # The model server is always asked to stream, so a cancelled task stops it at once.
    assert server.requests[-1]["stream"] is True
    assert server.requests[-1]["model"] == "gemma3:4b"


async def test_http_backend_empty_prompt(served) -> None:  # type: ignore[no-untyped-def]
    _, backend = served
    assert await collect(backend, "m", "") == []


@pytest.mark.parametrize(
    ("mode", "match", "before"),
    [
        ("http", "HTTP 500: fake .*: injected failure", 0),
        ("midstream", "injected failure mid-stream", 1),
        ("truncate", "stream ended before", 1),
    ],
)
async def test_http_backend_failures_become_backend_errors(  # type: ignore[no-untyped-def]
    served, mode: str, match: str, before: int
) -> None:
    server, backend = served
    server.fail = mode
    received: list[str] = []
    with pytest.raises(BackendError, match=match):
        async with aclosing(
            backend.generate(Generation(model="m", prompt=PROMPT, stream=True))
        ) as deltas:
            async for delta in deltas:
                received.append(delta)
    assert len(received) == before
    server.fail = None
    assert "".join(await collect(backend, "m", PROMPT)) == PROMPT  # recovers


async def test_http_backend_unknown_model(served) -> None:  # type: ignore[no-untyped-def]
    server, backend = served
    server.models = {"gemma3:4b"}
    with pytest.raises(BackendError, match=r"HTTP 404: .*(not found|does not exist)"):
        await collect(backend, "llama3", PROMPT)


async def test_http_backend_unreachable_server() -> None:
    with trio.socket.socket() as sock:
        await sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: connection refused
        for backend in (
            OllamaBackend(f"http://127.0.0.1:{port}"),
            OpenAIBackend(f"http://127.0.0.1:{port}", api_key=""),
        ):
            with pytest.raises(BackendError, match="cannot connect to http://127.0.0.1"):
                await collect(backend, "m", PROMPT)
            await backend.aclose()


async def test_http_backend_abandoned_stream_reaches_the_server(served) -> None:  # type: ignore[no-untyped-def]
    server, backend = served
    server.chunk_delay_s = 0.02
    with trio.fail_after(5):
        async with aclosing(
            backend.generate(Generation(model="m", prompt="w " * 200, stream=True))
        ) as deltas:
            async for _ in deltas:
                break
        await server.wait_aborted()
    assert server.completed == 0


# --- backend specifics -------------------------------------------------------------------------


async def test_ollama_backend_sends_the_generate_request(fake_ollama: FakeOllama) -> None:
    backend = OllamaBackend(fake_ollama.url + "/")
    try:
        await collect(backend, "gemma3:1b", "hi there")
    finally:
        await backend.aclose()
    assert fake_ollama.paths == ["/api/generate"]
    assert fake_ollama.requests == [
        {"model": "gemma3:1b", "prompt": "hi there", "raw": True, "stream": True}
    ]


async def test_openai_backend_sends_the_key_from_the_environment(
    fake_openai: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_openai.api_key = "sk-test"
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    backend = OpenAIBackend(fake_openai.url + "/v1")  # a trailing /v1 is accepted
    try:
        assert "".join(await collect(backend, "gpt", "hello there")) == "hello there"
    finally:
        await backend.aclose()
    assert fake_openai.authorizations == ["Bearer sk-test"]
    # A raw prompt is a completion, not a chat turn (no chat template applied to it).
    assert fake_openai.paths == ["/v1/completions"]
    assert fake_openai.requests == [
        {
            "model": "gpt",
            "prompt": "hello there",
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    ]


async def test_openai_backend_wrong_key(
    fake_openai: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    fake_openai.api_key = "sk-right"
    backend = OpenAIBackend(fake_openai.url)
    try:
        with pytest.raises(BackendError, match="HTTP 401: Incorrect API key"):
            await collect(backend, "gpt", "hi")
    finally:
        await backend.aclose()
    assert fake_openai.authorizations == [None]


# --- the fakes speak the real formats ---------------------------------------------------------


async def test_fake_ollama_wire_format(fake_ollama: FakeOllama) -> None:
    async with httpx.AsyncClient(base_url=fake_ollama.url) as client:
        response = await client.post("/api/generate", json={"model": "m", "prompt": "a b"})
        assert response.headers["content-type"] == "application/x-ndjson"
        records = [httpx.Response(200, content=line).json() for line in response.text.splitlines()]
        assert [r["response"] for r in records] == ["a ", "b", ""]
        assert [r["done"] for r in records] == [False, False, True]
        final = records[-1]
        for field in (
            "model",
            "created_at",
            "done_reason",
            "total_duration",
            "load_duration",
            "prompt_eval_count",
            "prompt_eval_duration",
            "eval_count",
            "eval_duration",
        ):
            assert field in final
        assert final["eval_count"] == 2

        whole = await client.post(
            "/api/generate", json={"model": "m", "prompt": "a b", "stream": False}
        )
        assert whole.json()["response"] == "a b"
        assert whole.json()["done"] is True

        fake_ollama.fail = "http"
        failed = await client.post("/api/generate", json={"model": "m", "prompt": "a"})
        assert failed.status_code == 500
        assert "error" in failed.json()


async def test_fake_openai_wire_format(fake_openai: FakeOpenAI) -> None:
    body = {
        "model": "m",
        "stream": True,
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "a b"}]},
        ],
    }
    async with httpx.AsyncClient(base_url=fake_openai.url) as client:
        response = await client.post("/v1/chat/completions", json=body)
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line[len("data: ") :] for line in response.text.split("\n\n") if line]
        assert events[-1] == "[DONE]"
        chunks = [httpx.Response(200, content=event).json() for event in events[:-1]]
        assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
        assert len({c["id"] for c in chunks}) == 1
        for chunk in chunks:
            assert set(chunk) >= {"id", "object", "created", "model", "choices"}
            assert set(chunk["choices"][0]) >= {"index", "delta", "finish_reason"}
        assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
        assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == "a b"
        assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "stop"

        whole = await client.post("/v1/chat/completions", json={**body, "stream": False})
        assert whole.json()["object"] == "chat.completion"
        assert whole.json()["choices"][0]["message"] == {
            "role": "assistant",
            "content": "a b",
            "refusal": None,
        }
        assert whole.json()["usage"]["completion_tokens"] == 2

        fake_openai.fail = "http"
        failed = await client.post("/v1/chat/completions", json=body)
        assert failed.status_code == 500
        assert failed.json()["error"]["type"] == "server_error"
