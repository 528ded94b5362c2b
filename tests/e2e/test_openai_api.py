"""The OpenAI-compatible API, driven by the real ``openai`` SDK against real coordinator
processes and real node agents (echo backend), over real sockets: a completion, a stream, the
model list, a 401, a 429 and malformed bodies on one instance; a request on instance A for a node
on instance B over a real Redis."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fixtures.processes import Coordinator, Processes, wait_until

pytestmark = pytest.mark.e2e

RATE = 3  # requests per minute per key on the single instance; the 429 test spends it
MESSAGES = [
    {"role": "system", "content": "You repeat things."},
    {"role": "user", "content": [{"type": "text", "text": "say"}, {"type": "text", "text": "it"}]},
]
# The echo node answers a conversation with its transcript (protocol.transcript).
PROMPT = "system: You repeat things.\nuser: say\nit\nassistant:"


class Single:
    def __init__(self, procs: Processes, coord: Coordinator) -> None:
        self.procs, self.coord = procs, coord

    def client(self, key: str | None = None) -> openai.OpenAI:
        # No retries: a 429 must reach the test, not be retried away by the SDK.
        return openai.OpenAI(
            api_key=key or self.procs.create_key(), base_url=self.coord.url + "/v1", max_retries=0
        )


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Single]:
    procs = Processes(Path(tmp_path_factory.mktemp("openai")))
    try:
        coord = procs.coordinator(GEMMANET_RATE_LIMIT=f"{RATE}/minute")
        procs.node(coord, "echo-1", models=("echo", "echo-2"))
        yield Single(procs, coord)
    finally:
        procs.stop_all()


def openai_error(response: httpx.Response) -> dict[str, object]:
    """The error of a /v1 response, checked to have exactly OpenAI's shape."""
    assert response.headers["content-type"].startswith("application/json"), response.text
    body = response.json()
    assert list(body) == ["error"], body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"], error
    assert error["param"] is None or isinstance(error["param"], str), error
    assert isinstance(error["code"], str), error
    return error  # type: ignore[no-any-return]


def test_completion_is_the_node_answer_to_the_documented_prompt(single: Single) -> None:
    key = single.procs.create_key()
    completion = single.client(key).chat.completions.create(
        model="echo",
        messages=MESSAGES,  # type: ignore[arg-type]
        temperature=0.3,
        max_tokens=50,
    )
    assert completion.object == "chat.completion" and completion.model == "echo"
    [choice] = completion.choices
    assert choice.message.role == "assistant" and choice.message.content == PROMPT
    assert choice.finish_reason == "stop"
    # The echo node counts words: of the message contents, and of its answer.
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (5, 8)
    assert completion.usage.total_tokens == 13
    # The id carries the task id, which rates the answer through the native API.
    assert completion.id.startswith("chatcmpl-t-")
    task_id = completion.id.removeprefix("chatcmpl-")
    rating = single.coord.http.post(
        f"/api/v1/tasks/{task_id}/rating",
        json={"score": 4},
        headers={"Authorization": f"Bearer {key}"},
    )
    assert rating.status_code == 200, rating.text


def test_stream_deltas_join_to_the_node_output(single: Single) -> None:
    key = single.procs.create_key()
    stream = single.client(key).chat.completions.create(
        model="echo",
        messages=MESSAGES,  # type: ignore[arg-type]
        stream=True,
    )
    chunks = list(stream)
    assert {c.object for c in chunks} == {"chat.completion.chunk"}
    assert len({c.id for c in chunks}) == 1 and chunks[0].id.startswith("chatcmpl-t-")
    assert chunks[0].choices[0].delta.role == "assistant"
    deltas = [c.choices[0].delta.content for c in chunks[1:-1]]
    # The echo node streams word by word: several deltas, which join to its whole output.
    assert len(deltas) >= 4 and "".join(d or "" for d in deltas) == PROMPT
    assert [c.choices[0].finish_reason for c in chunks] == [None] * (len(chunks) - 1) + ["stop"]
    # On the wire the stream ends with OpenAI's sentinel (the SDK stops at it silently).
    raw = single.coord.http.post(
        "/v1/chat/completions",
        json={"model": "echo", "messages": MESSAGES, "stream": True},
        headers={"Authorization": f"Bearer {key}"},
    )
    assert raw.headers["content-type"].startswith("text/event-stream")
    assert raw.text.endswith("data: [DONE]\n\n") and raw.text.count("[DONE]") == 1


def test_model_list_names_every_served_model(single: Single) -> None:
    models = list(single.client().models.list())
    assert [m.id for m in models] == ["echo", "echo-2"]
    assert {(m.object, m.owned_by) for m in models} == {("model", "gemmanet")}
    assert all(m.created > 1_700_000_000 for m in models)


def test_bad_key_is_authentication_error(single: Single) -> None:
    with pytest.raises(openai.AuthenticationError) as caught:
        single.client("gn_not_a_key").chat.completions.create(model="echo", messages=MESSAGES)  # type: ignore[arg-type]
    assert caught.value.status_code == 401 and caught.value.code == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        single.client("gn_not_a_key").models.list()
    error = openai_error(single.coord.http.get("/v1/models"))
    assert error["type"] == "authentication_error"


