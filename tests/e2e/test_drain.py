"""SIGTERM drains a real coordinator process (docs/operations.md): ``/readyz`` turns 503 at
once while ``/healthz`` stays 200, a new request is refused with 503 ``instance_draining``
before any work, a short task in flight ends normally, an idle node is told to move (4004) at
once, and streams longer than the window end with the explicit shutdown error: the native SSE
stream in its ``error`` event, the OpenAI-compatible one in OpenAI's error shape (driven by the
``openai`` SDK). Then the process exits 0."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import httpx
import openai
import pytest
import trio

from protocol import CloseCode
from tests.fixtures.processes import Coordinator, Processes, wait_until
from tests.fixtures.raw_node import raw_node

pytestmark = pytest.mark.e2e

LONG = " ".join(f"w{i}" for i in range(40))  # 40 chunks, 0.25 s apart: 10 s, past the window


def native_stream(
    coord: Coordinator, key: str, started: trio.Event, token: trio.lowlevel.TrioToken
) -> list[dict[str, object]]:
    """The events of one streamed request, read to its end."""
    events: list[dict[str, object]] = []
    body = {"model": "slow", "prompt": LONG, "stream": True}
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.stream(
        "POST", f"{coord.url}/api/v1/request", json=body, headers=headers, timeout=30
    ) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
                if len(events) == 1:
                    trio.from_thread.run_sync(started.set, trio_token=token)
    return events


def openai_stream(
    coord: Coordinator, key: str, started: trio.Event, token: trio.lowlevel.TrioToken
) -> tuple[list[str], openai.APIError | None]:
    client = openai.OpenAI(api_key=key, base_url=coord.url + "/v1", max_retries=0)
    stream = client.chat.completions.create(
        model="slow", messages=[{"role": "user", "content": LONG}], stream=True
    )
    deltas: list[str] = []
    try:
        for chunk in stream:
            deltas.append(chunk.choices[0].delta.content or "")
            if len(deltas) == 2:
                trio.from_thread.run_sync(started.set, trio_token=token)
    except openai.APIError as exc:
        return deltas, exc
    return deltas, None


async def test_sigterm_drains_then_ends_long_streams_with_the_shutdown_error(
    procs: Processes,
) -> None:
    coord = procs.coordinator(GEMMANET_DRAIN_S="1.5")
    procs.node(coord, "slow-node", models=("slow",), extra=("--chunk-delay-ms", "250"))
    key = procs.create_key()
    token = trio.lowlevel.current_trio_token()
    async with (
        httpx.AsyncClient(base_url=coord.url, timeout=30) as http,
        trio.open_nursery() as nursery,
        raw_node(coord.url, "idle", procs.enroll("idle")) as idle,
    ):
        await trio.to_thread.run_sync(wait_until, lambda: coord.has_node("idle"), "idle node")
        results: dict[str, object] = {}

        async def run(name: str, fn, *args: object) -> None:  # type: ignore[no-untyped-def]
            results[name] = await trio.to_thread.run_sync(fn, *args)

        native_started, openai_started = trio.Event(), trio.Event()
        nursery.start_soon(run, "native", native_stream, coord, key, native_started, token)
        nursery.start_soon(run, "openai", openai_stream, coord, key, openai_started, token)
        with trio.fail_after(20):
            await native_started.wait()
            await openai_started.wait()
        quick_body = {"model": "slow", "prompt": "still in flight"}  # 0.75 s
        headers = {"Authorization": f"Bearer {key}"}
        assert (await http.get("/readyz")).status_code == 200

        async def quick() -> None:
            results["quick"] = await http.post("/api/v1/request", json=quick_body, headers=headers)

        nursery.start_soon(quick)
        await trio.sleep(0.3)  # the quick task is on its node
        coord.proc.send_signal(signal.SIGTERM)
        sent_at = time.monotonic()
        # Not ready at once; still alive.
        with trio.fail_after(5):
            while (await http.get("/readyz")).status_code != 503:
                await trio.sleep(0.02)
        ready = await http.get("/readyz")
        assert ready.json()["error"]["code"] == "instance_draining"
        assert (await http.get("/healthz")).json() == {"ok": True}
        refused = await http.post("/api/v1/request", json=quick_body, headers=headers)
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "instance_draining"
        assert int(refused.headers["Retry-After"]) >= 1
        # The idle node is told to move at once.
        assert await idle.close_code(timeout=5) == CloseCode.MOVE
        assert time.monotonic() - sent_at < 2
    assert await trio.to_thread.run_sync(lambda: coord.proc.wait(timeout=20)) == 0
    quick = results["quick"]
    assert isinstance(quick, httpx.Response) and quick.status_code == 200, quick
    assert quick.json()["output"] == "still in flight"
    events = results["native"]
    assert isinstance(events, list) and len(events) > 2
    *deltas, last = events
    assert all("delta" in e for e in deltas) and len(deltas) < 40
    assert last["error"]["code"] == "instance_shutting_down", last  # type: ignore[index]
    assert last["error"]["status"] == 503  # type: ignore[index]
    openai_deltas, error = results["openai"]  # type: ignore[misc]
    assert error is not None and error.code == "instance_shutting_down", (openai_deltas, error)
    assert 2 <= len(openai_deltas) < 40
    log = Path(coord.proc.log_path).read_text()  # type: ignore[attr-defined]
    assert "drain window over: ending 2 request(s)" in log, log[-3000:]
    assert "client_gone" not in log
