"""Each model server's own API (protocol/model_servers/ollama_wire.py, openai_wire.py), spoken by
the node agent's HTTP backends to the fake servers over real sockets. The fakes check every body
against the real client libraries' request types (``ollama`` 0.6.3, ``openai`` 3.51.0), so
what is asserted here at the fake is also what the real servers take: a conversation goes to
the chat route in order, a raw prompt to the completion route, the options under the server's
own names; the usage and finish reason come back from the server's last record."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

import httpx
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.hosts.host_client import stream_call
from protocol import Message, Options, Usage
from protocol.model_servers import (
    Finish,
    Generation,
    HostError,
    ollama_call,
    ollama_request,
    openai_call,
    openai_request,
    token_count,
    usage_of,
)
from tests.protocol.strategies import messages as message_lists
from tests.protocol.strategies import options as option_sets
from tools.fakes import _ollama_types, _openai_types
from tools.fakes._server import FakeModelServer, Request, Response
from tools.fakes.ollama import FakeOllama
from tools.fakes.openai import FakeOpenAI
from tools.node_agent import OllamaBackend, OpenAIBackend

CONVERSATION = (
    Message(role="system", content="be brief"),
    Message(role="developer", content="no small talk"),
    Message(role="user", content="first question"),
    Message(role="assistant", content="first answer"),
    Message(role="user", content="one two three four five"),
)
#: words in every content above: what the fakes count as prompt tokens
CONVERSATION_WORDS = 2 + 3 + 2 + 2 + 5
OPTIONS = Options(
    max_tokens=3,
    temperature=0.2,
    top_p=0.9,
    top_k=40,
    stop=["STOP"],
    seed=7,
    presence_penalty=0.5,
    frequency_penalty=-0.5,
)
SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}}


async def run(backend: OllamaBackend | OpenAIBackend, request: Generation) -> list[str | Finish]:
    try:
        async with aclosing(backend.generate(request)) as deltas:  # type: ignore[type-var]
            return [delta async for delta in deltas]
    finally:
        await backend.aclose()


# --- Ollama ------------------------------------------------------------------------------------


async def test_ollama_gets_a_conversation_on_api_chat_with_its_option_names(
    fake_ollama: FakeOllama,
) -> None:
    request = Generation(model="m", messages=CONVERSATION, options=OPTIONS, stream=True)
    out = await run(OllamaBackend(fake_ollama.url or ""), request)
    assert fake_ollama.paths == ["/api/chat"]
    assert fake_ollama.requests == [
        {
            "model": "m",
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "system", "content": "no small talk"},  # Ollama has no developer
                {"role": "user", "content": "first question"},
                {"role": "assistant", "content": "first answer"},
                {"role": "user", "content": "one two three four five"},
            ],
            "stream": True,
            "options": {
                "num_predict": 3,
                "temperature": 0.2,
                "top_p": 0.9,
                "top_k": 40,
                "stop": ["STOP"],
                "seed": 7,
                "presence_penalty": 0.5,
                "frequency_penalty": -0.5,
            },
        }
    ]
    # The last user message, cut at num_predict: the done record says "length".
    usage = Usage(prompt_tokens=CONVERSATION_WORDS, completion_tokens=3)
    assert out == ["one ", "two ", "three", Finish(usage=usage, finish_reason="length")]


async def test_ollama_gets_a_raw_prompt_on_api_generate(fake_ollama: FakeOllama) -> None:
    request = Generation(model="m", prompt="a b STOP c d", options=Options(stop=["STOP"]))
    out = await run(OllamaBackend(fake_ollama.url or ""), request)
    assert fake_ollama.paths == ["/api/generate"]
    assert fake_ollama.requests == [
        # raw: Ollama puts no template around a task's prompt (a conversation gets it).
        {
            "model": "m",
            "prompt": "a b STOP c d",
            "raw": True,
            "stream": True,
            "options": {"stop": ["STOP"]},
        }
    ]
    usage = Usage(prompt_tokens=5, completion_tokens=2)
    assert out == ["a ", "b ", Finish(usage=usage, finish_reason="stop")]


@pytest.mark.parametrize(
    ("options", "sent"),
    [
        (Options(format="json"), "json"),
        (Options(format="json", json_schema=SCHEMA), SCHEMA),
        (Options(format="text"), None),
    ],
)
async def test_ollama_gets_the_answer_format_top_level(
    fake_ollama: FakeOllama, options: Options, sent: object
) -> None:
    request = Generation(model="m", messages=CONVERSATION[-1:], options=options)
    await run(OllamaBackend(fake_ollama.url or ""), request)
    assert fake_ollama.requests[0].get("format") == sent
    assert "options" not in fake_ollama.requests[0]  # no sampling option set: none sent


# --- OpenAI-compatible -------------------------------------------------------------------------


async def test_openai_gets_a_conversation_on_chat_completions_with_usage_asked(
    fake_openai: FakeOpenAI,
) -> None:
    request = Generation(model="gpt", messages=CONVERSATION, options=OPTIONS, stream=True)
    out = await run(OpenAIBackend(fake_openai.url or "", api_key=""), request)
    assert fake_openai.paths == ["/v1/chat/completions"]
    assert fake_openai.requests == [
        {
            "model": "gpt",
            "messages": [{"role": m.role, "content": m.content} for m in CONVERSATION],
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": 3,
            "temperature": 0.2,
            "top_p": 0.9,
            "top_k": 40,  # vLLM's extra parameter
            "stop": ["STOP"],
            "seed": 7,
            "presence_penalty": 0.5,
            "frequency_penalty": -0.5,
        }
    ]
    usage = Usage(prompt_tokens=CONVERSATION_WORDS, completion_tokens=3)
    assert out == ["one ", "two ", "three", Finish(usage=usage, finish_reason="length")]


async def test_openai_gets_a_raw_prompt_on_completions(fake_openai: FakeOpenAI) -> None:
    request = Generation(model="gpt", prompt="a b c d", options=Options(max_tokens=2, seed=1))
    out = await run(OpenAIBackend(fake_openai.url or "", api_key=""), request)
    assert fake_openai.paths == ["/v1/completions"]
    assert fake_openai.requests == [
        {
            "model": "gpt",
            "prompt": "a b c d",
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": 2,
            "seed": 1,
        }
    ]
    usage = Usage(prompt_tokens=4, completion_tokens=2)
    assert out == ["a ", "b", Finish(usage=usage, finish_reason="length")]


@pytest.mark.parametrize("chat", [True, False])
@pytest.mark.parametrize(
    ("options", "sent"),
    [
        (Options(format="json"), {"type": "json_object"}),
        (
            Options(format="json", json_schema=SCHEMA),
            {"type": "json_schema", "json_schema": {"name": "response", "schema": SCHEMA}},
        ),
        (Options(format="text"), None),
    ],
)
async def test_openai_gets_the_answer_format_as_response_format(
    fake_openai: FakeOpenAI, chat: bool, options: Options, sent: object
) -> None:
    content = {"messages": CONVERSATION[-1:]} if chat else {"prompt": "x"}
    request = Generation(model="gpt", options=options, **content)  # type: ignore[arg-type]
    await run(OpenAIBackend(fake_openai.url or "", api_key=""), request)
    assert fake_openai.requests[0].get("response_format") == sent


async def test_a_tool_turn_reaches_both_servers_in_a_shape_their_types_take(
    fake_ollama: FakeOllama, fake_openai: FakeOpenAI
) -> None:
    turns = (Message(role="tool", content="42"), Message(role="user", content="and so?"))
    request = Generation(model="m", messages=turns)
    await run(OllamaBackend(fake_ollama.url or ""), request)
    await run(OpenAIBackend(fake_openai.url or "", api_key=""), request)
    assert fake_ollama.requests[0]["messages"][0] == {"role": "tool", "content": "42"}
    # The SDK's type demands the id of the call a tool turn answers; we carry none.
    assert fake_openai.requests[0]["messages"][0] == {
        "role": "tool",
        "content": "42",
        "tool_call_id": "",
    }


# --- the fakes refuse what the libraries would not send ----------------------------------------

_CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}


@pytest.mark.parametrize(
    ("path", "body", "reason"),
    [
        ("/api/chat", {**_CHAT, "num_predict": 3}, "num_predict: Extra inputs"),
        ("/api/chat", {**_CHAT, "options": {"max_tokens": 3}}, "options.max_tokens: Extra"),
        ("/api/chat", {**_CHAT, "options": {"num_predict": "3"}}, "options.num_predict"),
        (
            "/api/chat",
            {**_CHAT, "messages": [{"role": "developer", "content": "x"}]},
            "messages.0.role",
        ),
        ("/api/generate", {"model": "m", "messages": _CHAT["messages"]}, "messages: Extra"),
    ],
)
async def test_the_fake_ollama_refuses_what_the_library_types_refuse(
    fake_ollama: FakeOllama, path: str, body: dict[str, Any], reason: str
) -> None:
    async with httpx.AsyncClient(base_url=fake_ollama.url or "") as client:
        response = await client.post(path, json=body)
    assert response.status_code == 400
    assert reason in response.json()["error"]
    assert fake_ollama.requests == [body]  # recorded, and recorded as refused
    assert [(r.path, r.body) for r in fake_ollama.refused] == [(path, body)]
    assert reason in fake_ollama.refused[0].reason
    fake_ollama.refused.clear()


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        (
            "/v1/chat/completions",
            {**_CHAT, "num_predict": 3},
            "Unrecognized request argument supplied: num_predict",
        ),
        (
            "/v1/chat/completions",
            {**_CHAT, "stream_options": {"include_usage": True, "usage": True}},
            "Unrecognized request argument supplied: stream_options.usage",
        ),
        (
            "/v1/chat/completions",
            {**_CHAT, "messages": [{"role": "tool", "content": "42"}]},
            "Missing required parameter: 'messages.0.tool_call_id'",
        ),
        (
            "/v1/chat/completions",
            {**_CHAT, "response_format": {"type": "json_schema", "schema": {}}},
            "response_format",
        ),
        ("/v1/completions", {**_CHAT, "prompt": "x"}, "argument supplied: messages"),
        ("/v1/completions", {"model": "m", "prompt": "x", "top_p": "high"}, "'top_p'"),
    ],
)
async def test_the_fake_openai_refuses_what_the_sdk_types_refuse(
    fake_openai: FakeOpenAI, path: str, body: dict[str, Any], message: str
) -> None:
    async with httpx.AsyncClient(base_url=fake_openai.url or "") as client:
        response = await client.post(path, json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert message in error["message"] and error["type"] == "invalid_request_error"
    assert fake_openai.requests == [body]
    assert [(r.path, r.body) for r in fake_openai.refused] == [(path, body)]
    fake_openai.refused.clear()


# --- every body we can build is one the libraries' types take ----------------------------------


@settings(max_examples=150, deadline=None)
@given(
    messages=st.none() | message_lists,
    prompt=st.text(max_size=30),
    options=st.none() | option_sets,
)
def test_every_request_we_build_passes_the_library_types(
    messages: list[Message] | None, prompt: str, options: Options | None
) -> None:
    request = Generation(
        model="m",
        prompt=None if messages else prompt,
        messages=tuple(messages) if messages else None,
        options=options,
    )
    chat = request.messages is not None
    path, body = ollama_request(request)
    body = json.loads(json.dumps(body))  # as it travels
    assert path == ("/api/chat" if chat else "/api/generate")
    (_ollama_types.check_chat if chat else _ollama_types.check_generate)(body)
    path, body = openai_request(request)
    body = json.loads(json.dumps(body))
    assert path == ("/v1/chat/completions" if chat else "/v1/completions")
    (_openai_types.check_chat if chat else _openai_types.check_completion)(body)


# --- the counts a host reports -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "count"),
    [(0, 0), (17, 17), (2**53 - 1, 2**53 - 1), (2**53, None), (-1, None), (True, None)]
    + [("3", None), (3.0, None), (None, None)],
)
def test_a_token_count_is_a_bounded_non_negative_int(value: object, count: int | None) -> None:
    # Anything else would make a result the bus and node decoders refuse.
    assert token_count(value) == count


def test_usage_needs_both_counts() -> None:
    assert usage_of(3, 4) == Usage(prompt_tokens=3, completion_tokens=4)
    assert usage_of(3, None) is None and usage_of(-1, 4) is None


# --- what no well-behaved server says ----------------------------------------------------------


class Scripted(FakeModelServer):
    """Answers every request with ``status`` and exactly ``body`` (streamed line by line)."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__()
        self.status, self.body = status, body

    async def handle(self, request: Request) -> Response:
        if self.status != 200:
            return Response(self.status, self.body)

        async def lines() -> AsyncIterator[bytes]:
            for line in self.body.splitlines(keepends=True):
                yield line

        return Response(200, content_type="text/plain", stream=lines())


