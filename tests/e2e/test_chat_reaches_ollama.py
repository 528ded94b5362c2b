"""A chat as a user would send it, all the way to the model server and back: the real
``openai`` SDK asks instance B; the node that serves the model is a real node agent on
instance A (over a real Redis) whose backend is a fake Ollama process. What the fake received is
asserted at the fake: the three-turn conversation on ``/api/chat`` with the same messages in
order, and the sampling parameters under Ollama's names. The usage the client reads is the
fake's own count, and the token bound ends the answer with ``length``."""

from __future__ import annotations

import os

import openai
import pytest

from tests.e2e.test_backends_e2e import fake_requests, start_fake
from tests.fixtures.processes import Processes, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.redis]

MODEL = "llama3"
CONVERSATION = [
    {"role": "system", "content": "You answer in few words."},
    {"role": "user", "content": "Name a colour."},
    {"role": "assistant", "content": "Blue."},
    {"role": "user", "content": "Now name five more colours please"},
]
# The fake Ollama answers a chat with the last user message, counting words as tokens.
LAST = CONVERSATION[-1]["content"]
PROMPT_WORDS = sum(len(m["content"].split()) for m in CONVERSATION)


def test_a_three_turn_chat_reaches_ollama_as_a_conversation_with_its_options(
    procs: Processes, redis_server: object
) -> None:
    a, b = procs.share_redis(redis_server, f"chat{os.getpid()}").two_instances()
    fake = start_fake(procs, "ollama", "--port", "0", "--model", MODEL)
    extra = ("--backend", "ollama", "--backend-url", fake)
    procs.node(a, "ollama-on-a", models=(MODEL,), extra=extra)
    wait_until(lambda: b.has_node("ollama-on-a"), "B sees the node of A")
    client = openai.OpenAI(api_key=procs.create_key(), base_url=b.url + "/v1", max_retries=0)

    bounded = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=CONVERSATION,  # type: ignore[arg-type]
        max_tokens=3,
        temperature=0.4,
        stop=["\n\n", "END"],
        seed=11,
    )
    assert bounded.headers["X-GemmaNet-Node-Id"] == "ollama-on-a"
    completion = bounded.parse()
    [choice] = completion.choices
    assert choice.message.content == "Now name five"
    assert choice.finish_reason == "length"
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (
        PROMPT_WORDS,
        3,
    )

    # At the fake: one request, on the chat route, the messages as sent, the options mapped.
    [received] = fake_requests(fake)
    assert received["refused"] is None, received
    assert received["path"] == "/api/chat"
    body = received["body"]
    assert body["model"] == MODEL and body["stream"] is True
    assert body["messages"] == CONVERSATION
    assert body["options"] == {
        "num_predict": 3,
        "temperature": 0.4,
        "stop": ["\n\n", "END"],
        "seed": 11,
    }

    # Unbounded, streamed, with the usage chunk: the whole answer and the fake's counts.
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=CONVERSATION,  # type: ignore[arg-type]
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == LAST
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    usage = chunks[-1].usage
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens) == (PROMPT_WORDS, len(LAST.split()))
    assert [r["path"] for r in fake_requests(fake)] == ["/api/chat", "/api/chat"]
