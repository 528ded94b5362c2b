"""Choosing a node for a task."""

from __future__ import annotations

import random
from collections.abc import Iterable
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


def choose_node(
    nodes: Iterable[NodeView], model: str, *, rng: random.Random | None = None
) -> NodeView:
    """The node to run ``model`` on: fewest tasks in flight, then best rating, among the nodes
    serving the model with a free slot. Remaining ties go to ``rng`` (spreads idle load) or,
    without one, to the smallest node id (fully deterministic).

    Raises NoNodeForModel when no online node serves the model at all (refused at once, not
    queued) and AllNodesBusy when every node serving it is at its max parallel.
    """
    serving = [n for n in nodes if model in n.models]
    if not serving:
        raise NoNodeForModel(f"no online node serves model {model!r}", retry_after_s=5)
    free = [n for n in serving if n.has_capacity]
    if not free:
        raise AllNodesBusy(
            f"all {len(serving)} node(s) serving model {model!r} are at their parallel limit",
            retry_after_s=1,
        )

    def rank(n: NodeView) -> tuple[int, float]:
        rating = NEUTRAL_RATING if n.rating is None else n.rating
        return (n.in_flight, -rating)

    best_rank = min(rank(n) for n in free)
    best = sorted((n for n in free if rank(n) == best_rank), key=lambda n: n.node_id)
    if rng is not None and len(best) > 1:
        return best[rng.randrange(len(best))]
    return best[0]
