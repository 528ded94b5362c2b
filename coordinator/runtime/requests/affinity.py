"""Prefix affinity, the shell's side (the model and its limits: docs/affinity.md).

``predict`` looks up, before a request is placed, which nodes served which of its prefix
blocks (the ``PrefixAffinity`` role, one round trip) and hands the requester machine the
prediction it ranks candidates with (``core/placement/affinity.py``); ``placed`` counts whether the
node the lease went to was one predicted to hold some of it; ``record`` notes, when a task ended
with its answer, that its node holds the conversation, answer included. Records go through a
bounded channel to ``run``, off the answer's path.

The prediction only reorders candidates: the lease still decides who has room, and the
admission queue is the same. It never fails a request: a lookup that fails or takes longer
than ``GEMMANET_AFFINITY_LOOKUP_TIMEOUT_S`` places the request by load alone (counted as
``unavailable``), and a record that fails is dropped (the next turn is then placed by load).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import trio

from coordinator.coordination import CoordinationUnavailable
from coordinator.coordination.roles import PrefixAffinity
from coordinator.core.placement.affinity import (
    AffinityWeights,
    PrefixPrediction,
    answered_hashes,
    block_hashes,
    longest_prefixes,
    worth_a_lookup,
)
from coordinator.runtime.metrics import Metrics
from coordinator.settings import Settings

__all__ = ["Affinity", "AffinityCounts", "Lookup"]

log = logging.getLogger("gemmanet.affinity")

#: records waiting to be written; past this many a record is dropped (a prediction is a hint)
RECORD_BACKLOG = 1000
#: one record's bound (the store may be slow; the next one waits no longer)
RECORD_GIVE_UP_S = 2.0


@dataclass(frozen=True, slots=True)
class Lookup:
    """One request's prefix: its canonical text, whether it is a conversation, and what was
    predicted of it (None: the lookup failed or was too slow) with each node's blocks."""

    text: str
    messages: bool
    prediction: PrefixPrediction | None
    longest: dict[str, int]


@dataclass
class AffinityCounts:
    """This instance's placements since it started, for the System Health page."""

    hits: int = 0
    misses: int = 0
    unavailable: int = 0
    predicted_blocks: int = 0


class Affinity:
    def __init__(self, settings: Settings, store: PrefixAffinity, metrics: Metrics) -> None:
        self.enabled = settings.affinity
        self._settings = settings
        self._store = store
        self._metrics = metrics
        self._weights = AffinityWeights(
            prefix=settings.affinity_prefix_weight, load=settings.affinity_load_weight
        )
        self.counts = AffinityCounts()
        self._send, self._receive = trio.open_memory_channel[tuple[str, str, list[str]]](
            RECORD_BACKLOG
        )

    async def predict(self, model: str, text: str, messages: bool) -> Lookup | None:
        """What the store predicts of this prefix; None when affinity is off. Never raises
        for the store: a failed or slow lookup gives a Lookup without a prediction."""
        if not self.enabled:
            return None
        if not worth_a_lookup(text):
            # Placed by load alone; counted a miss, recorded if its answer makes it longer.
            return Lookup(text, messages, PrefixPrediction({}, self._weights), {})
        hashes = block_hashes(text)
        holders = None
        with trio.move_on_after(self._settings.affinity_lookup_timeout_s):
            try:
                holders = await self._store.prefix_holders(model, hashes)
            except CoordinationUnavailable as exc:
                log.debug("prefix affinity lookup failed: %s", exc)
        if holders is None:
            return Lookup(text, messages, None, {})
        longest = longest_prefixes(holders)
        prediction = PrefixPrediction.of(longest, len(hashes), self._weights)
        return Lookup(text, messages, prediction, longest)

    def placed(self, lookup: Lookup | None, node_id: str) -> None:
        """The request's lease went to ``node_id``: a hit when it was predicted to hold some
        of the prefix."""
        if lookup is None:
            return
        if lookup.prediction is None:
            self.counts.unavailable += 1
            self._metrics.affinity_placement("unavailable", 0)
            return
        blocks = lookup.longest.get(node_id, 0)
        if blocks:
            self.counts.hits += 1
            self.counts.predicted_blocks += blocks
        else:
            self.counts.misses += 1
        self._metrics.affinity_placement("hit" if blocks else "miss", blocks)

    def record(self, lookup: Lookup | None, model: str, node_id: str, output: str) -> None:
        """``node_id`` answered the request: it holds the prefix and its answer now."""
        if lookup is None:
            return
        hashes = answered_hashes(lookup.text, lookup.messages, output)
        if not hashes:
            return
        try:
            self._send.send_nowait((model, node_id, hashes))
        except trio.WouldBlock:
            log.debug("prefix affinity record dropped: %d waiting", RECORD_BACKLOG)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Write the records, one at a time, each bounded; failures are dropped."""
        task_status.started()
        settings = self._settings
        async for model, node_id, hashes in self._receive:
            with trio.move_on_after(RECORD_GIVE_UP_S):
                try:
                    await self._store.record_prefix(
                        model,
                        node_id,
                        hashes,
                        ttl_s=settings.affinity_ttl_s,
                        max_blocks=settings.affinity_max_blocks,
                    )
                except CoordinationUnavailable as exc:
                    log.debug("prefix affinity record failed: %s", exc)

    def status(self) -> dict[str, object]:
        """For the System Health page: on or off, and this instance's placements."""
        c = self.counts
        looked = c.hits + c.misses
        return {
            "enabled": self.enabled,
            "hits": c.hits,
            "misses": c.misses,
            "unavailable": c.unavailable,
            "mean_predicted_blocks": round(c.predicted_blocks / c.hits, 2) if c.hits else 0.0,
            "hit_rate": round(c.hits / looked, 4) if looked else None,
        }
