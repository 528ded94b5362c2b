"""The node agent's verdict on a silent coordinator counts only the time its own process ran
(tools/node_agent/silence.py); the end-to-end stall is tests/e2e/test_machine_stall.py."""

from __future__ import annotations

import trio
import trio.lowlevel
import trio.testing

from tools.node_agent.silence import receive_unless_silent


async def test_silence_is_declared_after_the_missed_intervals(
    autojump_clock: trio.testing.MockClock,
) -> None:
    _send, receive = trio.open_memory_channel[str](1)
    start = trio.current_time()
    assert await receive_unless_silent(receive.receive, interval_s=1.0, misses=3) is None
    assert trio.current_time() - start == 3.0


async def test_a_message_within_the_deadline_is_returned(
    autojump_clock: trio.testing.MockClock,
) -> None:
    send, receive = trio.open_memory_channel[str](1)

    async def later() -> None:
        await trio.sleep(2.9)
        send.send_nowait("heartbeat")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(later)
        assert await receive_unless_silent(receive.receive, interval_s=1.0, misses=3) == (
            "heartbeat"
        )


async def test_a_stall_of_our_own_process_is_not_the_coordinators_silence(
    mock_clock: trio.testing.MockClock,
) -> None:
    send, receive = trio.open_memory_channel[str](1)
    got: list[str | None] = []

    async def wait() -> None:
        got.append(await receive_unless_silent(receive.receive, interval_s=1.0, misses=3))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait)
        await trio.lowlevel.checkpoint()  # it waits
        mock_clock.jump(10.0)  # ten seconds pass while nothing here runs (a frozen process)
        await trio.lowlevel.checkpoint()
        await (
            trio.lowlevel.checkpoint()
        )  # it wakes up far too late: that was a stall, not a silence
        assert got == []
        send.send_nowait("heartbeat")  # what waited in the socket is read
    assert got == ["heartbeat"]
