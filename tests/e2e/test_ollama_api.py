"""The Ollama-compatible API, driven by the real ``ollama`` library against real coordinator
processes and a real node agent (echo backend), over real sockets: chat and generate, streamed
and not, the options reaching the node, the echo's word counts as the usage, the model lists,
the version, and bad input, bad keys, unknown models and the rate limit as Ollama's errors.
The library parses every answer into its own response models (a field of the wrong type fails
there); ``strict`` also fails a field those models do not know (a misspelt name is ignored by
the library, silently). A hand-driven node (``raw_node``, protocol v1) fails in the middle of a
stream and reports no usage."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import ollama
import pydantic
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coordinator import __version__
from coordinator.settings import Settings
from protocol import Assign, Chunk, Error, Result
from tests.fixtures.processes import Coordinator, Processes, wait_until
from tests.fixtures.raw_node import raw_node

pytestmark = pytest.mark.e2e

RATE = 3  # requests per minute per key; the 429 test spends it on its own key
MESSAGES = [
    {"role": "system", "content": "You repeat things."},
    {"role": "user", "content": "say it"},
]
# The echo node answers a conversation with its transcript, counting words as tokens: the
# prompt's are the contents' words, the answer's the transcript's.
TRANSCRIPT = "system: You repeat things.\nuser: say it\nassistant:"
PROMPT_WORDS, ANSWER_WORDS = 5, 8
FAILED = "node raw-1 failed the task (backend_error): boom"


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


class Single:
    def __init__(self, procs: Processes, coord: Coordinator) -> None:
        self.procs, self.coord = procs, coord

    # A fresh key per call unless told: the rate limit (RATE a minute) is per key.
    def client(self, key: str | None = None) -> ollama.Client:
        headers = auth(key or self.procs.create_key())
        return ollama.Client(host=self.coord.url, headers=headers, timeout=30)

    def post(self, path: str, body: object, key: str | None = None) -> httpx.Response:
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        return self.coord.http.post(
            path, content=content, headers=auth(key or self.procs.create_key())
        )


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Single]:
    procs = Processes(Path(tmp_path_factory.mktemp("ollama")))
    try:
        coord = procs.coordinator(GEMMANET_RATE_LIMIT=f"{RATE}/minute")
        procs.node(coord, "echo-1", models=("echo", "echo-2"))
        yield Single(procs, coord)
    finally:
        procs.stop_all()


def strict(model: type[pydantic.BaseModel], record: dict[str, Any]) -> pydantic.BaseModel:
    """``record`` parsed by the library's model, with no field the model does not know."""
    assert set(record) <= set(model.model_fields), set(record) - set(model.model_fields)
    return model.model_validate(record)


def ndjson(response: httpx.Response) -> list[dict[str, Any]]:
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/x-ndjson")
    assert response.text.endswith("\n")
    return [json.loads(line) for line in response.text.splitlines()]


def ollama_error(response: httpx.Response) -> str:
    """The error of a response, checked to have exactly Ollama's shape."""
    assert response.headers["content-type"].startswith("application/json"), response.text
    body = response.json()
    assert list(body) == ["error"] and isinstance(body["error"], str), body
    assert body["error"], body
    return body["error"]


def test_chat_answer_is_the_node_output_with_its_counts(single: Single) -> None:
    answer = single.client().chat(model="echo", messages=MESSAGES)
    assert isinstance(answer, ollama.ChatResponse)
    assert answer.model == "echo" and answer.done is True and answer.done_reason == "stop"
    assert answer.message.role == "assistant" and answer.message.content == TRANSCRIPT
    assert (answer.prompt_eval_count, answer.eval_count) == (PROMPT_WORDS, ANSWER_WORDS)
    assert answer.total_duration and answer.total_duration > 0
    assert answer.load_duration == 0
    assert answer.prompt_eval_duration is not None and answer.eval_duration is not None
    # The coordinator's total holds the node's times, measured inside it.
    assert answer.prompt_eval_duration + answer.eval_duration <= answer.total_duration
    assert answer.created_at and answer.created_at.endswith("Z")

    raw = single.post("/api/chat", {"model": "echo", "messages": MESSAGES, "stream": False})
    assert raw.headers["content-type"].startswith("application/json")
    assert raw.headers["X-GemmaNet-Task-Id"].startswith("t-")
    assert raw.headers["X-GemmaNet-Node-Id"] == "echo-1"
    strict(ollama.ChatResponse, raw.json())