def test_rate_limit_is_rate_limit_error(single: Single) -> None:
    client = single.client()
    for _ in range(RATE):
        client.chat.completions.create(model="echo", messages=MESSAGES)  # type: ignore[arg-type]
    with pytest.raises(openai.RateLimitError) as caught:
        client.chat.completions.create(model="echo", messages=MESSAGES)  # type: ignore[arg-type]
    assert caught.value.code == "rate_limited"
    assert int(caught.value.response.headers["Retry-After"]) >= 1


def test_unknown_model_is_not_found(single: Single) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        single.client().chat.completions.create(model="nobody-serves-this", messages=MESSAGES)  # type: ignore[arg-type]
    assert caught.value.code == "model_not_found"


MALFORMED = [
    (b"", 400, "malformed_json"),
    (b'{"model": "echo", "messages": [', 400, "malformed_json"),
    # Nested deeper than msgspec follows, in a field it would ignore.
    (b'{"extra": ' + b"[" * 5000 + b"]" * 5000 + b"}", 400, "malformed_json"),
    (b'["model", "echo"]', 422, "invalid_request"),
    (b'{"messages": [{"role": "user", "content": "x"}]}', 422, "invalid_request"),
    (b'{"model": "echo"}', 422, "invalid_request"),
    (b'{"model": "echo", "messages": []}', 422, "invalid_request"),
    (b'{"model": "echo", "messages": "hi"}', 422, "invalid_request"),
    (b'{"model": "echo", "messages": [{"content": "no role"}]}', 422, "invalid_request"),
    (b'{"model": "echo", "messages": [{"role": "wizard", "content": "x"}]}', 422, "invalid_request"),
    (b'{"model": "echo", "messages": [{"role": "user", "content": 7}]}', 422, "invalid_request"),
    (b'{"model": "echo", "messages": [{"role": "user", "content": [7]}]}', 422, "invalid_request"),
    (b'{"model": "echo", "messages": [{"role": "user", "content": "x"}], "stream": "y"}', 422,
     "invalid_request"),
    (b'{"model": "", "messages": [{"role": "user", "content": "x"}]}', 422, "invalid_request"),
    ((b'{"model": "echo", "messages": [{"role": "user", "content": [{"type": "image_url", '
      b'"image_url": {"url": "http://x/y.png"}}]}]}'), 400, "unsupported_content"),
    (b'{"model": "echo", "messages": [{"role": "user", "content": [{"type": "text"}]}]}', 400,
     "unsupported_content"),
]  # fmt: skip


def test_malformed_bodies_are_400_or_422_in_openai_shape(single: Single) -> None:
    for body, status, code in MALFORMED:
        # A fresh key each: the rate limit is spent before the body is read, as natively.
        auth = {"Authorization": f"Bearer {single.procs.create_key()}"}
        r = single.coord.http.post("/v1/chat/completions", content=body, headers=auth)
        assert r.status_code == status, (body[:80], r.status_code, r.text[:300])
        assert openai_error(r)["code"] == code, (body[:80], r.text[:300])


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)


def mostly(valid: st.SearchStrategy[object]) -> st.SearchStrategy[object]:
    """``valid`` nine times in ten, any JSON value otherwise: the fuzz gets past the decoder
    into the prompt building and the request path, and still tries wrong types everywhere."""
    return st.integers(0, 9).flatmap(lambda i: JSON if i == 0 else valid)


PART = st.fixed_dictionaries(
    {"type": mostly(st.sampled_from(["text", "image_url"]))},
    optional={"text": mostly(st.text(max_size=8) | st.none())},
)
PARTS = st.lists(PART, min_size=1, max_size=2)
MESSAGE = st.fixed_dictionaries(
    {"role": mostly(st.sampled_from(["user", "system", "assistant"]))},
    # Lists of parts half the time: that is where building the prompt can go wrong.
    optional={"content": mostly(PARTS | PARTS | st.text(max_size=8) | st.none())},
)
BODY = st.fixed_dictionaries(
    {
        "model": mostly(st.sampled_from(["echo", "nobody"])),
        "messages": mostly(st.lists(MESSAGE, min_size=1, max_size=3)),
    },
    optional={"stream": mostly(st.booleans()), "temperature": JSON},
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(BODY)
def test_no_body_makes_a_500(single: Single, body: dict[str, object]) -> None:
    auth = {"Authorization": f"Bearer {single.procs.create_key()}"}
    r = single.coord.http.post("/v1/chat/completions", content=json.dumps(body), headers=auth)
    assert r.status_code in (200, 400, 404, 422), (body, r.status_code, r.text[:300])
    if r.status_code != 200:
        openai_error(r)


@pytest.mark.redis
def test_request_on_a_runs_on_the_node_of_b(procs: Processes, redis_server: object) -> None:
    a, b = procs.share_redis(redis_server, f"oai{os.getpid()}").two_instances()
    procs.node(b, "on-b", models=("echo-b",))
    wait_until(lambda: a.has_node("on-b"), "A sees the node of B")
    client = openai.OpenAI(api_key=procs.create_key(), base_url=a.url + "/v1", max_retries=0)
    assert [m.id for m in client.models.list()] == ["echo-b"]
    response = client.chat.completions.with_raw_response.create(
        model="echo-b",
        messages=MESSAGES,  # type: ignore[arg-type]
    )
    assert response.headers["X-GemmaNet-Node-Id"] == "on-b"
    assert response.parse().choices[0].message.content == PROMPT
    stream = client.chat.completions.create(model="echo-b", messages=MESSAGES, stream=True)  # type: ignore[arg-type]
    assert "".join(c.choices[0].delta.content or "" for c in stream) == PROMPT
