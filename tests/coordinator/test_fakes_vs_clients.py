"""The fake model servers against the real client libraries: the ``ollama`` library and the
``openai`` SDK send their own requests (the fakes must take them: the fixtures fail a test
whose fake refused one) and read the answers with their own response types, streamed and
whole, usage and finish reason included. So the fakes speak what the real servers speak."""

from __future__ import annotations

from typing import Any

import ollama
import openai
import trio

from tools.fakes.ollama import FakeOllama
from tools.fakes.openai import FakeOpenAI

TURNS: list[Any] = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "one two three"},
]


async def test_the_ollama_library_reads_the_fake(fake_ollama: FakeOllama) -> None:
    def talk() -> tuple[list[ollama.ChatResponse], ollama.GenerateResponse]:
        client = ollama.Client(host=fake_ollama.url)
        parts = list(
            client.chat(model="m", messages=TURNS, stream=True, options={"num_predict": 2})
        )
        whole = client.generate(model="m", prompt="four five six", options={"stop": ["six"]})
        return parts, whole

    parts, whole = await trio.to_thread.run_sync(talk)
    assert "".join(p.message.content or "" for p in parts) == "one two"
    last = parts[-1]
    assert last.done and last.done_reason == "length"
    assert (last.prompt_eval_count, last.eval_count) == (5, 2)
    assert whole.response == "four five " and whole.done_reason == "stop"
    assert fake_ollama.paths == ["/api/chat", "/api/generate"]


async def test_the_openai_sdk_reads_the_fake(fake_openai: FakeOpenAI) -> None:
    def talk() -> tuple[list[Any], Any, list[Any]]:
        client = openai.OpenAI(base_url=f"{fake_openai.url}/v1", api_key="none", max_retries=0)
        chunks = list(
            client.chat.completions.create(
                model="m",
                messages=TURNS,
                stream=True,
                stream_options={"include_usage": True},
                max_tokens=2,
                extra_body={"top_k": 3},
            )
        )
        whole = client.chat.completions.create(model="m", messages=TURNS)
        text = list(
            client.completions.create(
                model="m",
                prompt="four five six",
                stream=True,
                stream_options={"include_usage": True},
                stop=["six"],
            )
        )
        return chunks, whole, text

    chunks, whole, text = await trio.to_thread.run_sync(talk)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "one two"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 2
    assert chunks[-1].usage.prompt_tokens == 5
    assert whole.choices[0].message.content == "one two three"
    assert whole.choices[0].finish_reason == "stop" and whole.usage.total_tokens == 8
    assert "".join(c.choices[0].text for c in text if c.choices) == "four five "
    assert text[-1].usage.completion_tokens == 2
    assert fake_openai.paths == ["/v1/chat/completions"] * 2 + ["/v1/completions"]
    assert fake_openai.requests[0]["top_k"] == 3
