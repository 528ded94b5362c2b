"""The node agent checks its model backend (health.py) and tells its coordinator, over real
sockets: a fake coordinator (test_node_agent.py's), a real Ollama backend client, and a port
where nobody listens, then a fake Ollama (tools/fakes, on the ``ollama`` library's types)
started on that very port, then stopped again."""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial

import msgspec
import pytest
import trio

import tools.fakes._ollama_types  # noqa: F401 - slow to load: not inside a test's event loop
from protocol import Error, Heartbeat, Result, TaskErrorCode
from tests.coordinator.test_node_agent import (
    FakeCoordinator,
    NodeConn,
    assign,
    start_agent,
    wait_until,
)
from tests.fixtures.processes import free_port
from tools.fakes.ollama import FakeOllama
from tools.fakes.openai import FakeOpenAI
from tools.node_agent import BackendError, OllamaBackend, OpenAIBackend

MODEL = "gemma3:4b"
#: generous: the machine running the suite may be loaded
WAIT_S = 15.0


@pytest.fixture
async def coordinator(nursery: trio.Nursery) -> FakeCoordinator:
    """Heartbeats once a second: a loaded machine's stall does not look like a dead link
    (these tests count the node's connections)."""
    coord = FakeCoordinator(interval=1.0)
    await nursery.start(coord.run)
    return coord


def down(beat: Heartbeat) -> str | None:
    return None if beat.backend_down is msgspec.UNSET else beat.backend_down


async def next_beat(conn: NodeConn, predicate: Callable[[Heartbeat], bool]) -> Heartbeat:
    """The first heartbeat from now on that satisfies ``predicate``."""
    seen = len(conn.heartbeats)
    await wait_until(lambda: any(predicate(b) for b in conn.heartbeats[seen:]), WAIT_S)
    return next(b for b in conn.heartbeats[seen:] if predicate(b))


class _Status:
    """A task_status that hands the fake's scope to ``nursery.start`` once it listens."""

    def __init__(self, status: trio.TaskStatus[trio.CancelScope], scope: trio.CancelScope) -> None:
        self._status, self._scope = status, scope

    def started(self, _url: str | None = None) -> None:
        self._status.started(self._scope)


async def start_fake(nursery: trio.Nursery, port: int) -> tuple[FakeOllama, trio.CancelScope]:
    fake = FakeOllama(models={MODEL})
    fake.prepare()

    async def run(task_status: trio.TaskStatus[trio.CancelScope]) -> None:
        with trio.CancelScope() as scope:
            await fake.run(port=port, task_status=_Status(task_status, scope))  # type: ignore[arg-type]

    return fake, await nursery.start(run)


