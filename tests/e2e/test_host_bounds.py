"""A misbehaving model host cannot grow the memory of whoever calls it (docs/nodes.md "Direct model
hosts", protocol/model_servers/bounded_reads.py). A host speaking HTTP/1.1 by hand
(tests/fixtures/misbehaving_host.py) sends a 96 MiB line, a 96 MiB error body, a stream that
never ends, 96 MiB poll answers; each request through the real HTTP API gets a clear ``502
node_error`` (the host is ``unreachable`` after the polls), and the peak RSS (``VmHWM``) of the
process that read it, a coordinator calling the host directly or a node agent calling it as
its backend, grows by a few MiB, not by what the host sent."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from protocol.model_servers import MAX_LINE_BYTES, MAX_STREAM_BYTES
from tests.fixtures.misbehaving_host import HUGE, MisbehavingHost
from tests.fixtures.processes import Coordinator, Processes, wait_until
from tests.fixtures.redis_server import RedisServer

pytestmark = pytest.mark.e2e

HOST = "box"
FAST = {
    "GEMMANET_MONITOR_POLL_S": "0.2",
    "GEMMANET_MONITOR_TTL_S": "3",
    "GEMMANET_MONITOR_RETRY_S": "0.2",
    "GEMMANET_MONITOR_POLL_TIMEOUT_S": "2",
    "GEMMANET_RESIDENCY_STALE_S": "10",
}
#: how much the reader's peak RSS may grow over all the misbehaving answers
MAX_GROWTH_MIB = 8
#: what loopback socket buffers may hold between the host's writes and the reader's reads
BUFFERED = 16 * 1024 * 1024

#: behaviour -> what the client's 502 says (after "direct host box: " or the node's prefix)
FAILURES = {
    "huge_line": f"ollama: a stream line ran past {MAX_LINE_BYTES:,} bytes",
    "huge_error": "ollama: HTTP 500: xxxx",
    "endless": f"ollama: the stream ran past {MAX_STREAM_BYTES:,} bytes",
}


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


async def until(predicate: Callable[[], object], what: str, timeout_s: float = 20.0) -> None:
    await trio.to_thread.run_sync(lambda: wait_until(predicate, what, timeout_s))


async def ask(coord: Coordinator, key: str, **body: Any) -> httpx.Response:
    request = {"model": "llama3", "prompt": "go", "timeout_s": 60, **body}
    return await trio.to_thread.run_sync(lambda: coord.request(key, **request))


def host_info(coord: Coordinator) -> dict[str, object]:
    return next(n for n in coord.nodes() if n["node_id"] == HOST)


async def misbehave(
    host: MisbehavingHost, coord: Coordinator, key: str, pid: int, prefix: str
) -> None:
    """Each generation misbehaviour once through the API, the peak RSS of ``pid`` checked
    after each (its growth from its peak after a good answer)."""
    host.behaviour = "ok"
    for stream in (False, True):  # the paths warmed up, plain and SSE
        good = await ask(coord, key, stream=stream)
        assert good.status_code == 200, good.text
    before = peak_rss_mib(pid)
    grown: dict[str, float] = {}
    for behaviour, expected in FAILURES.items():
        host.behaviour, answered = behaviour, host.answered
        failed = await ask(coord, key)
        grown[behaviour] = round(peak_rss_mib(pid) - before, 1)
        print(f"peak RSS growth, MiB ({prefix.strip() or 'agent'}): {grown}")
        assert grown[behaviour] <= MAX_GROWTH_MIB, (grown, failed.text[:300])
        assert failed.status_code == 502, failed.text[:300]
        error = failed.json()["error"]
        assert error["code"] == "node_error" and f"{prefix}{expected}" in error["message"], error
        assert len(error["message"]) < 400, error
        await until(lambda: host.answered > answered, "the host's answer ended")  # noqa: B023
        if behaviour == "endless":  # read to its bound, not cut short by anything else
            assert MAX_STREAM_BYTES <= host.sent <= MAX_STREAM_BYTES + BUFFERED, host.sent
        else:  # the reader left early: the host got to write no more than the buffers hold
            assert host.sent <= MAX_LINE_BYTES + BUFFERED < HUGE, host.sent


def capacity_file(tmp_path: Path, host: MisbehavingHost) -> str:
    path = tmp_path / "capacity.toml"
    path.write_text(f'[hosts."{HOST}"]\nurl = "{host.url}"\nkind = "ollama"\nmax_parallel = 2\n')
    return str(path)


@pytest.mark.redis
async def test_a_misbehaving_direct_host_cannot_grow_the_coordinator(
    procs: Processes, tmp_path: Path, nursery: trio.Nursery, redis_server_session: RedisServer
) -> None:
    host = MisbehavingHost()
    await nursery.start(host.run)
    env = {
        "GEMMANET_CAPACITY_FILE": capacity_file(tmp_path, host),
        "GEMMANET_MONITOR": "1",
        # Placement on direct hosts needs a shared store; on at once (no audit here).
        "GEMMANET_REDIS_URL": redis_server_session.url,
        "GEMMANET_KEY_PREFIX": f"bounds{os.getpid()}",
        "GEMMANET_HOST_PLACEMENT": "on",
    }
    coord = await trio.to_thread.run_sync(lambda: procs.coordinator(**env, **FAST))
    await until(lambda: host_info(coord)["host_state"] == "ok", "fresh host facts")
    key = procs.create_key("bounds")
    pid = coord.proc.pid
    await misbehave(host, coord, key, pid, f"direct host {HOST}: ")

    # The monitor (inside this instance) reads at most 1 MiB of each poll answer, none of an
    # error answer, and takes JSON nested too deep for the parser for no answer (not a crash).
    before = peak_rss_mib(pid)
    host.polls = "huge"
    await until(lambda: host_info(coord)["host_state"] == "unreachable", "an unreachable host")
    for polls in ("huge", "huge_error", "nested"):
        host.polls = polls
        await trio.sleep(1)  # a few polls each
    polls_grown = peak_rss_mib(pid) - before
    print(f"peak RSS growth over the huge polls, MiB: {polls_grown:.1f}")
    assert polls_grown <= MAX_GROWTH_MIB, polls_grown
    refused = await ask(coord, key)
    assert refused.status_code == 503, refused.text
    assert await trio.to_thread.run_sync(coord.healthy)


async def test_a_misbehaving_backend_cannot_grow_the_node_agent(
    procs: Processes, nursery: trio.Nursery
) -> None:
    host = MisbehavingHost()
    await nursery.start(host.run)
    coord = await trio.to_thread.run_sync(procs.coordinator)
    backend = ("--backend", "ollama", "--backend-url", host.url)

    def start_node() -> Any:
        return procs.node(coord, "agent-1", models=("llama3",), extra=backend)

    node = await trio.to_thread.run_sync(start_node)
    key = procs.create_key("bounds")
    await misbehave(host, coord, key, node.pid, "")
    assert node.poll() is None and await trio.to_thread.run_sync(coord.has_node, "agent-1")