_DONE = b'{"done": true, "done_reason": "stop", "prompt_eval_count": 1, "eval_count": 1}\n'


@pytest.mark.parametrize("side", ["direct host", "node agent"])
@pytest.mark.parametrize(
    ("kind", "status", "body", "expected"),
    [
        ("ollama", 200, b'{"response": "a", "done": false}\nnot json\n', "malformed stream"),
        ("ollama", 200, b"[1, 2]\n", "malformed stream line"),
        ("ollama", 200, b'{"response": 5, "done": false}\n' + _DONE, "malformed output"),
        ("ollama", 200, b'{"response": "a", "done": false}\n', "ended before the final done"),
        (
            "ollama",  # no prompt_eval_count: the prompt came from Ollama's cache
            200,
            b'{"response": "", "done": true, "done_reason": "load", "eval_count": 3}\n',
            Finish(usage=Usage(prompt_tokens=0, completion_tokens=3), finish_reason="stop"),
        ),
        (
            "ollama",  # a count no decoder would take: no usage rather than a broken result
            200,
            b'{"done": true, "done_reason": "length", "prompt_eval_count": 1, "eval_count": -3}',
            Finish(usage=None, finish_reason="length"),
        ),
        ("ollama", 500, b"x" * 1_000_000, "ollama: HTTP 500: xxx"),
        # Nested too deep for json.loads (RecursionError): malformed, not a crash.
        ("ollama", 200, b"[" * 100_000 + b"\n", "malformed stream line '[[["),
        ("ollama", 500, b"[" * 100_000, "ollama: HTTP 500: [[["),
        ("openai", 200, b'data: {"choices": [\n\n', "malformed event"),
        ("openai", 200, b"data: [1]\n\n", "malformed event"),
        ("openai", 200, b'data: {"choices": [{"index": 0, "text": "a"}]}\n\n', "before [DONE]"),
        (
            "openai",  # the reason said, [DONE] left out: a whole answer all the same
            200,
            b'data: {"choices": [{"index": 0, "text": "", "finish_reason": "tool_calls"}]}\n\n',
            Finish(usage=None, finish_reason="stop"),
        ),
        (
            "openai",
            200,
            (
                b'data: {"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 1}}\n\n'
                b"data: [DONE]\n\n"
            ),
            Finish(usage=Usage(prompt_tokens=2, completion_tokens=1), finish_reason=None),
        ),
        ("openai", 502, b'{"error": {"message": "' + b"y" * 100_000 + b'"}}', "HTTP 502"),
        ("openai", 200, b"data: " + b"[" * 100_000 + b"\n\n", "malformed event '[[["),
    ],
)
async def test_what_a_host_garbles_is_a_short_host_error_or_read_with_care(
    nursery: trio.Nursery, side: str, kind: str, status: int, body: bytes, expected: str | Finish
) -> None:
    url = await nursery.start(Scripted(status, body).run)
    request = Generation(model="m", prompt="p")
    if isinstance(expected, Finish):
        out = await _answer(side, kind, url, request)
        assert [d for d in out if isinstance(d, Finish)] == [expected]
        return
    with pytest.raises(HostError, match=re.escape(expected)) as raised:
        await _answer(side, kind, url, request)
    assert len(str(raised.value)) <= 200


async def _answer(side: str, kind: str, url: str, request: Generation) -> list[str | Finish]:
    # The readers are shared (protocol/model_servers/); the httpx stream around them is the
    # coordinator's own for its direct hosts and the agent's own in its backends: both checked.
    if side == "node agent":
        backend = OllamaBackend(url) if kind == "ollama" else OpenAIBackend(url, api_key="")
        return await run(backend, request)
    call = (ollama_call if kind == "ollama" else openai_call)(request)
    async with httpx.AsyncClient() as client, aclosing(stream_call(client, url, call)) as deltas:
        return [delta async for delta in deltas]
