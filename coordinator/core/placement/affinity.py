"""Prefix affinity: which node is predicted to hold a request's prefix in its KV cache, and how
much that is worth against the node's load.

A model server (Ollama, llama.cpp) keeps the KV cache of recent conversations; the next turn
of a chat sent to the node that served the last one skips re-reading the history. No node says
what it holds, so the prediction comes from our own decisions: when a task ends, the node that
ran it is recorded as holding the blocks of its conversation (the answer included); when a
request is placed, each candidate's longest recorded prefix is looked up (the
``PrefixAffinity`` role of the shared store), and ``rank_by_affinity`` weighs it against the
candidate's load.

The content is cut into blocks of ``BLOCK_CHARS`` characters of one canonical text (a
conversation's messages one after the other, a prompt as it is), and block ``k``'s hash is
chained over every block before it, so one hash names the whole prefix up to the end of its
block: a node that holds block ``k`` holds the prefix through ``k``. Pure functions.
"""

from __future__ import annotations

import hashlib
import heapq
import random
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from coordinator.core.placement.choose import (
    NEUTRAL_RATING,
    NodeView,
    rank_candidates,
    shuffle_by_weight,
)
from protocol import Message

__all__ = [
    "BLOCK_CHARS",
    "FULL_WEIGHT_BLOCKS",
    "MAX_BLOCKS",
    "AffinityWeights",
    "PrefixPrediction",
    "affinity_cost",
    "answered_hashes",
    "block_hashes",
    "longest_prefixes",
    "prefix_text",
    "rank_by_affinity",
    "worth_a_lookup",
]

#: characters per block (about 64 tokens of English): small enough that a new turn loses at
#: most one block of what the node holds, large enough that a lookup stays a few hundred fields
BLOCK_CHARS = 256
#: blocks looked at per request (the first 128 Ki characters; what lies beyond is not told
#: apart: two prompts alike that far are predicted alike)
MAX_BLOCKS = 512

#: a predicted prefix counts for its share of the request's blocks, or of this many when the
#: request is shorter (4 Ki characters, about a thousand tokens): a short prefix saves a node
#: little reading, and a system prompt every conversation shares must not pull new
#: conversations onto the few nodes recorded as holding it
FULL_WEIGHT_BLOCKS = 16

# Separators that cannot be mistaken for text a client sends as one message.
_ROLE_END, _MESSAGE_END = "\x1f", "\x1e"


def prefix_text(prompt: str | None, messages: Sequence[Message] | None) -> str:
    """The canonical text of a task's content: a conversation's messages one after the
    other (each role, then its content), or the raw prompt. The text of a conversation is a
    prefix of the text of the same conversation with more messages, as a node's cache is."""
    if messages is not None:
        return "c" + "".join(f"{m.role}{_ROLE_END}{m.content}{_MESSAGE_END}" for m in messages)
    return "p" + (prompt or "")


def block_hashes(text: str) -> list[str]:
    """The chained hash of each block of ``text`` (the last one may be partial), at most
    ``MAX_BLOCKS``: hex strings of 16 digits."""
    hashes: list[str] = []
    chain = b""
    end = min(len(text), BLOCK_CHARS * MAX_BLOCKS)
    for start in range(0, end, BLOCK_CHARS):
        block = text[start : start + BLOCK_CHARS].encode("utf-8", "surrogatepass")
        chain = hashlib.blake2b(chain + block, digest_size=8).digest()
        hashes.append(chain.hex())
    return hashes


def answered_hashes(text: str, messages: bool, output: str) -> list[str]:
    """What the node that answered holds after the task: the blocks of the content it read,
    and of that content followed by its answer (the next turn of a chat sends the answer
    back as an assistant message; a raw prompt continues with the answer's text). Nothing
    when that is shorter than one block (``worth_a_lookup``)."""
    if messages:
        extended = f"{text}assistant{_ROLE_END}{output}{_MESSAGE_END}"
    else:
        extended = text + output
    if len(extended) < BLOCK_CHARS:
        return []  # not one whole block: nothing a later request would be looked up for
    hashes = block_hashes(extended)
    # The content's own last block is partial where the answer begins: a retry matches it.
    read = block_hashes(text)
    if read and read[-1] not in hashes:
        hashes.append(read[-1])
    return hashes


