"""Calls to direct hosts (``coordinator/hosts/host_calls.py``) against real fake servers over
real sockets: the answers come back as the host's chunks and result, a failing or unreachable
host as a ``backend_error`` failure, and a stopped call drops its connection at once."""

from __future__ import annotations

import trio

from coordinator.capacity import HostSpec
from coordinator.core.effects import CallHost
from coordinator.hosts.host_calls import HostCalls
from protocol import BusAssign, BusChunk, BusResult, TaskErrorCode
from tests.fixtures.processes import free_port
from tools.fakes.ollama import FakeOllama
from tools.fakes.openai import FakeOpenAI


def call(host: str, prompt: str = "one two three", *, stream: bool = True) -> CallHost:
    assign = BusAssign(
        task_id="t1",
        node_id=host,
        conn_id=f"direct:{host}",
        model="llama3",
        prompt=prompt,
        stream=stream,
        timeout_s=30.0,
        reply_to="A",
    )
    return CallHost(host, assign, deadline=trio.current_time() + 30.0)


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


async def test_an_openai_host_answers_through_the_same_path(fake_openai: FakeOpenAI) -> None:
    spec = HostSpec(url=fake_openai.url or "", kind="openai")
    answers = await run_call({"gpt": spec}, call("gpt", stream=False))
    assert len(answers) == 1  # a task that does not stream gets no chunks
    assert isinstance(answers[0], BusResult) and answers[0].output == "one two three"


async def test_a_host_failing_mid_stream_is_a_backend_error(fake_ollama: FakeOllama) -> None:
    fake_ollama.fail = "midstream"
    spec = HostSpec(url=fake_ollama.url or "", kind="ollama")
    result = (await run_call({"box": spec}, call("box")))[-1]
    assert isinstance(result, BusResult) and result.failure is not None
    assert result.failure.code == TaskErrorCode.BACKEND_ERROR
    assert "direct host box" in result.failure.message and "injected" in result.failure.message


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
