"""Prefix affinity's pure parts (``core/placement/affinity.py``): chained block hashes that name
whole prefixes, the longest prefix per node, and the ranking that weighs it against load — which
never puts a node without a free slot before one with while the load weight is at least the
prefix weight, and is exactly the load-only ranking when nothing is predicted."""

from __future__ import annotations

import random

from hypothesis import example, given
from hypothesis import strategies as st

from coordinator.core.placement.affinity import (
    BLOCK_CHARS,
    FULL_WEIGHT_BLOCKS,
    MAX_BLOCKS,
    AffinityWeights,
    PrefixPrediction,
    answered_hashes,
    block_hashes,
    longest_prefixes,
    prefix_text,
    rank_by_affinity,
    worth_a_lookup,
)
from coordinator.core.placement.choose import NodeView, rank_candidates
from protocol import Message


def view(
    node_id: str, in_flight: int = 0, max_parallel: int = 4, rating: float | None = None
) -> NodeView:
    return NodeView(
        node_id=node_id,
        instance_id="A",
        conn_id=f"c-{node_id}",
        models=frozenset({"m"}),
        max_parallel=max_parallel,
        in_flight=in_flight,
        rating=rating,
    )


@given(st.text(max_size=3 * BLOCK_CHARS), st.text(min_size=1, max_size=2 * BLOCK_CHARS))
def test_a_block_hash_names_the_whole_prefix_up_to_its_end(text: str, more: str) -> None:
    full = len(text) // BLOCK_CHARS
    assert block_hashes(text + more)[:full] == block_hashes(text)[:full]
    # Another first character: no block of the longer text is any block of the other.
    other = block_hashes(("x" if text[:1] != "x" else "y") + text[1:] + more)
    assert not set(other) & set(block_hashes(text + more))


def test_hashes_are_bounded_and_a_conversation_extends_its_own_text() -> None:
    assert len(block_hashes("a" * BLOCK_CHARS * (MAX_BLOCKS + 3))) == MAX_BLOCKS
    assert block_hashes("") == []
    turn = [Message(role="user", content="hello " * 100)]
    later = [*turn, Message(role="assistant", content="hi"), Message(role="user", content="?")]
    assert prefix_text(None, later).startswith(prefix_text(None, turn))
    # A prompt and a conversation of the same words are different prefixes.
    assert prefix_text("x", None) != prefix_text(None, [Message(role="user", content="x")])


def test_the_next_turn_matches_what_the_answering_node_holds() -> None:
    first = [Message(role="system", content="be brief " * 40), Message(role="user", content="q1")]
    held = answered_hashes(prefix_text(None, first), True, "the answer")
    second = [
        *first,
        Message(role="assistant", content="the answer"),
        Message(role="user", content="q2 " * 100),
    ]
    wanted = block_hashes(prefix_text(None, second))
    matched = longest_prefixes([["n1"] if h in held else [] for h in wanted])
    # Every block up to the one where the new question begins.
    assert matched["n1"] == len(prefix_text(None, [*first, second[2]])) // BLOCK_CHARS
    # A retry of the same content matches it all, its partial last block included.
    assert set(block_hashes(prefix_text(None, first))) <= set(held)


def test_longest_prefix_is_the_deepest_block_held() -> None:
    assert longest_prefixes([["a", "b"], ["a"], [], ["a", "c"]]) == {"a": 4, "b": 1, "c": 4}
    assert PrefixPrediction.of({"a": 20, "b": 5}, 40, AffinityWeights()).held == {
        "a": 0.5,
        "b": 0.125,
    }
    # A short request's prefix counts for its share of FULL_WEIGHT_BLOCKS.
    short = PrefixPrediction.of({"a": 4}, 5, AffinityWeights()).held
    assert short == {"a": 4 / FULL_WEIGHT_BLOCKS}


def test_a_node_holding_the_prefix_goes_first_unless_it_is_full() -> None:
    prediction = PrefixPrediction({"n1": 0.8}, AffinityWeights())
    busy_affine, idle = view("n1", in_flight=2), view("n2", rating=5.0)
    assert [v.node_id for v in rank_by_affinity([idle, busy_affine], prediction)] == ["n1", "n2"]
    full_affine = view("n1", in_flight=4)
    assert [v.node_id for v in rank_by_affinity([idle, full_affine], prediction)] == ["n2", "n1"]
    # A node that turned the task down as full comes last, whatever it holds.
    ranked = rank_by_affinity([idle, busy_affine], prediction, last={"c-n1"})
    assert [v.node_id for v in ranked] == ["n2", "n1"]
    # A large prefix weight tries even a full-looking node first (the lease decides).
    heavy = PrefixPrediction({"n1": 0.8}, AffinityWeights(prefix=10.0))
    assert rank_by_affinity([idle, full_affine], heavy)[0].node_id == "n1"


def test_ties_keep_the_load_ranking_tie_breaks() -> None:
    nodes = [view("b"), view("a"), view("c", rating=4.0)]
    same = PrefixPrediction({"a": 0.5, "b": 0.5, "c": 0.5}, AffinityWeights())
    # Equal cost: best rating, then the smallest node id (no rng: deterministic).
    assert [v.node_id for v in rank_by_affinity(nodes, same)] == ["c", "a", "b"]
    assert [v.node_id for v in rank_by_affinity(nodes, same, limit=2)] == ["c", "a"]


