"""The OpenAI-compatible API when tasks fail, against one real coordinator process and a
hand-driven node (``raw_node``) that fails on cue: every status /openapi.json documents for the
/v1 routes is really given, each body matches the document (tests/e2e/test_openapi.py does the
same for the native routes), a failure in the middle of a stream reaches the ``openai`` SDK as
an error after the deltas that came before it, and a node that answers a streamed task in one
piece still gives its output as a content delta."""

from __future__ import annotations

from functools import partial
from typing import Any

import httpx
import openai
import pytest
import trio

from coordinator.settings import Settings
from protocol import Assign, Chunk, Error, Result
from tests.e2e.test_openapi import validate
from tests.fixtures.processes import Coordinator, Processes, wait_until
from tests.fixtures.raw_node import RawNode, raw_node

pytestmark = pytest.mark.e2e

CHAT, TEXT, MODELS = "/v1/chat/completions", "/v1/completions", "/v1/models"
MODEL = "/v1/models/{model_id}"
RATE = 4


def ask(word: str, **extra: object) -> dict[str, object]:
    return {"model": "raw", "messages": [{"role": "user", "content": word}], **extra}


def ask_text(word: str, **extra: object) -> dict[str, object]:
    return {"model": "raw", "prompt": word, **extra}


async def play(node: RawNode, hung: list[trio.Event] | None = None) -> None:
    """Answer each task by the word its prompt ("user: <word>\\nassistant:") carries; a "hang"
    gets no answer and sets ``hung[0]`` (the test swaps in a fresh event to wait for the next)."""
    while True:
        assign = await node.receive(timeout=60)
        if not isinstance(assign, Assign):
            continue
        word = assign.prompt.split("\n")[0].removeprefix("user: ")
        task = assign.task_id
        if word == "ok":
            await node.send(Result(task_id=task, output=assign.prompt))
        elif word == "fail":
            await node.send(Error(task_id=task, code="backend_error", message="boom"))
        elif word == "half":
            await node.send(Chunk(task_id=task, seq=0, delta="first "))
            await node.send(Chunk(task_id=task, seq=1, delta="second "))
            await node.send(Error(task_id=task, code="backend_error", message="died midway"))
        elif word == "hang" and hung:
            hung[0].set()


async def test_every_v1_status_is_given_and_documented(procs: Processes) -> None:
    # A request finding no room waits in the admission queue for 1 s, then gets 503.
    coord = procs.coordinator(GEMMANET_RATE_LIMIT=f"{RATE}/minute", GEMMANET_QUEUE_TIMEOUT_S="1")
    seen: list[tuple[str, str, httpx.Response]] = []
    async with httpx.AsyncClient(base_url=coord.url, timeout=30) as http:

        async def send(
            method: str, path: str, key: str | None = None, *, route: str = "", **kw: Any
        ) -> httpx.Response:
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            response = await http.request(method, path, headers=headers, **kw)
            seen.append((route or path, method.lower(), response))
            return response

        doc = (await http.get("/openapi.json")).json()
        async with (
            trio.open_nursery() as nursery,
            raw_node(
                coord.url, "raw-1", procs.enroll("raw-1"), models=("raw",), max_parallel=1
            ) as node,
        ):
            hung = [trio.Event()]
            nursery.start_soon(play, node, hung)
            await trio.to_thread.run_sync(wait_until, lambda: coord.has_node("raw-1"), "raw-1")
            fresh = procs.create_key
            await send("GET", MODELS, fresh())  # 200
            await send("GET", MODELS)  # 401
            await send("GET", "/v1/models/raw", fresh(), route=MODEL)  # 200
            await send("GET", "/v1/models/raw", route=MODEL)  # 401
            await send("GET", "/v1/models/org/none:1", fresh(), route=MODEL)  # 404
            await _text_statuses(send, fresh)
            ok = await send("POST", CHAT, fresh(), json=ask("ok"))
            assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"] == (
                "user: ok\nassistant:"
            )
            await send("POST", CHAT, fresh(), content=b"{")  # 400
            await send("POST", CHAT, json=ask("ok"))  # 401
            await send("POST", CHAT, fresh(), json={**ask("ok"), "model": "elsewhere"})  # 404
            big = b'{"model": "raw", "messages": [], "x": "' + b"x" * Settings.max_body_bytes
            await send("POST", CHAT, fresh(), content=big + b'"}')  # 413
            await send("POST", CHAT, fresh(), json={"model": "raw"})  # 422
            limited = fresh()
            for _ in range(RATE + 1):
                last = await send("POST", CHAT, limited, json={})
            assert last.status_code == 429 and int(last.headers["Retry-After"]) >= 1
            failed = await send("POST", CHAT, fresh(), json=ask("fail"))
            assert failed.json()["error"]["code"] == "node_error", failed.text
            hang = await send("POST", CHAT, fresh(), json=ask("hang", timeout_s=0.5))
            assert hang.json()["error"]["code"] == "task_timeout", hang.text
            # The same failures before a stream's first event keep their status too.
            for word, status in (("fail", 502), ("hang", 504)):
                streamed = await http.post(
                    CHAT,
                    json=ask(word, stream=True, timeout_s=0.5),
                    headers={"Authorization": f"Bearer {fresh()}"},
                )
                assert streamed.status_code == status, streamed.text
                validate(doc, CHAT, "post", streamed)
            # The node's one slot is taken by a hanging task: the next request waits in the
            # admission queue and gets 503 after its timeout.
            hung[0] = trio.Event()
            occupant = {"Authorization": f"Bearer {fresh()}"}
            hang_for_3s = partial(http.post, CHAT, json=ask("hang", timeout_s=3), headers=occupant)
            nursery.start_soon(hang_for_3s)
            await hung[0].wait()
            busy = await send("POST", CHAT, fresh(), json=ask("ok"))
            assert busy.json()["error"]["code"] == "all_nodes_busy", busy.text
            assert int(busy.headers["Retry-After"]) >= 1
            busy_text = await send("POST", TEXT, fresh(), json=ask_text("ok"))
            assert busy_text.json()["error"]["code"] == "all_nodes_busy", busy_text.text
            nursery.cancel_scope.cancel()

    for path, method, response in seen:
        validate(doc, path, method, response)
    documented = {
        (path, method, status)
        for path, operations in doc["paths"].items()
        if path.startswith("/v1/")
        for method, operation in operations.items()
        for status in operation["responses"]
        if status != "500"
    }
    produced = {(p, m, str(r.status_code)) for p, m, r in seen}
    assert documented == produced, (sorted(documented - produced), sorted(produced - documented))


