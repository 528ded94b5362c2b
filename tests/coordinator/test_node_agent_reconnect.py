"""Where and when a node agent dials next (tools/node_agent/reconnect.py): the coordinators in
turn on any loss, the next one at once when told to move (4004), otherwise full-jitter backoff
capped by ``--reconnect-max-s``. Pure tests with a seeded generator and no sleeping, then one
agent against two fake coordinators on real sockets."""

from __future__ import annotations

import random

import pytest
import trio

from protocol import CloseCode
from tests.coordinator.test_node_agent import FakeCoordinator, start_agent, wait_until
from tools.node_agent import backoff_delay, coordinator_ws_url
from tools.node_agent.reconnect import Reconnects
from tools.node_agent.settings import NodeSettings, UsageError

URLS = ("ws://a/ws/node", "ws://b/ws/node", "ws://c/ws/node")
LOST = CloseCode.ABNORMAL_CLOSURE


def plan(seed: int = 7, *, urls: tuple[str, ...] = URLS, max_s: float = 5.0) -> Reconnects:
    return Reconnects(urls, random.Random(seed), initial_s=0.5, max_s=max_s)


def test_every_loss_moves_on_to_the_next_coordinator_in_turn() -> None:
    dialing = plan()
    seen = [dialing.url]
    for welcomed, code in [(True, LOST), (False, None), (False, 1011), (True, 1000)]:
        dialing.after(welcomed=welcomed, close_code=code)
        seen.append(dialing.url)
    assert seen == [URLS[0], URLS[1], URLS[2], URLS[0], URLS[1]]


def test_told_to_move_it_dials_the_next_one_at_once() -> None:
    dialing = plan()
    dialing.after(welcomed=False, close_code=None)  # one failure first: the backoff grew
    assert dialing.after(welcomed=True, close_code=CloseCode.MOVE) == 0.0
    assert dialing.url == URLS[2] and dialing.failures == 0


def test_moves_beyond_one_round_back_off() -> None:
    """Every instance draining at once (each refuses the hello with 4004): one round at once,
    then the backoff, so the agent does not spin."""
    dialing = plan()
    delays = [dialing.after(welcomed=False, close_code=CloseCode.MOVE) for _ in range(5)]
    assert delays[:3] == [0.0, 0.0, 0.0]
    rng = random.Random(7)
    assert delays[3:] == [backoff_delay(k, rng, initial_s=0.5, max_s=5.0) for k in range(2)]
    # A welcome starts a new round.
    assert dialing.after(welcomed=True, close_code=CloseCode.MOVE) == 0.0


def test_failures_back_off_with_full_jitter_up_to_the_cap() -> None:
    dialing = plan(seed=3, urls=URLS[:1], max_s=5.0)
    delays = [dialing.after(welcomed=False, close_code=LOST) for _ in range(40)]
    rng = random.Random(3)
    assert delays == [backoff_delay(k, rng, initial_s=0.5, max_s=5.0) for k in range(40)]
    # Full jitter: uniform in [0, ceiling], the ceiling doubling from 0.5 s up to the cap.
    assert all(0 <= d <= min(5.0, 0.5 * 2**k) for k, d in enumerate(delays))
    assert max(delays[4:]) > 2.5 and max(delays) <= 5.0
    assert dialing.url == URLS[0]  # one coordinator (a load balancer): the same, again
    # A welcome resets the exponent: the next wait is at most the first ceiling.
    assert dialing.after(welcomed=True, close_code=LOST) <= 0.5


def test_the_cli_takes_several_coordinators_and_a_reconnect_cap() -> None:
    base = {"node_id": "n1", "token": "t", "models": ["m"]}
    one = NodeSettings.parse(coordinator="http://a:8000", **base)
    assert one.ws_urls == ("ws://a:8000/ws/node",) and one.reconnect_max_s == 5.0
    many = NodeSettings.parse(
        coordinator=["http://a:8000", "https://b", "http://a:8000"], reconnect_max_s="2", **base
    )
    assert many.ws_urls == ("ws://a:8000/ws/node", "wss://b/ws/node")
    assert many.ws_url == many.ws_urls[0] and many.reconnect_max_s == 2.0
    for bad in ("0", "-1", "x", "7200"):
        with pytest.raises(UsageError, match="--reconnect-max-s"):
            NodeSettings.parse(coordinator="http://a", reconnect_max_s=bad, **base)
    with pytest.raises(UsageError, match="--coordinator"):
        NodeSettings.parse(coordinator=["http://a", "ftp://b"], **base)


async def test_an_agent_told_to_move_connects_to_the_next_coordinator_at_once(
    nursery: trio.Nursery,
) -> None:
    first, second = FakeCoordinator(), FakeCoordinator()
    await nursery.start(first.run)
    await nursery.start(second.run)
    urls = (coordinator_ws_url(first.url), coordinator_ws_url(second.url))
    # A backoff of 10 s: only the move path can reconnect within the bound below.
    start_agent(nursery, first.url, ws_urls=urls, backoff_initial_s=10.0, backoff_max_s=10.0)
    on_first = await first.next_conn()
    moved_at = trio.current_time()
    await on_first.close(CloseCode.MOVE, "draining")
    on_second = await second.next_conn(timeout=3)
    assert trio.current_time() - moved_at < 1.0
    assert on_second.hello.node_id == "node-1"
    # Lost without a word (not a move): to the next one in turn, the first, after a backoff.
    await on_second.drop()
    await wait_until(lambda: len(first.hellos) == 2, timeout=15)