views = st.builds(
    view,
    st.sampled_from([f"n{i}" for i in range(8)]),
    in_flight=st.integers(0, 6),
    max_parallel=st.integers(0, 4),
    rating=st.none() | st.floats(1, 5),
)
fractions = st.floats(0.0, 1.0, allow_nan=False)


def _distinct(nodes: list[NodeView]) -> list[NodeView]:
    return list({v.node_id: v for v in nodes}.values())


@given(
    st.lists(views, min_size=1, max_size=8).map(_distinct),
    st.dictionaries(st.sampled_from([f"n{i}" for i in range(8)]), fractions),
    st.floats(0.0, 10.0),
    st.floats(0.0, 10.0),
    st.integers(0, 2**32),
)
# Found by hypothesis: a node with no slots (max_parallel 0) counted as unoccupied, so its
# predicted prefix outweighed a half-busy free node.
@example([view("n0", 0, 0), view("n1", 1, 2)], {"n0": 1.0}, 1.0, 0.0, 0)
def test_affinity_never_ranks_a_full_node_before_a_free_one_when_load_weighs_as_much(
    nodes: list[NodeView], held: dict[str, float], prefix: float, extra: float, seed: int
) -> None:
    weights = AffinityWeights(prefix=prefix, load=prefix + extra)
    ranked = rank_by_affinity(nodes, PrefixPrediction(held, weights), rng=random.Random(seed))
    assert sorted(v.node_id for v in ranked) == sorted(v.node_id for v in nodes)
    capacity = [v.has_capacity for v in ranked]
    assert capacity == sorted(capacity, reverse=True), ranked  # every free one first


@given(
    st.lists(views, min_size=1, max_size=8).map(_distinct),
    st.dictionaries(st.sampled_from([f"n{i}" for i in range(8)]), st.just(0.0)),
    st.integers(0, 2**32),
    st.none() | st.integers(1, 8),
)
def test_without_a_prediction_the_ranking_is_the_load_ranking(
    nodes: list[NodeView], held: dict[str, float], seed: int, limit: int | None
) -> None:
    expected = rank_candidates(nodes, rng=random.Random(seed), limit=limit)
    for prediction in (None, PrefixPrediction(held, AffinityWeights())):
        got = rank_by_affinity(nodes, prediction, rng=random.Random(seed), limit=limit)
        assert got == expected


def test_the_benchmark_node_reads_only_what_its_cache_does_not_hold() -> None:
    """tools/node_agent/prefix_cache.py, the node model of tools/bench/affinity.py."""
    import pytest

    from tools.node_agent.backends import EchoBackend
    from tools.node_agent.prefix_cache import PrefixCache, PrefixCachedEcho, from_env
    from tools.node_agent.settings import UsageError

    cache = PrefixCache(entries=2)
    assert cache.read(["s", "a"], ["x"]) == 2
    assert cache.read(["s", "a", "x", "b"], ["y"]) == 1  # the next turn: only the new part
    assert cache.read(["s", "c"], []) == 1  # the shared system prompt is held
    assert cache.read(["t"], []) == 1  # the longest conversation is evicted (LRU of 2)
    assert cache.read(["s", "a", "x", "b", "y", "z"], []) == 5
    echo = EchoBackend()
    assert from_env(echo, {}) is echo
    assert isinstance(from_env(echo, {"GEMMANET_ECHO_PREFIX_CACHE": "2,8"}), PrefixCachedEcho)
    with pytest.raises(UsageError):
        from_env(echo, {"GEMMANET_ECHO_PREFIX_CACHE": "fast"})


def test_among_many_nodes_the_predicted_ones_join_the_sample() -> None:
    """Above SAMPLE_ABOVE nodes a placement ranks a random sample; a node the prediction
    names, local or on a peer, is a candidate whether or not it was drawn."""
    from coordinator.core.instance_machine import InstanceMachine
    from coordinator.core.placement.choose import SAMPLE_ABOVE
    from protocol import Assign
    from tests.coordinator.test_placement_sampling import connection, peer

    machine = InstanceMachine("A", forward_grace_s=1.0, rng=random.Random(2))
    for i in range(SAMPLE_ABOVE):
        machine.node_connected(connection(f"A-c{i}"), 0.0)
    machine.set_peers([peer("B", SAMPLE_ABOVE)])
    for i, wanted in enumerate(["A-c17", "B-n40"] * 10):
        prediction = PrefixPrediction({wanted: 0.9, "gone": 1.0}, AffinityWeights())
        task = Assign(task_id=f"t{i}", model="m", prompt="x")
        machine.requester.submit(task, deadline=1e9, prediction=prediction)
        found = machine.requester.candidates(task.task_id, 1)
        assert found is not None and found[0].node_id == wanted, found[:2]


def test_content_shorter_than_a_block_is_neither_looked_up_nor_recorded() -> None:
    assert not worth_a_lookup("p" + "x" * (BLOCK_CHARS - 2))
    assert worth_a_lookup("p" + "x" * (BLOCK_CHARS - 1))
    assert answered_hashes("cuser\x1fhi\x1e", True, "hello") == []
    # Its answer may make it long enough: then it is recorded (two blocks, and the content's
    # own, for a retry).
    assert len(answered_hashes("pshort", False, "y" * BLOCK_CHARS)) == 3