def worth_a_lookup(text: str) -> bool:
    """Whether a request's content is long enough to look its prefix up: at least one whole
    block. A shorter one saves a node little reading, and could match nothing but an identical
    retry; it is placed by load alone, at no cost to the store."""
    return len(text) >= BLOCK_CHARS


def longest_prefixes(holders: Sequence[Collection[str]]) -> dict[str, int]:
    """node id -> how many blocks of the request it holds, from who holds each block (in
    block order): the deepest block a node holds (a chained hash names the whole prefix)."""
    longest: dict[str, int] = {}
    for depth, nodes in enumerate(holders, start=1):
        for node_id in nodes:
            longest[node_id] = depth
    return longest


@dataclass(frozen=True, slots=True)
class AffinityWeights:
    """How a candidate's predicted prefix (the fraction of the request's blocks it holds, 0 to
    1) weighs against its load (its share of busy slots, 0 to 1, plus 1 when it looks full).
    With ``load`` at least ``prefix``, a node with a free slot always ranks before one
    without; with ``prefix`` larger, a node holding much of the prefix may be tried first
    even when it looks full (the lease, never this order, decides whether it has room)."""

    prefix: float = 1.0
    load: float = 1.0


@dataclass(frozen=True, slots=True)
class PrefixPrediction:
    """What placement knows of one request's prefix: node id -> the fraction of its blocks
    that node is predicted to hold (absent: none), and the weights to rank with."""

    held: Mapping[str, float] = field(default_factory=dict)
    weights: AffinityWeights = AffinityWeights()

    @classmethod
    def of(
        cls, longest: Mapping[str, int], blocks: int, weights: AffinityWeights
    ) -> PrefixPrediction:
        """From ``longest_prefixes`` of a request of ``blocks`` blocks: each node's share of
        them (of ``FULL_WEIGHT_BLOCKS`` for a shorter request)."""
        whole = max(blocks, FULL_WEIGHT_BLOCKS)
        return cls({n: min(1.0, d / whole) for n, d in longest.items() if d > 0}, weights)

    def best(self, nodes: Iterable[NodeView]) -> float:
        """The largest fraction any of ``nodes`` is predicted to hold (0: none holds any)."""
        return max((self.held.get(n.node_id, 0.0) for n in nodes), default=0.0)


def affinity_cost(view: NodeView, held: float, weights: AffinityWeights) -> float:
    """Lower is better: the load the node carries, less the prefix it is predicted to hold."""
    # A node with no slots at all is as occupied as a full one (never less: with an occupancy
    # of 0 a predicted prefix could rank it before a free node).
    occupancy = view.in_flight / view.max_parallel if view.max_parallel > 0 else 1.0
    full = 0.0 if view.has_capacity else 1.0
    return weights.load * (occupancy + full) - weights.prefix * held


def rank_by_affinity(
    nodes: Iterable[NodeView],
    prediction: PrefixPrediction | None,
    *,
    rng: random.Random | None = None,
    last: Collection[str] = frozenset(),
    limit: int | None = None,
) -> list[NodeView]:
    """``rank_candidates``, with each candidate's predicted prefix weighed against its load
    (``affinity_cost``) when any candidate is predicted to hold some of it; without a
    prediction, or when none of them holds anything, exactly ``rank_candidates``. Connections
    in ``last`` (they turned the task down as full) still come last; ties keep
    ``rank_candidates``' tie-breaks (a free slot, fewest in flight per unit of weight, best
    rating, then ``rng`` by weight or node id).
    Only the order changes: the lease still decides who has room."""
    nodes = list(nodes)
    if prediction is None or prediction.best(nodes) <= 0.0:
        return rank_candidates(nodes, rng=rng, last=last, limit=limit)
    nodes.sort(key=lambda n: n.node_id)
    if rng is not None:
        shuffle_by_weight(nodes, rng)  # a stable sort below keeps this order among equals
    held, weights = prediction.held, prediction.weights

    def rank(n: NodeView) -> tuple[bool, float, bool, float, float]:
        rating = NEUTRAL_RATING if n.rating is None else n.rating
        cost = affinity_cost(n, held.get(n.node_id, 0.0), weights)
        return (n.conn_id in last, cost, not n.has_capacity, n.load, -rating)

    if limit is not None and limit < len(nodes):
        return heapq.nsmallest(limit, nodes, key=rank)
    return sorted(nodes, key=rank)
