"""Choosing a node for a task.

**Weight.** A direct host may carry a ``weight`` (the operator file's, 0 < w <= 1000; agent
nodes weigh 1). It counts twice, both times so that a host of weight 3 beside one of weight 1
takes three in four of their placements:

* its load counts as ``in_flight / weight`` (weighted least connections: under load, tasks in
  flight settle in proportion to the weights), and
* among candidates equal in every respect, one of weight ``w`` comes first with probability
  ``w / (sum of their weights)`` (a weighted shuffle with the placement's seeded ``Random``:
  when each task ends before the next arrives, the share of first choices is the weight's).

With every weight 1 both are exactly the unweighted order (the same draws from ``rng``).
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from coordinator.errors import AllNodesBusy, NoNodeForModel

# A node nobody has rated yet ranks like an average one, neither first nor last.
NEUTRAL_RATING = 3.0

#: Placement among more nodes serving a model than this looks at a random sample of
#: ``SAMPLE_SIZE`` of them instead of ranking every one ("power of d choices": the least loaded
#: of 32 random nodes is, for balancing load, as good as the least loaded of all, and its cost
#: does not grow with the fleet). At or below it, every node is ranked (exact, as before).
SAMPLE_ABOVE = 64
SAMPLE_SIZE = 32

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class Indexable(Protocol[T_co]):
    """What ``sample_across`` draws from: a list, or a ``Pool``."""

    def __len__(self) -> int: ...
    def __getitem__(self, i: int, /) -> T_co: ...


@dataclass(frozen=True, slots=True)
class NodeView:
    """What placement needs to know about one connected node, wherever it is connected."""

    node_id: str
    instance_id: str
    conn_id: str
    models: frozenset[str]
    max_parallel: int
    in_flight: int
    rating: float | None = None
    #: the owner's life (``InstanceSnapshot.incarnation``) the view was read from
    incarnation: str = ""
    #: its share of placement against equals (module docstring); agent nodes weigh 1
    weight: float = 1.0

    @property
    def has_capacity(self) -> bool:
        return self.in_flight < self.max_parallel

    @property
    def load(self) -> float:
        """Tasks in flight per unit of weight: what placement balances."""
        return self.in_flight / self.weight


def shuffle_by_weight(nodes: list[NodeView], rng: random.Random) -> None:
    """Shuffle ``nodes`` in place so that each comes first with probability its weight over
    the sum of the weights (and so on down the list). Every weight equal: ``rng.shuffle``
    itself, so an unweighted fleet sees the same order from the same seed as before."""
    if all(n.weight == nodes[0].weight for n in nodes):
        rng.shuffle(nodes)
        return
    # Each node's "arrival" is exponential with rate ``weight``; the earliest of such clocks
    # is node i with probability w_i / sum(w) (Efraimidis-Spirakis, in log form). ``1 -
    # random()`` is in (0, 1], so the log is finite.
    arrival = {id(n): -math.log(1.0 - rng.random()) / n.weight for n in nodes}
    nodes.sort(key=lambda n: arrival[id(n)])


def rank_candidates(
    nodes: Iterable[NodeView],
    *,
    rng: random.Random | None = None,
    last: Collection[str] = frozenset(),
    limit: int | None = None,
) -> list[NodeView]:
    """Nodes in the order to try them for a lease: those with a free slot as this instance
    sees them first, then fewest tasks in flight, then best rating; connections in ``last``
    (they turned this task down as full) at the end. "Tasks in flight" counts per unit of
    weight, and ties are shuffled with ``rng`` by weight (spreads idle load; the module
    docstring) or, without one, go to the smallest node id (fully deterministic).

    The view may be up to a beat old: the lease, not this order, decides whether a node has
    room, so full-looking nodes stay candidates (after the others).

    ``limit``: only the first ``limit`` of that order (the same nodes in the same order as
    slicing the full order, found without sorting every node: placement among thousands).
    """
    nodes = sorted(nodes, key=lambda n: n.node_id)
    if rng is not None:
        shuffle_by_weight(nodes, rng)  # a stable sort below keeps this order among equals

    def rank(n: NodeView) -> tuple[bool, bool, float, float]:
        rating = NEUTRAL_RATING if n.rating is None else n.rating
        return (n.conn_id in last, not n.has_capacity, n.load, -rating)

    if limit is not None and limit < len(nodes):
        # nsmallest is stable (equal ranks keep their shuffled order), like sorted()[:limit].
        return heapq.nsmallest(limit, nodes, key=rank)
    return sorted(nodes, key=rank)


def choose_node(
    nodes: Iterable[NodeView], model: str, *, rng: random.Random | None = None
) -> NodeView:
    """The first node ``rank_candidates`` would try for ``model`` among those with a free
    slot. Raises NoNodeForModel when no online node serves the model and AllNodesBusy when
    every node serving it is at its max parallel (as this instance sees them)."""
    serving = [n for n in nodes if model in n.models]
    if not serving:
        raise NoNodeForModel(f"no online node serves model {model!r}", retry_after_s=5)
    free = [n for n in serving if n.has_capacity]
    if not free:
        raise AllNodesBusy(
            f"all {len(serving)} node(s) serving model {model!r} are at their parallel limit",
            retry_after_s=1,
        )
    return rank_candidates(free, rng=rng)[0]


class Pool(Generic[T]):
    """Items by key, in a list that a random index can be drawn from: add, remove and pick are
    O(1) (a removal moves the last item into the hole). The nodes serving one model."""

    def __init__(self) -> None:
        self._items: list[T] = []
        self._keys: list[str] = []
        self._index: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._items)

    def __getitem__(self, i: int) -> T:
        return self._items[i]

    def add(self, key: str, item: T) -> None:
        if key in self._index:
            self._items[self._index[key]] = item
            return
        self._index[key] = len(self._items)
        self._items.append(item)
        self._keys.append(key)

    def remove(self, key: str) -> None:
        i = self._index.pop(key, None)
        if i is None:
            return
        last_item, last_key = self._items.pop(), self._keys.pop()
        if i < len(self._items):
            self._items[i], self._keys[i] = last_item, last_key
            self._index[last_key] = i


def sample_across(pools: Sequence[Indexable[T]], k: int, rng: random.Random) -> list[T]:
    """``k`` distinct items drawn uniformly from the pools taken together (all of them when
    they hold ``k`` or fewer). O(k), whatever their sizes."""
    sizes = [len(p) for p in pools]
    total = sum(sizes)
    picked = []
    for i in rng.sample(range(total), min(k, total)):
        for pool, size in zip(pools, sizes, strict=True):
            if i < size:
                picked.append(pool[i])
                break
            i -= size
    return picked


def needs_full_scan(sample: Sequence[NodeView], full: Collection[str]) -> bool:
    """Whether a sample is not enough to place on: none of its nodes looks free (and did not
    already turn the task down). The whole pool is then ranked, so that a free node anywhere is
    found however few are left (near saturation placement costs O(nodes) again)."""
    return not any(v.has_capacity and v.conn_id not in full for v in sample)
