"""The ollama and openai node backends through the whole system: a fake model server process
(tools/fakes), a real node agent process speaking to it, a real coordinator, a real client.
What the client gets must be exactly what the model server produced, piece by piece when
streaming, with the usage and finish reason it reported; a conversation and its options reach
the model server in its own API (checked there against the real client library's types); a
failing model server must reach the client as 502 ``node_error``."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import httpx
import pytest

from tests.fixtures.processes import Coordinator, Processes, wait_until
from tools.fakes._server import words

pytestmark = pytest.mark.e2e

MODEL = "m"
# Leading whitespace, runs of spaces, a newline and non-ASCII: the pieces must survive as is.
PROMPT = "  Grüße from the   fake\nmodel server, piece by piece ✓"


def start_fake(procs: Processes, kind: str, *args: str) -> str:
    """``python -m tools.fakes.<kind> --port 0``; its URL is the last line of its stdout."""
    proc = procs._popen([sys.executable, "-m", f"tools.fakes.{kind}", *args])

    def url() -> str | None:
        if proc.poll() is not None:
            raise AssertionError(f"fake {kind} exited with {proc.returncode}")
        with open(proc.log_path) as log:  # type: ignore[attr-defined]
            lines = [line.strip() for line in log if line.strip()]
        return lines[-1] if lines and lines[-1].startswith("http://") else None

    return wait_until(url, f"fake {kind} listening", timeout_s=20)  # type: ignore[no-any-return]


def fake_config(url: str, **config: object) -> dict[str, Any]:
    response = httpx.post(f"{url}/_fake/config", json=config, timeout=5)
    response.raise_for_status()
    return response.json()  # type: ignore[no-any-return]


def fake_stats(url: str) -> dict[str, Any]:
    return httpx.get(f"{url}/_fake/stats", timeout=5).json()  # type: ignore[no-any-return]


def fake_requests(url: str) -> list[dict[str, Any]]:
    """What the fake received: ``{"path", "body", "refused"}`` each, in order."""
    received = httpx.get(f"{url}/_fake/requests", timeout=5).json()
    return received["requests"]  # type: ignore[no-any-return]


def sse_events(response: httpx.Response) -> list[dict[str, Any]]:
    assert response.headers["content-type"].startswith("text/event-stream"), response.headers
    events = []
    for block in response.text.split("\n\n"):
        if block.strip():
            assert block.startswith("data: "), block
            events.append(json.loads(block[len("data: ") :]))
    return events


def assert_node_error(response: httpx.Response) -> None:
    assert response.status_code == 502, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert error["code"] == "node_error", error
    assert "injected failure" in error["message"] or "HTTP 500" in error["message"], error


@pytest.mark.parametrize("kind", ["ollama", "openai"])
def test_model_server_backend_end_to_end(procs, kind) -> None:
    coord: Coordinator = procs.coordinator()
    fake = start_fake(procs, kind, "--port", "0", "--model", MODEL)
    node_id = f"{kind}-node"
    # procs.node passes --backend echo; a later --backend wins (argparse keeps the last one).
    procs.node(coord, node_id, models=(MODEL,), extra=("--backend", kind, "--backend-url", fake))
    key = procs.create_key("client")

    # A JSON request: the whole answer, exactly.
    r = coord.request(key, model=MODEL, prompt=PROMPT)
    assert r.status_code == 200, r.text
    assert r.json()["output"] == PROMPT and r.json()["node_id"] == node_id
    assert fake_stats(fake)["requests"] == 1  # it came from the model server, not an echo

    # A streamed request: one event per piece the model server sent, then done.
    r = coord.request(key, model=MODEL, prompt=PROMPT, stream=True)
    assert r.status_code == 200, r.text
    events = sse_events(r)
    assert [e["delta"] for e in events[:-1]] == words(PROMPT)
    assert events[-1]["done"] is True and events[-1]["output"] == PROMPT
    assert events[-1]["node_id"] == node_id
    assert fake_stats(fake)["completed"] == 2

    # The model server refuses (HTTP 500): 502 node_error, streamed or not.
    fake_config(fake, fail="http")
    assert_node_error(coord.request(key, model=MODEL, prompt=PROMPT))
    assert_node_error(coord.request(key, model=MODEL, prompt=PROMPT, stream=True))

    # It fails after the first piece: a JSON request gets 502; a stream has begun, so it gets
    # that piece and then the error event.
    fake_config(fake, fail="midstream")
    assert_node_error(coord.request(key, model=MODEL, prompt=PROMPT))
    r = coord.request(key, model=MODEL, prompt=PROMPT, stream=True)
    assert r.status_code == 200, r.text
    events = sse_events(r)
    assert events[:-1] == [{"delta": words(PROMPT)[0]}], events
    assert events[-1]["error"]["code"] == "node_error" and events[-1]["error"]["status"] == 502

    # It cuts the answer short without its final record: not passed off as a whole answer.
    fake_config(fake, fail="truncate")
    assert_truncated(coord.request(key, model=MODEL, prompt=PROMPT))

    # Healthy again: the node was not disturbed by the failures.
    fake_config(fake, fail=None)
    started = time.monotonic()
    r = coord.request(key, model=MODEL, prompt=PROMPT)
    assert r.status_code == 200 and r.json()["output"] == PROMPT, r.text
    assert time.monotonic() - started < 5
    assert coord.status()["in_flight"] == 0
    assert fake_stats(fake)["refused"] == 0


#: the chat route and the raw-prompt route of each server
ROUTES = {
    "ollama": ("/api/chat", "/api/generate"),
    "openai": ("/v1/chat/completions", "/v1/completions"),
}


@pytest.mark.parametrize("kind", ["ollama", "openai"])
def test_a_conversation_and_its_options_reach_the_model_server_in_its_own_api(procs, kind) -> None:
    coord: Coordinator = procs.coordinator()
    fake = start_fake(procs, kind, "--port", "0", "--model", MODEL)
    procs.node(
        coord, f"{kind}-node", models=(MODEL,), extra=("--backend", kind, "--backend-url", fake)
    )
    key = procs.create_key("client")
    messages = [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": "one two three four"},
    ]
    options = {"max_tokens": 2, "temperature": 0.5, "top_k": 5}
    r = coord.request(key, model=MODEL, messages=messages, options=options)
    assert r.status_code == 200, r.text
    answer = r.json()
    # The model server's answer and its own counts: the bound was hit.
    assert answer["output"] == "one two"
    assert answer["usage"] == {"prompt_tokens": 6, "completion_tokens": 2, "total_tokens": 8}
    assert answer["finish_reason"] == "length"

    r = coord.request(
        key, model=MODEL, prompt="a b STOP c", options={"stop": ["STOP"]}, stream=True
    )
    assert r.status_code == 200, r.text
    events = sse_events(r)
    assert [e["delta"] for e in events[:-1]] == ["a ", "b "]
    assert events[-1]["usage"] == {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6}
    assert events[-1]["finish_reason"] == "stop"

    chat, raw = fake_requests(fake)
    assert (chat["path"], raw["path"]) == ROUTES[kind]
    assert chat["refused"] is None and raw["refused"] is None
    if kind == "ollama":
        assert chat["body"]["messages"] == [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "one two three four"},
        ]
        assert chat["body"]["options"] == {"num_predict": 2, "temperature": 0.5, "top_k": 5}
        assert raw["body"] == {
            "model": MODEL,
            "prompt": "a b STOP c",
            "raw": True,
            "stream": True,
            "options": {"stop": ["STOP"]},
        }
    else:
        assert chat["body"]["messages"] == messages
        assert (chat["body"]["max_tokens"], chat["body"]["top_k"]) == (2, 5)
        assert chat["body"]["stream_options"] == {"include_usage": True}
        assert raw["body"]["prompt"] == "a b STOP c" and raw["body"]["stop"] == ["STOP"]


def assert_truncated(response: httpx.Response) -> None:
    assert response.status_code == 502, response.text
    error = response.json()["error"]
    assert error["code"] == "node_error", error
    assert "ended before" in error["message"], error