def test_chat_stream_records_join_to_the_node_output(single: Single) -> None:
    parts = list(single.client().chat(model="echo", messages=MESSAGES, stream=True))
    assert all(isinstance(p, ollama.ChatResponse) for p in parts)
    # The echo node streams word by word: several records, then the done record.
    assert len(parts) >= 5
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    assert "".join(p.message.content or "" for p in parts) == TRANSCRIPT
    last = parts[-1]
    assert last.message.content == "" and last.done_reason == "stop"
    assert (last.prompt_eval_count, last.eval_count) == (PROMPT_WORDS, ANSWER_WORDS)
    assert all(p.done_reason is None and p.eval_count is None for p in parts[:-1])

    # "stream" left out streams, as Ollama's does.
    raw = single.post("/api/chat", {"model": "echo", "messages": MESSAGES})
    records = ndjson(raw)
    assert raw.headers["X-GemmaNet-Task-Id"].startswith("t-")
    for record in records:
        strict(ollama.ChatResponse, record)
    assert set(records[0]) == {"model", "created_at", "message", "done"}
    assert records[-1]["done"] is True and set(records[-1]) == {
        "model",
        "created_at",
        "message",
        "done",
        "done_reason",
        "total_duration",
        "load_duration",
        "prompt_eval_count",
        "prompt_eval_duration",
        "eval_count",
        "eval_duration",
    }


async def test_async_client_streams_too(single: Single) -> None:
    key = await trio.to_thread.run_sync(single.procs.create_key)
    client = ollama.AsyncClient(host=single.coord.url, headers=auth(key))
    stream = await client.chat(model="echo-2", messages=MESSAGES, stream=True)
    parts = [part async for part in stream]
    assert "".join(p.message.content or "" for p in parts) == TRANSCRIPT
    assert parts[-1].done and parts[-1].eval_count == ANSWER_WORDS


def test_generate_goes_through_the_chat_template_unless_raw(single: Single) -> None:
    plain = single.client().generate(model="echo", prompt="why is the sky blue")
    assert isinstance(plain, ollama.GenerateResponse)
    # The prompt is a user turn (the echo writes the template as its transcript).
    assert plain.response == "user: why is the sky blue\nassistant:"
    assert (plain.prompt_eval_count, plain.eval_count) == (5, 7)
    assert plain.done and plain.done_reason == "stop"

    system = single.client().generate(model="echo", prompt="say it", system="You repeat things.")
    assert system.response == TRANSCRIPT and system.prompt_eval_count == PROMPT_WORDS

    raw = single.client().generate(model="echo", prompt="as it is", raw=True)
    assert raw.response == "as it is" and raw.eval_count == 3

    parts = list(single.client().generate(model="echo", prompt="why is the sky blue", stream=True))
    assert len(parts) >= 3 and parts[-1].done and parts[-1].eval_count == 7
    assert "".join(p.response or "" for p in parts) == plain.response

    records = ndjson(single.post("/api/generate", {"model": "echo", "prompt": "a b"}))
    for record in records:
        strict(ollama.GenerateResponse, record)
    assert "message" not in records[0] and records[-1]["response"] == ""


def test_options_reach_the_node(single: Single) -> None:
    cut = single.client().chat(model="echo", messages=MESSAGES, options={"num_predict": 2})
    assert cut.message.content == "system: You" and cut.done_reason == "length"
    assert cut.eval_count == 2
    parts = list(
        single.client().generate(
            model="echo", prompt="one two three", options={"num_predict": 2}, stream=True
        )
    )
    assert parts[-1].done_reason == "length" and parts[-1].eval_count == 2
    assert "".join(p.response or "" for p in parts) == "user: one"

    stopped = single.client().chat(
        model="echo",
        messages=MESSAGES,
        options=ollama.Options(stop=["user:"], temperature=0.2, top_p=0.9, top_k=40, seed=7),
    )
    assert stopped.message.content == "system: You repeat things.\n"

    # -1 is Ollama's "no bound" (its default); unknown options and keep_alive are ignored.
    unbound = single.client().chat(
        model="echo",
        messages=MESSAGES,
        options={"num_predict": -1, "num_ctx": 4096, "repeat_penalty": 1.1, "mirostat": 0},
        keep_alive="5m",
    )
    assert unbound.message.content == TRANSCRIPT and unbound.done_reason == "stop"


