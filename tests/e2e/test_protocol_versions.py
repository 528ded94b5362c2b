"""Protocol v1 and v2 nodes on one coordinator, over real sockets: a v1 node (one that offers
nothing in its hello) gets a conversation as its transcript and no options, and its answer
still reaches the client; a node offering v2 gets the messages and options as sent, and the
usage, finish reason and timings it reports come back to the client."""

from __future__ import annotations

import httpx
import pytest
import trio

from protocol import Assign, Result, Timings, Usage, stamped
from tests.fixtures.processes import Coordinator, Processes
from tests.fixtures.raw_node import raw_node

pytestmark = pytest.mark.e2e

MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello."},
    {"role": "user", "content": "Why?"},
]
OPTIONS = {"max_tokens": 20, "temperature": 0.5, "stop": ["\n\n"], "seed": 7, "top_k": 40}


async def _ask(coord: Coordinator, key: str, body: dict[str, object]) -> httpx.Response:
    async with httpx.AsyncClient(base_url=coord.url, timeout=30) as client:
        return await client.post(
            "/api/v1/request", json=body, headers={"Authorization": f"Bearer {key}"}
        )


async def test_a_v1_node_gets_the_transcript_and_answers(procs: Processes) -> None:
    coord = procs.coordinator()
    key = procs.create_key()
    async with raw_node(coord.url, "old", procs.enroll("old")) as node:
        assert node.welcome is not None and node.welcome.v == 1
        answers: list[httpx.Response] = []
        async with trio.open_nursery() as nursery:

            async def client() -> None:
                body = {"model": "echo", "messages": MESSAGES, "options": OPTIONS}
                answers.append(await _ask(coord, key, body))

            nursery.start_soon(client)
            assign = await node.receive()
            assert isinstance(assign, Assign)
            # What a v1 node can read: a v1 envelope, one prompt, no options.
            assert assign.v == 1
            assert assign.prompt == (
                "system: Be brief.\nuser: Hi\nassistant: Hello.\nuser: Why?\nassistant:"
            )
            await node.send(Result(task_id=assign.task_id, output="Because."))
    [answer] = answers
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["output"] == "Because."
    # A v1 node reports nothing more: nothing is made up.
    assert body["usage"] is None and body["finish_reason"] is None


async def test_a_v2_node_gets_messages_and_options_and_reports_usage(procs: Processes) -> None:
    coord = procs.coordinator()
    key = procs.create_key()
    async with raw_node(coord.url, "new", procs.enroll("new"), protocols=[1, 2]) as node:
        assert node.welcome is not None and node.welcome.v == 2
        answers: list[httpx.Response] = []
        async with trio.open_nursery() as nursery:

            async def client() -> None:
                body = {"model": "echo", "messages": MESSAGES, "options": OPTIONS}
                answers.append(await _ask(coord, key, body))

            nursery.start_soon(client)
            assign = await node.receive()
            assert isinstance(assign, Assign) and assign.v == 2
            assert assign.prompt is None
            assert [(m.role, m.content) for m in assign.messages] == [  # type: ignore[union-attr]
                (m["role"], m["content"]) for m in MESSAGES
            ]
            options = assign.options
            assert options.max_tokens == 20 and options.stop == ["\n\n"]  # type: ignore[union-attr]
            assert (options.seed, options.top_k, options.temperature) == (7, 40, 0.5)  # type: ignore[union-attr]
            result = Result(
                task_id=assign.task_id,
                output="Because I said so",
                usage=Usage(prompt_tokens=31, completion_tokens=4),
                finish_reason="length",
                timings=Timings(total_s=0.25, ttft_s=0.05),
            )
            await node.send(stamped(result))
    [answer] = answers
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["usage"] == {"prompt_tokens": 31, "completion_tokens": 4, "total_tokens": 35}
    assert body["finish_reason"] == "length"
    assert body["timings"] == {"ttft_s": 0.05, "total_s": 0.25}


async def test_a_v2_node_gets_a_plain_prompt_as_a_v1_envelope(procs: Processes) -> None:
    # Nothing of v2 in the task: the envelope stays v1, readable by any node.
    coord = procs.coordinator()
    key = procs.create_key()
    async with (
        raw_node(coord.url, "new", procs.enroll("new"), protocols=[1, 2]) as node,
        trio.open_nursery() as nursery,
    ):
        nursery.start_soon(_ask, coord, key, {"model": "echo", "prompt": "plain"})
        assign = await node.receive()
        assert isinstance(assign, Assign)
        assert (assign.v, assign.prompt) == (1, "plain")
        await node.send(Result(task_id=assign.task_id, output="plain"))
