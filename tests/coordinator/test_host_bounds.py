"""Every read from a model host has a bound (protocol/model_servers/bounded_reads.py), on both
sides that call one: the coordinator's direct hosts (``coordinator/hosts/host_client.py``, the
monitor's polls) and the node agent's backends. A host speaking HTTP/1.1 by hand over a real
socket (tests/fixtures/misbehaving_host.py) sends a 96 MiB line, a 96 MiB error body, a
stream that never ends, a compressed answer, huge poll answers: each is a short HostError (a
``reachable: false`` poll), and the host got to write no more than the bound and what the
socket buffers hold before its client left. The coordinator's memory under the same host,
through its HTTP API, is tests/e2e/test_host_bounds.py."""

from __future__ import annotations

import re
from contextlib import aclosing

import httpx
import pytest
import trio

from coordinator.capacity import HostSpec
from coordinator.hosts.host_client import stream_call
from coordinator.monitor.poller import poll_host
from protocol.model_servers import (
    MAX_BODY_BYTES,
    MAX_LINE_BYTES,
    Finish,
    Generation,
    HostError,
    bounded_reads,
    ollama_call,
    openai_call,
)
from tests.fixtures.misbehaving_host import HUGE, MisbehavingHost
from tools.node_agent import OllamaBackend, OpenAIBackend

#: what loopback socket buffers may hold between the host's writes and its client's reads
BUFFERED = 16 * 1024 * 1024
SIDES = ["direct host", "node agent"]
KINDS = ["ollama", "openai"]
CHAT = Generation(model="llama3", prompt="p")


async def answer(side: str, kind: str, url: str) -> list[str | Finish]:
    if side == "node agent":
        backend = OllamaBackend(url) if kind == "ollama" else OpenAIBackend(url, api_key="")
        try:
            async with aclosing(backend.generate(CHAT)) as deltas:  # type: ignore[type-var]
                return [delta async for delta in deltas]
        finally:
            await backend.aclose()
    call = (ollama_call if kind == "ollama" else openai_call)(CHAT)
    async with httpx.AsyncClient() as client, aclosing(stream_call(client, url, call)) as deltas:
        return [delta async for delta in deltas]


async def fails(side: str, kind: str, host: MisbehavingHost, expected: str) -> str:
    with trio.fail_after(30), pytest.raises(HostError, match=re.escape(expected)) as raised:
        await answer(side, kind, host.url)
    message = str(raised.value)
    assert message.startswith(f"{kind}: ") and len(message) <= 200, message
    # The client left: the host's writes fail once the socket buffers are full.
    with trio.fail_after(10):
        while host.answered < 1:
            await trio.sleep(0.01)
    return message


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("kind", KINDS)
async def test_a_well_behaved_host_still_answers(
    nursery: trio.Nursery, side: str, kind: str
) -> None:
    host = MisbehavingHost("ok")
    await nursery.start(host.run)
    out = await answer(side, kind, host.url)
    assert out[:-1] == ["hi"] and isinstance(out[-1], Finish), out


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("kind", KINDS)
async def test_a_huge_line_is_cut_at_its_bound(nursery: trio.Nursery, side: str, kind: str) -> None:
    host = MisbehavingHost("huge_line")
    await nursery.start(host.run)
    await fails(side, kind, host, f"{kind}: a stream line ran past {MAX_LINE_BYTES:,} bytes")
    assert host.sent <= MAX_LINE_BYTES + BUFFERED, host.sent


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("kind", KINDS)
async def test_an_error_body_is_read_to_4_kib_and_the_connection_closed(
    nursery: trio.Nursery, side: str, kind: str
) -> None:
    host = MisbehavingHost("huge_error")
    await nursery.start(host.run)
    message = await fails(side, kind, host, f"{kind}: HTTP 500: xxx")
    assert message.endswith("…")  # quoted short, from the body's first 4 KiB
    assert host.sent <= BUFFERED < HUGE, host.sent


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("kind", KINDS)
async def test_a_stream_that_never_ends_is_cut_at_the_stream_bound(
    nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch, side: str, kind: str
) -> None:
    # The real bound is 128 MiB (tests/e2e/test_host_bounds.py sends that much); 4 MiB here.
    monkeypatch.setattr(bounded_reads, "MAX_STREAM_BYTES", 4 * 1024 * 1024)
    host = MisbehavingHost("endless")
    await nursery.start(host.run)
    await fails(side, kind, host, f"{kind}: the stream ran past 4,194,304 bytes")
    assert host.sent <= 4 * 1024 * 1024 + BUFFERED, host.sent


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("kind", KINDS)
async def test_a_compressed_answer_is_refused_unread(
    nursery: trio.Nursery, side: str, kind: str
) -> None:
    host = MisbehavingHost("compressed")
    await nursery.start(host.run)
    await fails(side, kind, host, f"{kind}: the answer came compressed, none was asked for")


@pytest.mark.parametrize("polls", ["huge", "huge_error", "nested"])
@pytest.mark.parametrize("kind", KINDS)
async def test_a_poll_answer_is_read_to_its_bound_an_error_not_at_all(
    nursery: trio.Nursery, polls: str, kind: str
) -> None:
    host = MisbehavingHost(polls=polls)
    await nursery.start(host.run)
    spec = HostSpec(url=host.url, kind=kind)
    async with httpx.AsyncClient() as client:
        record = await poll_host(client, "box", spec, timeout_s=10)
    assert record["reachable"] is False, record
    expected = {
        "huge": f"longer than {MAX_BODY_BYTES:,} bytes",
        "huge_error": "answered HTTP 500",
        "nested": "the answer is not JSON",  # not a RecursionError that ends the monitor
    }[polls]
    assert expected in record["error"], record


async def test_the_agent_reads_api_ps_to_its_bound(nursery: trio.Nursery) -> None:
    good, huge, nested = (
        MisbehavingHost(),
        MisbehavingHost(polls="huge"),
        MisbehavingHost(polls="nested"),
    )
    for host in (good, huge, nested):
        await nursery.start(host.run)
    for host, expected in ((good, ["llama3"]), (huge, None), (nested, None)):
        backend = OllamaBackend(host.url)
        try:
            assert await backend.resident(("llama3", "other")) == expected
        finally:
            await backend.aclose()
