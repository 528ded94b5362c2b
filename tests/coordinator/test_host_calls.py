"""Calls to direct hosts (``coordinator/hosts/host_calls.py``) against real fake servers over
real sockets: the answers come back as the host's chunks and result (with the usage and finish
reason the host reported: a v2 result), a conversation and its options reach the host in its
own API, a failing or unreachable host is a ``backend_error`` failure, and a stopped call drops
its connection at once."""

from __future__ import annotations

from typing import Any

import msgspec
import trio

from coordinator.capacity import HostSpec
from coordinator.core.effects import CallHost
from coordinator.hosts.host_calls import HostCalls
from protocol import BusAssign, BusChunk, BusResult, Message, Options, TaskErrorCode, Usage, stamped
from tests.fixtures.processes import free_port
from tools.fakes.ollama import FakeOllama
from tools.fakes.openai import FakeOpenAI


def call(
    host: str, prompt: str | None = "one two three", *, stream: bool = True, **v2: Any
) -> CallHost:
    assign = BusAssign(
        task_id="t1",
        node_id=host,
        conn_id=f"direct:{host}",
        model="llama3",
        prompt=prompt,
        stream=stream,
        timeout_s=30.0,
        reply_to="A",
        **v2,
    )
    return CallHost(host, stamped(assign), deadline=trio.current_time() + 30.0)


async def run_call(hosts: dict[str, HostSpec], effect: CallHost) -> list[BusChunk | BusResult]:
    answers: list[BusChunk | BusResult] = []
    calls = HostCalls(hosts, answers.append)
    async with trio.open_nursery() as nursery:
        await nursery.start(calls.run)
        calls.start(effect)
        with trio.fail_after(10):
            while not answers or not isinstance(answers[-1], BusResult):
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    return answers


async def test_a_streamed_call_reports_numbered_chunks_then_the_output(
    fake_ollama: FakeOllama,
) -> None:
    spec = HostSpec(url=fake_ollama.url or "", kind="ollama")
    answers = await run_call({"box": spec}, call("box"))
    chunks = [a for a in answers if isinstance(a, BusChunk)]
    assert [(c.seq, c.delta, c.conn_id) for c in chunks] == [
        (0, "one ", "direct:box"),
        (1, "two ", "direct:box"),
        (2, "three", "direct:box"),
    ]
    result = answers[-1]
    assert isinstance(result, BusResult) and result.failure is None
    assert (result.output, result.chunks, result.node_id) == ("one two three", 3, "box")
    assert result.usage == Usage(prompt_tokens=3, completion_tokens=3)
    assert result.finish_reason == "stop" and result.v == 2
    assert result.timings and result.timings.ttft_s is not None
    assert 0 <= result.timings.ttft_s <= result.timings.total_s
    assert fake_ollama.paths == ["/api/generate"]


async def test_a_conversation_reaches_an_ollama_host_on_api_chat_with_its_options(
    fake_ollama: FakeOllama,
) -> None:
    spec = HostSpec(url=fake_ollama.url or "", kind="ollama")
    turns = [
        Message(role="developer", content="be terse"),
        Message(role="user", content="count with me: one two three four"),
    ]
    effect = call(
        "box", None, stream=False, messages=turns, options=Options(max_tokens=2, temperature=0)
    )
    (result,) = await run_call({"box": spec}, effect)
    assert isinstance(result, BusResult) and result.failure is None
    assert result.output == "count with"
    assert result.usage == Usage(prompt_tokens=2 + 7, completion_tokens=2)
    assert result.finish_reason == "length" and result.v == 2
    assert fake_ollama.paths == ["/api/chat"]
    assert fake_ollama.requests[0]["messages"] == [
        {"role": "system", "content": "be terse"},
        {"role": "user", "content": "count with me: one two three four"},
    ]
    assert fake_ollama.requests[0]["options"] == {"num_predict": 2, "temperature": 0.0}


