"""A hypothesis fuzz of the node WebSocket against a real ``gemmanet serve`` (issue 13): any
sequence of frames — text or binary, JSON or not, envelopes of every kind with wrong values,
before or after a valid handshake — ends only in a documented close code (or with the socket
still open), never an internal error or a dropped connection, and the process keeps serving."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from trio_websocket import ConnectionClosed, open_websocket_url

from protocol import CloseCode, Heartbeat, Hello, Result, Welcome, decode_node, encode
from tests.fixtures.processes import Coordinator, Processes
from tests.fixtures.raw_node import ws_url
from tests.protocol.strategies import dumps, json_values, near_envelopes, node_envelopes

pytestmark = pytest.mark.e2e

#: what the coordinator may close a node's socket with (docs/interface.md, "Close codes")
DOCUMENTED = {
    CloseCode.NORMAL,
    CloseCode.TRY_AGAIN_LATER,
    CloseCode.REPLACED,
    CloseCode.AUTH_FAILED,
    CloseCode.PROTOCOL_ERROR,
    CloseCode.HEARTBEAT_TIMEOUT,
}

frames = st.one_of(
    near_envelopes.map(dumps),
    node_envelopes.map(lambda e: encode(e).decode()),
    json_values.map(dumps),
    st.text(max_size=200),
    st.binary(max_size=200),
)


@pytest.fixture(scope="module")
def node_socket(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Coordinator, str]]:
    procs = Processes(tmp_path_factory.mktemp("fuzz"))
    try:
        coord = procs.coordinator()
        yield coord, procs.enroll("fz")
    finally:
        procs.stop_all()


async def _play(url: str, token: str, handshake: bool, sent: list[str | bytes]) -> int | None:
    """Send the frames; the close code the coordinator ended with, or None if still open."""
    async with open_websocket_url(ws_url(url)) as ws:
        try:
            if handshake:
                hello = Hello(node_id="fz", token=token, models=["echo"], max_parallel=2)
                await ws.send_message(encode(hello).decode())
                assert isinstance(decode_node(await ws.get_message()), Welcome)
            for frame in sent:
                await ws.send_message(frame)
            # A last valid envelope and a moment for the coordinator to react to all of it.
            await ws.send_message(encode(Heartbeat()).decode())
            with trio.move_on_after(0.3):
                while True:
                    await ws.get_message()
        except ConnectionClosed as closed:
            return closed.reason.code
    return None


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(handshake=st.booleans(), sent=st.lists(frames, min_size=1, max_size=6))
def test_any_frames_end_in_a_documented_close_code(
    node_socket: tuple[Coordinator, str], handshake: bool, sent: list[str | bytes]
) -> None:
    coord, token = node_socket
    code = trio.run(_play, coord.url, token, handshake, sent)
    assert code is None or code in DOCUMENTED, (code, sent)
    assert coord.healthy()


def test_a_result_for_a_task_never_assigned_is_dropped_not_fatal(
    node_socket: tuple[Coordinator, str],
) -> None:
    """The fuzz's most likely valid envelope after a handshake, pinned as an example."""
    coord, token = node_socket
    code = trio.run(
        _play, coord.url, token, True, [encode(Result(task_id="nope", output="")).decode()]
    )
    assert code is None
    assert coord.status()["diagnostics"]["dropped_answers"]["unknown_task"] >= 1  # type: ignore[index]