def test_json_format_and_schemas_are_accepted(single: Single) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    for fmt in ("json", schema, ""):
        answer = single.client().chat(model="echo", messages=MESSAGES, format=fmt)
        assert answer.message.content == TRANSCRIPT
    # The library refuses another format itself; sent anyway, it is a 422 naming it.
    response = single.post("/api/generate", {"model": "echo", "prompt": "x", "format": "yaml"})
    assert response.status_code == 422 and "format" in ollama_error(response)


def test_a_load_request_answers_without_a_task(single: Single) -> None:
    loaded = single.client().chat(model="echo", messages=[])
    assert loaded.done and loaded.done_reason == "load" and loaded.message.content == ""
    generated = single.client().generate(model="echo-2")
    assert generated.done and generated.done_reason == "load" and generated.response == ""
    with pytest.raises(ollama.ResponseError) as caught:
        single.client().generate(model="nobody-serves-this")
    assert caught.value.status_code == 404


def test_tags_and_ps_list_every_served_model(single: Single) -> None:
    tags = single.client().list()
    assert [m.model for m in tags.models] == ["echo", "echo-2"]
    for model in tags.models:
        assert model.size == 0 and model.digest and model.digest.startswith("sha256:")
        assert model.modified_at is not None and model.modified_at.year >= 2024
        assert model.details is not None and model.details.family == ""
    raw = single.coord.http.get("/api/tags", headers=auth(single.procs.create_key()))
    for entry in raw.json()["models"]:
        strict(ollama.ListResponse.Model, {k: v for k, v in entry.items() if k != "name"})
        assert entry["name"] == entry["model"]

    running = single.client().ps()
    assert [m.model for m in running.models] == ["echo", "echo-2"]
    assert {(m.name, m.size, m.size_vram) for m in running.models} == {
        ("echo", 0, 0),
        ("echo-2", 0, 0),
    }
    for entry in single.coord.http.get("/api/ps", headers=auth(single.procs.create_key())).json()[
        "models"
    ]:
        strict(ollama.ProcessResponse.Model, entry)


def test_version_needs_no_key(single: Single) -> None:
    response = single.coord.http.get("/api/version")
    assert response.status_code == 200 and response.json() == {"version": __version__}


def test_bad_key_is_401(single: Single) -> None:
    bad = single.client("gn_not_a_key")
    for call in (
        lambda: bad.chat(model="echo", messages=MESSAGES),
        lambda: list(bad.generate(model="echo", prompt="x", stream=True)),
        bad.list,
        bad.ps,
    ):
        with pytest.raises(ollama.ResponseError) as caught:
            call()
        assert caught.value.status_code == 401 and "API key" in caught.value.error
    missing = single.coord.http.get("/api/tags")
    assert missing.status_code == 401 and missing.headers["WWW-Authenticate"] == "Bearer"
    ollama_error(missing)


def test_unknown_model_is_not_found(single: Single) -> None:
    with pytest.raises(ollama.ResponseError) as caught:
        single.client().chat(model="nobody-serves-this", messages=MESSAGES)
    assert caught.value.status_code == 404 and "not found" in caught.value.error
    # A stream that fails before its first record gets the real status, not a 200.
    with pytest.raises(ollama.ResponseError) as caught:
        list(single.client().generate(model="nobody-serves-this", prompt="x", stream=True))
    assert caught.value.status_code == 404
    response = single.post("/api/chat", {"model": "nobody", "messages": MESSAGES})
    assert response.status_code == 404 and "Retry-After" not in response.headers
    ollama_error(response)


def test_rate_limit_is_429_with_retry_after(single: Single) -> None:
    key = single.procs.create_key()
    client = single.client(key)
    for _ in range(RATE):
        client.generate(model="echo", prompt="x")
    with pytest.raises(ollama.ResponseError) as caught:
        client.generate(model="echo", prompt="x")
    assert caught.value.status_code == 429
    response = single.post("/api/generate", {"model": "echo", "prompt": "x"}, key)
    assert response.status_code == 429 and int(response.headers["Retry-After"]) >= 1
    ollama_error(response)


