"""Choosing a node for a task."""

from __future__ import annotations

import heapq
import random
from collections.abc import Collection, Iterable
from dataclasses import dataclass

from coordinator.errors import AllNodesBusy, NoNodeForModel

# A node nobody has rated yet ranks like an average one, neither first nor last.
NEUTRAL_RATING = 3.0


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

    @property
    def has_capacity(self) -> bool:
        return self.in_flight < self.max_parallel


def rank_candidates(
    nodes: Iterable[NodeView],
    *,
    rng: random.Random | None = None,
    last: Collection[str] = frozenset(),
    limit: int | None = None,
) -> list[NodeView]:
    """Nodes in the order to try them for a lease: those with a free slot as this instance
    sees them first, then fewest tasks in flight, then best rating; connections in ``last``
    (they turned this task down as full) at the end. Ties are shuffled with ``rng`` (spreads
    idle load) or, without one, go to the smallest node id (fully deterministic).

    The view may be up to a beat old: the lease, not this order, decides whether a node has
    room, so full-looking nodes stay candidates (after the others).

    ``limit``: only the first ``limit`` of that order (the same nodes in the same order as
    slicing the full order, found without sorting every node: placement among thousands).
    """
    nodes = sorted(nodes, key=lambda n: n.node_id)
    if rng is not None:
        rng.shuffle(nodes)  # a stable sort below keeps this order among equals

    def rank(n: NodeView) -> tuple[bool, bool, int, float]:
        rating = NEUTRAL_RATING if n.rating is None else n.rating
        return (n.conn_id in last, not n.has_capacity, n.in_flight, -rating)

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
