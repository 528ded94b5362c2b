"""The model servers' wire formats without a socket (protocol/model_servers/): a call says what
to post, and its reader turns the lines the caller received into deltas and one Finish. What a
real server answers over HTTP, through both callers' httpx streams, is
tests/coordinator/test_host_wire.py."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator, Iterable
from contextlib import aclosing
from pathlib import Path

import pytest

from protocol import Message, Usage
from protocol.model_servers import (
    MAX_ERROR_BODY_BYTES,
    Finish,
    Generation,
    HostError,
    ServerCall,
    bounded_body,
    ollama_call,
    openai_call,
    status_error,
)

ROOT = Path(__file__).resolve().parents[2]
CHAT = Generation(model="m", messages=(Message(role="user", content="hi"),))


async def _lines(lines: Iterable[str]) -> AsyncIterator[str]:
    for line in lines:
        yield line


async def _read(call: ServerCall, lines: Iterable[str]) -> list[str | Finish]:
    async with aclosing(call.read(_lines(lines))) as items:
        return [item async for item in items]


async def test_an_ollama_chat_is_read_to_its_done_record() -> None:
    call = ollama_call(CHAT)
    assert (call.server, call.path, call.body["stream"]) == ("ollama", "/api/chat", True)
    lines = [
        '{"message": {"role": "assistant", "content": "he"}, "done": false}',
        "",
        '{"message": {"role": "assistant", "content": "llo"}, "done": false}',
        '{"done": true, "done_reason": "length", "prompt_eval_count": 2, "eval_count": 2}',
        '{"never": "read"}',
    ]
    usage = Usage(prompt_tokens=2, completion_tokens=2)
    assert await _read(call, lines) == ["he", "llo", Finish(usage=usage, finish_reason="length")]


async def test_an_openai_completion_is_read_to_done_with_its_usage_chunk() -> None:
    call = openai_call(Generation(model="m", prompt="p"))
    assert (call.path, dict(call.headers)) == ("/v1/completions", {"Accept": "text/event-stream"})
    lines = [
        ": keep-alive",
        'data: {"choices": [{"index": 0, "text": "a"}]}',
        'data: {"choices": [{"index": 1, "text": "other choice"}]}',
        'data: {"choices": [{"index": 0, "text": "b", "finish_reason": "stop"}]}',
        'data: {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 2}}',
        "data: [DONE]",
    ]
    usage = Usage(prompt_tokens=1, completion_tokens=2)
    assert await _read(call, lines) == ["a", "b", Finish(usage=usage, finish_reason="stop")]


@pytest.mark.parametrize(
    ("call", "lines", "message"),
    [
        (ollama_call(CHAT), ['{"error": "model not found"}'], "ollama: model not found"),
        (ollama_call(CHAT), ['{"message": {"content": "a"}, "done": false}'], "done record"),
        (openai_call(CHAT), ['data: {"error": {"message": "overloaded"}}'], "overloaded"),
        (openai_call(CHAT), ['data: {"choices": []}'], "before [DONE]"),
    ],
)
async def test_a_stream_that_says_no_or_stops_short_is_a_host_error(
    call: ServerCall, lines: list[str], message: str
) -> None:
    with pytest.raises(HostError, match=message.replace("[", r"\[")):
        await _read(call, lines)


async def test_an_error_body_is_read_no_further_than_its_bound() -> None:
    read: list[bytes] = []

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(100):
            read.append(b"x" * 1000)
            yield read[-1]

    assert len(await bounded_body(chunks())) == MAX_ERROR_BODY_BYTES
    assert len(read) == 5  # the 4 KiB were there after five chunks
    error = status_error("openai", 429, json.dumps({"error": {"message": "slow down"}}).encode())
    assert str(error) == "openai: HTTP 429: slow down"
    assert str(status_error("ollama", 502, b"")) == "ollama: HTTP 502"


def test_the_shared_parts_load_no_http_client_and_no_event_loop() -> None:
    probe = (
        "import json, sys, protocol.model_servers, protocol.log_lines\n"
        "print(json.dumps(sorted({m.partition('.')[0] for m in sys.modules})))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    loaded = set(json.loads(done.stdout))
    assert not loaded & {"httpx", "trio", "asyncio", "coordinator", "tools"}, loaded