async def test_a_backend_nobody_answers_is_said_in_the_hello_and_nothing_runs_until_it_answers(
    coordinator: FakeCoordinator, nursery: trio.Nursery, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gemmanet.node")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    backend = OllamaBackend(url)
    run = start_agent(nursery, coordinator.url, backend, models=(MODEL,), backend_check_s=0.2)
    conn = await coordinator.next_conn(timeout=WAIT_S)
    # Checked before the hello: it advertises its models, and says why it serves none of them.
    problem = conn.hello.backend_down
    assert isinstance(problem, str)
    assert f"GET {url}/api/tags" in problem and "cannot connect" in problem, problem
    unreachable = [r for r in caplog.records if "backend unreachable" in r.getMessage()]
    assert len(unreachable) == 1, [r.getMessage() for r in caplog.records]
    assert url in unreachable[0].getMessage()
    beat = await next_beat(conn, lambda b: True)
    assert down(beat) is not None  # and every heartbeat says it again
    # A task that still arrives (an older coordinator, a stale view) is refused at once,
    # never run: the coordinator may place it elsewhere.
    await conn.send(assign("t1", stream=False, model=MODEL))
    refusal = await conn.recv(timeout=WAIT_S)
    assert isinstance(refusal, Error) and refusal.code == TaskErrorCode.BACKEND_UNAVAILABLE
    assert url in refusal.message
    await trio.sleep(1.0)  # a few failed checks (with backoff): still one line in the log
    assert len([r for r in caplog.records if "backend unreachable" in r.getMessage()]) == 1

    fake, _ = await start_fake(nursery, port)
    await next_beat(conn, lambda b: down(b) is None)
    await conn.send(assign("t2", "hello there", stream=False, model=MODEL))
    assert await conn.recv(timeout=WAIT_S) == Result(task_id="t2", output="hello there")
    assert len(fake.requests) == 1  # the model server's answer, the only task it was asked
    assert len(coordinator.hellos) == 1  # served on the same connection
    assert any("answers again" in r.getMessage() for r in caplog.records)
    assert not run.done.is_set()
    await backend.aclose()


async def test_a_backend_lost_while_connected_is_reported_and_found_again(
    coordinator: FakeCoordinator, nursery: trio.Nursery
) -> None:
    port = free_port()
    _, scope = await start_fake(nursery, port)
    backend = OllamaBackend(f"http://127.0.0.1:{port}")
    # Checks are rare here: it is a task's failure that makes the agent look at once.
    start_agent(nursery, coordinator.url, backend, models=(MODEL,), backend_check_s=30)
    conn = await coordinator.next_conn(timeout=WAIT_S)
    assert conn.hello.backend_down is msgspec.UNSET
    await conn.send(assign("t1", "one", stream=False, model=MODEL))
    assert await conn.recv(timeout=WAIT_S) == Result(task_id="t1", output="one")

    scope.cancel()  # the model server goes away
    await wait_until(lambda: scope.cancelled_caught, WAIT_S)
    await conn.send(assign("t2", "two", stream=False, model=MODEL))
    failed = await conn.recv(timeout=WAIT_S)
    # It never reached the server: refused so that the coordinator places it elsewhere.
    assert isinstance(failed, Error) and failed.code == TaskErrorCode.BACKEND_UNAVAILABLE, failed
    beat = await next_beat(conn, lambda b: down(b) is not None)
    assert f"127.0.0.1:{port}" in (down(beat) or "")
    await conn.send(assign("t3", "three", stream=False, model=MODEL))
    refused = await conn.recv(timeout=WAIT_S)
    assert isinstance(refused, Error) and refused.code == TaskErrorCode.BACKEND_UNAVAILABLE

    # Back (on the same port): found by the checks' backoff, at most backend_check_s apart
    # (30 s here), in practice within a second or two.
    await start_fake(nursery, port)
    await next_beat(conn, lambda b: down(b) is None)
    await conn.send(assign("t4", "four", stream=False, model=MODEL))
    assert await conn.recv(timeout=WAIT_S) == Result(task_id="t4", output="four")
    assert len(coordinator.hellos) == 1
    await backend.aclose()


async def test_a_periodic_check_finds_a_backend_gone_while_idle(
    coordinator: FakeCoordinator, nursery: trio.Nursery
) -> None:
    port = free_port()
    _, scope = await start_fake(nursery, port)
    backend = OllamaBackend(f"http://127.0.0.1:{port}")
    start_agent(nursery, coordinator.url, backend, models=(MODEL,), backend_check_s=0.2)
    conn = await coordinator.next_conn(timeout=WAIT_S)
    assert conn.hello.backend_down is msgspec.UNSET
    scope.cancel()
    beat = await next_beat(conn, lambda b: down(b) is not None)
    assert "cannot connect" in (down(beat) or ""), beat
    await backend.aclose()


@pytest.mark.parametrize("kind", ["ollama", "openai"])
async def test_the_check_reads_the_model_list_and_names_what_failed(
    kind: str, fake_ollama: FakeOllama, fake_openai: FakeOpenAI
) -> None:
    fake: FakeOllama | FakeOpenAI = fake_ollama if kind == "ollama" else fake_openai
    fake.models = {MODEL}
    make = OllamaBackend if kind == "ollama" else partial(OpenAIBackend, api_key="")
    backend = make(fake.url)
    assert await backend.check() == [MODEL]
    await backend.aclose()
    port = free_port()
    backend = make(f"http://127.0.0.1:{port}")
    path = "/api/tags" if kind == "ollama" else "/v1/models"
    with pytest.raises(BackendError, match=f"GET http://127.0.0.1:{port}{path}: cannot connect"):
        await backend.check()
    await backend.aclose()


async def test_a_server_without_a_model_list_serves_on_trust(
    coordinator: FakeCoordinator, nursery: trio.Nursery
) -> None:
    """An OpenAI-compatible server that answers ``GET /v1/models`` with 404 is up: the node
    serves (it once reported the backend down and counted retries down forever)."""
    fake = FakeOpenAI(models={MODEL}, lists_models=False)
    fake.prepare()
    url = await nursery.start(fake.run)
    backend = OpenAIBackend(url, api_key="")
    assert await backend.check() is None  # up, lists nothing
    start_agent(nursery, coordinator.url, backend, models=(MODEL,))
    conn = await coordinator.next_conn(timeout=WAIT_S)
    assert conn.hello.backend_down is msgspec.UNSET  # it answers: the node serves
    await conn.send(assign("t1", stream=False, model=MODEL))
    result = await conn.recv(timeout=WAIT_S)
    assert isinstance(result, Result) and result.task_id == "t1", result
    await backend.aclose()


async def test_a_model_the_backend_does_not_list_is_named_in_one_warning(
    coordinator: FakeCoordinator,
    nursery: trio.Nursery,
    fake_ollama: FakeOllama,
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake_ollama.models = {"llama3:latest"}
    backend = OllamaBackend(fake_ollama.url)
    start_agent(nursery, coordinator.url, backend, models=("llama3", MODEL))
    conn = await coordinator.next_conn(timeout=WAIT_S)
    assert conn.hello.backend_down is msgspec.UNSET  # it answers: the node serves
    (warning,) = [r.getMessage() for r in caplog.records if "does not list" in r.getMessage()]
    # "llama3" is Ollama's "llama3:latest"; the other one is not pulled.
    assert f"does not list {MODEL} (it lists: llama3:latest)" in warning, warning
    await backend.aclose()