TOO_MANY = [{"role": "user", "content": "hi"}] * 1000
IMAGE = "iVBORw0KGgo="  # base64, as the library sends an image
REFUSED: list[tuple[str, dict[str, Any], int, str]] = [
    ("chat", {"messages": MESSAGES, "options": {"num_predict": -5}}, 422, "num_predict"),
    ("generate", {"prompt": "x", "options": {"num_predict": -2}}, 422, "num_predict"),
    ("chat", {"messages": MESSAGES, "options": {"num_predict": 0}}, 422, "num_predict"),
    ("chat", {"messages": MESSAGES, "options": {"temperature": 9}}, 422, "temperature"),
    ("chat", {"messages": MESSAGES, "options": {"top_p": 1.5}}, 422, "top_p"),
    ("chat", {"messages": MESSAGES, "options": {"top_k": 0}}, 422, "top_k"),
    ("chat", {"messages": MESSAGES, "options": {"stop": [""]}}, 422, "stop"),
    ("chat", {"messages": TOO_MANY}, 422, "messages"),
    ("chat", {"messages": [{"role": "wizard", "content": "x"}]}, 422, "role"),
    ("chat", {"messages": [{"role": "user", "content": "x", "images": [IMAGE]}]}, 400, "images"),
    ("chat", {"messages": MESSAGES, "tools": [{"type": "function"}]}, 400, "tools"),
    ("chat", {"messages": MESSAGES, "think": True}, 400, "think"),
    ("chat", {"messages": MESSAGES, "logprobs": True}, 400, "logprobs"),
    ("generate", {"prompt": "x", "images": [IMAGE]}, 400, "images"),
    ("generate", {"prompt": "x", "template": "{{ .Prompt }}"}, 400, "template"),
    ("generate", {"prompt": "x", "context": [1, 2, 3]}, 400, "context"),
    ("generate", {"prompt": "x", "suffix": "}"}, 400, "suffix"),
    ("generate", {"prompt": "x", "raw": True, "system": "s"}, 400, "system"),
    ("generate", {"prompt": 7}, 422, "prompt"),
]


@pytest.mark.parametrize(("route", "body", "status", "named"), REFUSED)
def test_bad_input_is_a_clear_4xx(
    single: Single, route: str, body: dict[str, Any], status: int, named: str
) -> None:
    response = single.post(f"/api/{route}", {"model": "echo", **body})
    assert response.status_code == status, response.text[:300]
    assert named in ollama_error(response), response.text[:300]


def test_the_library_raises_bad_input_with_its_status(single: Single) -> None:
    with pytest.raises(ollama.ResponseError) as caught:
        single.client().chat(model="echo", messages=MESSAGES, options={"num_predict": -5})
    assert caught.value.status_code == 422 and "num_predict" in caught.value.error
    with pytest.raises(ollama.ResponseError) as caught:
        list(single.client().chat(model="echo", messages=TOO_MANY, stream=True))
    assert caught.value.status_code == 422 and "messages" in caught.value.error
    image = [{"role": "user", "content": "what is it", "images": [IMAGE]}]
    with pytest.raises(ollama.ResponseError) as caught:
        single.client().chat(model="echo", messages=image)
    assert caught.value.status_code == 400 and "messages[0].images" in caught.value.error


def test_malformed_and_oversized_bodies_answer_in_ollama_shape(single: Single) -> None:
    for body, status in ((b"", 400), (b'{"model": ', 400), (b"[1]", 422), (b"{}", 422)):
        response = single.post("/api/chat", body)
        assert response.status_code == status, (body, response.text)
        ollama_error(response)
    big = b'{"model": "echo", "prompt": "' + b"x" * Settings.max_body_bytes + b'"}'
    response = single.post("/api/generate", big)
    assert response.status_code == 413 and response.headers["Connection"] == "close"
    ollama_error(response)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)


def mostly(valid: st.SearchStrategy[object]) -> st.SearchStrategy[object]:
    """``valid`` nine times in ten, any JSON value otherwise."""
    return st.integers(0, 9).flatmap(lambda i: JSON if i == 0 else valid)