async def _text_statuses(send: Any, fresh: Any) -> None:
    """Every status of /v1/completions but the queue's 503 (given with the chat route's, while
    the node's one slot is taken)."""
    ok = await send("POST", TEXT, fresh(), json=ask_text("ok"))
    assert ok.status_code == 200 and ok.json()["choices"][0]["text"] == "ok", ok.text
    await send("POST", TEXT, fresh(), content=b"{")  # 400
    unsupported = await send("POST", TEXT, fresh(), json=ask_text("ok", echo=True))  # 400
    assert unsupported.json()["error"]["param"] == "echo", unsupported.text
    await send("POST", TEXT, json=ask_text("ok"))  # 401
    await send("POST", TEXT, fresh(), json={**ask_text("ok"), "model": "elsewhere"})  # 404
    big = b'{"model": "raw", "prompt": "' + b"x" * Settings.max_body_bytes
    await send("POST", TEXT, fresh(), content=big + b'"}')  # 413
    await send("POST", TEXT, fresh(), json={"model": "raw"})  # 422
    limited = fresh()
    for _ in range(RATE + 1):
        last = await send("POST", TEXT, limited, json={})
    assert last.status_code == 429
    failed = await send("POST", TEXT, fresh(), json=ask_text("fail"))
    assert failed.json()["error"]["code"] == "node_error", failed.text
    hang = await send("POST", TEXT, fresh(), json=ask_text("hang", timeout_s=0.5))
    assert hang.json()["error"]["code"] == "task_timeout", hang.text


def collect_until_error(coord: Coordinator, key: str) -> tuple[list[str], openai.APIError]:
    client = openai.OpenAI(api_key=key, base_url=coord.url + "/v1", max_retries=0)
    stream = client.chat.completions.create(
        model="raw", messages=ask("half")["messages"], stream=True
    )  # type: ignore[call-overload]
    deltas: list[str] = []
    try:
        for chunk in stream:
            deltas.append(chunk.choices[0].delta.content or "")
    except openai.APIError as exc:
        return deltas, exc
    raise AssertionError(f"the stream ended without an error after {deltas}")


def collect_whole(coord: Coordinator, key: str) -> list[str]:
    client = openai.OpenAI(api_key=key, base_url=coord.url + "/v1", max_retries=0)
    stream = client.chat.completions.create(
        model="raw", messages=ask("ok")["messages"], stream=True
    )  # type: ignore[call-overload]
    return [chunk.choices[0].delta.content or "" for chunk in stream]


async def test_mid_stream_error_reaches_the_sdk_and_one_piece_answers_stream(
    procs: Processes,
) -> None:
    coord = procs.coordinator()
    async with (
        trio.open_nursery() as nursery,
        raw_node(coord.url, "raw-2", procs.enroll("raw-2"), models=("raw",)) as node,
    ):
        nursery.start_soon(play, node)
        await trio.to_thread.run_sync(wait_until, lambda: coord.has_node("raw-2"), "raw-2")
        deltas, error = await trio.to_thread.run_sync(
            collect_until_error, coord, procs.create_key()
        )
        # A node that answers a streamed task in one piece (no chunks): one content delta.
        whole = await trio.to_thread.run_sync(collect_whole, coord, procs.create_key())
        nursery.cancel_scope.cancel()
    assert whole == ["", "user: ok\nassistant:", ""]
    assert "".join(deltas) == "first second "
    assert error.code == "node_error" and error.type == "server_error"
    assert "died midway" in error.message, error.message