async def test_an_openai_host_answers_through_the_same_path(fake_openai: FakeOpenAI) -> None:
    spec = HostSpec(url=fake_openai.url or "", kind="openai")
    answers = await run_call({"gpt": spec}, call("gpt", stream=False))
    assert len(answers) == 1  # a task that does not stream gets no chunks
    assert isinstance(answers[0], BusResult) and answers[0].output == "one two three"
    assert answers[0].usage == Usage(prompt_tokens=3, completion_tokens=3)
    assert answers[0].finish_reason == "stop"
    assert fake_openai.paths == ["/v1/completions"]  # a raw prompt: no chat template

    fake_openai.requests.clear()
    fake_openai.paths.clear()
    turns = [Message(role="user", content="a b c"), Message(role="assistant", content="d")]
    turns.append(Message(role="user", content="e f g h"))
    options = Options(max_tokens=9, stop=["g"], format="json")
    effect = call("gpt", None, stream=True, messages=turns, options=options)
    result = (await run_call({"gpt": spec}, effect))[-1]
    assert isinstance(result, BusResult) and result.output == "e f "
    assert result.usage == Usage(prompt_tokens=8, completion_tokens=2)
    assert result.finish_reason == "stop"
    assert fake_openai.paths == ["/v1/chat/completions"]
    body = fake_openai.requests[0]
    assert [m["content"] for m in body["messages"]] == ["a b c", "d", "e f g h"]
    assert (body["max_tokens"], body["stop"]) == (9, ["g"])
    assert body["response_format"] == {"type": "json_object"}
    assert body["stream_options"] == {"include_usage": True}


async def test_a_host_failing_mid_stream_is_a_backend_error(fake_ollama: FakeOllama) -> None:
    fake_ollama.fail = "midstream"
    spec = HostSpec(url=fake_ollama.url or "", kind="ollama")
    result = (await run_call({"box": spec}, call("box")))[-1]
    assert isinstance(result, BusResult) and result.failure is not None
    assert result.failure.code == TaskErrorCode.BACKEND_ERROR
    assert "direct host box" in result.failure.message and "injected" in result.failure.message
    assert result.usage is msgspec.UNSET and result.v == 1  # a failure reports no usage


async def test_an_unreachable_host_is_a_backend_error() -> None:
    spec = HostSpec(url=f"http://127.0.0.1:{free_port()}", kind="ollama")
    result = (await run_call({"box": spec}, call("box")))[-1]
    assert isinstance(result, BusResult) and result.failure is not None
    assert result.failure.code == TaskErrorCode.BACKEND_ERROR
    assert "cannot connect" in result.failure.message


async def test_a_stopped_call_drops_its_connection_and_reports_nothing(
    fake_ollama: FakeOllama,
) -> None:
    fake_ollama.chunk_delay_s = 5.0
    spec = HostSpec(url=fake_ollama.url or "", kind="ollama")
    answers: list[BusChunk | BusResult] = []
    calls = HostCalls({"box": spec}, answers.append)
    async with trio.open_nursery() as nursery:
        await nursery.start(calls.run)
        calls.start(call("box"))
        with trio.fail_after(5):
            while not answers:  # the first piece came: the host is generating
                await trio.sleep(0.01)
            calls.stop("t1")
            await fake_ollama.wait_aborted()
        assert len(calls) == 0
        nursery.cancel_scope.cancel()
    assert [type(a) for a in answers] == [BusChunk]


async def test_a_stop_before_the_call_began_still_stops_it(fake_ollama: FakeOllama) -> None:
    spec = HostSpec(url=fake_ollama.url or "", kind="ollama")
    answers: list[BusChunk | BusResult] = []
    calls = HostCalls({"box": spec}, answers.append)
    async with trio.open_nursery() as nursery:
        await nursery.start(calls.run)
        calls.start(call("box"))
        calls.stop("t1")  # in the same step: the call's task has not run yet
        await trio.sleep(0.5)
        nursery.cancel_scope.cancel()
    assert answers == [] and fake_ollama.requests == []