MESSAGE = st.fixed_dictionaries(
    {"role": mostly(st.sampled_from(["user", "system", "assistant", "tool"]))},
    optional={
        "content": mostly(st.text(max_size=8) | st.none()),
        "images": mostly(st.lists(st.just(IMAGE), max_size=1)),
    },
)
OPTIONS = st.fixed_dictionaries(
    {},
    optional={
        "num_predict": mostly(st.integers(-3, 5)),
        "temperature": mostly(st.floats(-1, 3, allow_nan=False)),
        "stop": mostly(st.lists(st.text(max_size=3), max_size=2) | st.text(max_size=3)),
        "num_ctx": JSON,
    },
)
BODY = st.fixed_dictionaries(
    {"model": mostly(st.sampled_from(["echo", "nobody"]))},
    optional={
        "messages": mostly(st.lists(MESSAGE, max_size=3)),
        "prompt": mostly(st.text(max_size=8)),
        "system": mostly(st.text(max_size=8)),
        "raw": mostly(st.booleans()),
        "stream": mostly(st.booleans()),
        "options": mostly(OPTIONS),
        "format": mostly(st.sampled_from(["", "json", "xml"]) | st.just({"type": "object"})),
    },
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(["chat", "generate"]), BODY)
def test_no_body_makes_a_500(single: Single, route: str, body: dict[str, object]) -> None:
    response = single.post(f"/api/{route}", body)
    assert response.status_code in (200, 400, 404, 422), (body, response.status_code)
    if response.status_code != 200:
        ollama_error(response)
    elif response.headers["content-type"].startswith("application/x-ndjson"):
        model = ollama.ChatResponse if route == "chat" else ollama.GenerateResponse
        for record in ndjson(response):
            strict(model, record)


async def test_a_failure_after_the_stream_began_is_one_error_line(procs: Processes) -> None:
    coord = procs.coordinator()
    key = procs.create_key()
    async with raw_node(coord.url, "raw-1", procs.enroll("raw-1"), models=("raw",)) as node:
        await trio.to_thread.run_sync(wait_until, lambda: coord.has_node("raw-1"), "raw-1")

        async def play() -> None:
            # A protocol v1 node: two chunks, then the backend fails.
            assign = await node.receive(timeout=30)
            assert isinstance(assign, Assign)
            await node.send(Chunk(task_id=assign.task_id, seq=0, delta="first "))
            await node.send(Chunk(task_id=assign.task_id, seq=1, delta="second "))
            await node.send(Error(task_id=assign.task_id, code="backend_error", message="boom"))

        def chat() -> tuple[list[str], ollama.ResponseError]:
            client = ollama.Client(host=coord.url, headers=auth(key), timeout=30)
            seen: list[str] = []
            with pytest.raises(ollama.ResponseError) as caught:
                for part in client.chat(model="raw", messages=MESSAGES, stream=True):
                    seen.append(part.message.content or "")
            return seen, caught.value

        async with trio.open_nursery() as nursery:
            nursery.start_soon(play)
            seen, error = await trio.to_thread.run_sync(chat)
        assert seen == ["first ", "second "]
        # The library raises the last line as it raises an error status (no status here).
        assert error.status_code == -1 and error.error == FAILED, error.error

        # A v1 node reports no usage nor timings: the done record leaves those numbers out.
        async def answer() -> None:
            assign = await node.receive(timeout=30)
            assert isinstance(assign, Assign)
            await node.send(Chunk(task_id=assign.task_id, seq=0, delta="all of it"))
            await node.send(Result(task_id=assign.task_id, output="all of it"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(answer)
            async with httpx.AsyncClient(base_url=coord.url, timeout=30) as http:
                body = {"model": "raw", "prompt": "x"}
                response = await http.post("/api/generate", json=body, headers=auth(key))
        records = ndjson(response)
        assert "".join(r["response"] for r in records) == "all of it"
        assert set(records[-1]) == {
            "model",
            "created_at",
            "response",
            "done",
            "total_duration",
            "load_duration",
        }


@pytest.mark.redis
def test_chat_on_a_runs_on_the_node_of_b(procs: Processes, redis_server: object) -> None:
    a, b = procs.share_redis(redis_server, f"oll{os.getpid()}").two_instances()
    procs.node(b, "on-b", models=("echo-b",))
    wait_until(lambda: a.has_node("on-b"), "A sees the node of B")
    client = ollama.Client(host=a.url, headers=auth(procs.create_key()), timeout=30)
    assert [m.model for m in client.list().models] == ["echo-b"]
    assert [m.model for m in client.ps().models] == ["echo-b"]
    parts = list(client.chat(model="echo-b", messages=MESSAGES, stream=True))
    assert "".join(p.message.content or "" for p in parts) == TRANSCRIPT
    assert parts[-1].eval_count == ANSWER_WORDS
    response = a.http.post(
        "/api/chat",
        json={"model": "echo-b", "messages": MESSAGES, "stream": False},
        headers=auth(procs.create_key()),
    )
    assert response.headers["X-GemmaNet-Node-Id"] == "on-b"
    assert response.json()["message"]["content"] == TRANSCRIPT
