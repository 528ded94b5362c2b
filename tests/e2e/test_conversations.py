"""Conversations, sampling options and usage through both HTTP APIs, against a real
coordinator and a real echo node agent (protocol v2) over real sockets, driven with the real
``openai`` SDK where the route is OpenAI's: the options reach the node and bound the answer,
usage and finish reasons come back, the text completion and model routes answer, and bad
input is a clear 4xx in each route's own error shape that the node never sees (its stats
file lists everything it was asked)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.fixtures.processes import Processes

pytestmark = pytest.mark.e2e

CONVERSATION = [
    {"role": "system", "content": "You repeat things."},
    {"role": "user", "content": "one two"},
    {"role": "assistant", "content": "one two"},
    {"role": "user", "content": "three four five"},
]
# The echo node answers a conversation with its transcript.
TRANSCRIPT = (
    "system: You repeat things.\nuser: one two\nassistant: one two\n"
    "user: three four five\nassistant:"
)
INPUT_WORDS = 10  # words of the four contents
ANSWER_WORDS = 15  # words of TRANSCRIPT


class Single:
    def __init__(self, procs: Processes, url: str, stats: Path) -> None:
        self.procs, self.url, self.stats = procs, url, stats
        self.key = procs.create_key()
        self.auth = {"Authorization": f"Bearer {self.key}"}

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(api_key=self.key, base_url=self.url + "/v1", max_retries=0)

    def asked(self) -> list[str]:
        """What the node was handed, in order (the first characters of each input)."""
        if not self.stats.exists():
            return []
        return list(json.loads(self.stats.read_text())["prompts"])


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Single]:
    tmp = Path(tmp_path_factory.mktemp("conversations"))
    procs = Processes(tmp)
    try:
        coord = procs.coordinator()
        procs.env["GEMMANET_NODE_STATS_FILE"] = str(tmp / "node-stats.json")
        procs.node(coord, "echo-1", models=("echo",))
        del procs.env["GEMMANET_NODE_STATS_FILE"]
        yield Single(procs, coord.url, tmp / "node-stats.json")
    finally:
        procs.stop_all()


# --- the OpenAI-compatible API, with the real SDK ---------------------------------------------


def test_a_chat_reaches_the_node_as_a_conversation_and_reports_usage(single: Single) -> None:
    completion = single.client().chat.completions.create(
        model="echo",
        messages=CONVERSATION,  # type: ignore[arg-type]
        temperature=0.2,
        seed=3,
        max_tokens=100,
    )
    [choice] = completion.choices
    assert choice.message.content == TRANSCRIPT and choice.finish_reason == "stop"
    usage = completion.usage
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens) == (INPUT_WORDS, ANSWER_WORDS)
    assert usage.total_tokens == INPUT_WORDS + ANSWER_WORDS


def test_the_token_bound_ends_the_answer_with_length(single: Single) -> None:
    completion = single.client().chat.completions.create(
        model="echo",
        messages=CONVERSATION,  # type: ignore[arg-type]
        max_completion_tokens=3,
    )
    [choice] = completion.choices
    assert choice.message.content == "system: You repeat"
    assert choice.finish_reason == "length"
    assert completion.usage is not None and completion.usage.completion_tokens == 3


def test_a_stop_string_cuts_the_answer(single: Single) -> None:
    completion = single.client().chat.completions.create(
        model="echo",
        messages=CONVERSATION,  # type: ignore[arg-type]
        stop="\nassistant",
    )
    assert completion.choices[0].message.content == "system: You repeat things.\nuser: one two"
    assert completion.choices[0].finish_reason == "stop"


def test_a_stream_with_include_usage_ends_with_a_usage_chunk(single: Single) -> None:
    chunks = list(
        single.client().chat.completions.create(
            model="echo",
            messages=CONVERSATION,  # type: ignore[arg-type]
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    *content, finish, last = chunks
    assert (
        "".join(c.choices[0].delta.content or "" for c in content) == "system: You repeat things."
    )
    assert finish.choices[0].finish_reason == "length"
    # OpenAI's convention: null usage on every chunk, then one with no choices and the usage.
    assert all(c.usage is None for c in [*content, finish])
    assert last.choices == [] and last.usage is not None
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (INPUT_WORDS, 4)


def test_a_stream_without_include_usage_has_no_usage_chunk(single: Single) -> None:
    chunks = list(
        single.client().chat.completions.create(
            model="echo",
            messages=CONVERSATION,  # type: ignore[arg-type]
            stream=True,
        )
    )
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert all(c.usage is None and c.choices for c in chunks)


def test_a_text_completion_sends_the_raw_prompt(single: Single) -> None:
    client = single.client()
    completion = client.completions.create(model="echo", prompt="a b c d", max_tokens=2)
    assert completion.object == "text_completion" and completion.id.startswith("cmpl-t-")
    [choice] = completion.choices
    assert (choice.text, choice.finish_reason) == ("a b", "length")
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (4, 2)
    stream = client.completions.create(
        model="echo", prompt="a b c", stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == "a b c"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3


def test_a_model_is_retrieved_by_id(single: Single) -> None:
    client = single.client()
    assert client.models.retrieve("echo").id == "echo"
    with pytest.raises(openai.NotFoundError) as caught:
        client.models.retrieve("no-such-model")
    assert caught.value.code == "model_not_found"


def test_a_rating_takes_the_completion_id(single: Single) -> None:
    completion = single.client().chat.completions.create(
        model="echo",
        messages=CONVERSATION,  # type: ignore[arg-type]
    )
    rated = httpx.post(
        f"{single.url}/api/v1/tasks/{completion.id}/rating",
        json={"score": 4},
        headers=single.auth,
    )
    assert rated.status_code == 200, rated.text
    again = httpx.post(
        f"{single.url}/api/v1/tasks/{completion.id}/rating",
        json={"score": 4},
        headers=single.auth,
    )
    assert again.status_code == 409


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"n": 2}, "n"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ({"logprobs": True}, "logprobs"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"logit_bias": {"50256": -100}}, "logit_bias"),
    ],
    ids=lambda v: next(iter(v)) if isinstance(v, dict) else "",
)
def test_a_parameter_no_node_can_honour_is_a_400_naming_it(
    single: Single, extra: dict[str, object], param: str
) -> None:
    before = len(single.asked())
    with pytest.raises(openai.BadRequestError) as caught:
        single.client().chat.completions.create(
            model="echo",
            messages=CONVERSATION,  # type: ignore[arg-type]
            extra_body=extra,
        )
    error = caught.value
    assert error.code == "unsupported_parameter" and error.param == param, error.body
    assert param in error.message
    assert len(single.asked()) == before


# --- bad input: a clear 4xx in each route's shape, and the node never sees it -----------------

BIG = "x" * (2 * 1024 * 1024)
BAD_INPUTS = [
    ("a thousand messages", {"messages": [{"role": "user", "content": "hi"}] * 1000}, 422),
    ("a 2 MiB message", {"messages": [{"role": "user", "content": BIG}]}, 413),
    ("a negative max_tokens", {"max_tokens": -1}, 422),
    ("an unknown role", {"messages": [{"role": "wizard", "content": "x"}]}, 422),
    ("fifty stop strings", {"stop": [f"s{i}" for i in range(50)]}, 422),
    ("a temperature of 3", {"temperature": 3}, 422),
]


@pytest.mark.parametrize(("what", "fields", "status"), BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_is_refused_before_any_node_sees_it(
    single: Single, what: str, fields: dict[str, object], status: int
) -> None:
    before = len(single.asked())
    # The native API: options in their own object, the native error shape.
    options = {k: v for k, v in fields.items() if k != "messages"}
    native = {"model": "echo", "messages": fields.get("messages", CONVERSATION)}
    if options:
        native["options"] = options
    r = httpx.post(f"{single.url}/api/v1/request", json=native, headers=single.auth, timeout=30)
    assert r.status_code == status, (what, r.text[:300])
    assert list(r.json()) == ["error"] and r.json()["error"]["message"], r.text[:300]
    # The OpenAI-compatible API: the parameters at the top, OpenAI's error shape.
    openai_body = {"model": "echo", "messages": CONVERSATION, **fields}
    r = httpx.post(
        f"{single.url}/v1/chat/completions", json=openai_body, headers=single.auth, timeout=30
    )
    assert r.status_code == status, (what, r.text[:300])
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    # Nothing reached the node; a good request does, which shows the stats file is live.
    assert len(single.asked()) == before, what
    r = httpx.post(
        f"{single.url}/api/v1/request",
        json={"model": "echo", "prompt": "fine"},
        headers=single.auth,
        timeout=30,
    )
    assert r.status_code == 200, r.text
    assert single.asked()[before:] == ["fine"]
