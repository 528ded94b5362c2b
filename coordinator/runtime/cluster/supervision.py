"""The instance's periodic duties: ticks and liveness verdicts, node ownership, ratings.

Each is a loop of the instance nursery; each feeds the cluster machine an event and has the
instance carry out the effects."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import trio

from coordinator.coordination import CoordinationUnavailable
from coordinator.core.effects import Effect
from coordinator.core.instance_machine import InstanceMachine
from coordinator.core.liveness import FreezeWatch
from coordinator.core.node_table import NodeConnection, NodeTable
from coordinator.runtime.cluster.membership import Membership
from coordinator.runtime.cluster.ownership import Ownership
from coordinator.settings import Settings

if TYPE_CHECKING:
    # Only the type: the instance brings its store, and the simulator's instances a stand-in,
    # so a simulator process need not load SQLAlchemy.
    from coordinator.store import Store

log = logging.getLogger("gemmanet.supervision")

RATINGS_REFRESH_S = 15.0


class Supervised(Protocol):
    """What the supervisor needs of its instance (``coordinator.runtime.instance.Instance``)."""

    instance_id: str
    settings: Settings
    store: Store
    machine: InstanceMachine
    membership: Membership
    ownership: Ownership
    clock: Callable[[], float]

    @property
    def nodes(self) -> NodeTable: ...
    def apply(self, effects: list[Effect]) -> None: ...
    def peers_died(self, dead: set[str]) -> None: ...
    def peers_reborn(self, incarnations: dict[str, str]) -> None: ...
    def node_owned_elsewhere(self, conn: NodeConnection) -> None: ...


class Supervisor:
    def __init__(self, instance: Supervised) -> None:
        self.instance = instance
        self.settings = instance.settings

    async def sweep(self) -> None:
        """Every ``sweep_s``: deadlines, silent nodes, and the liveness of the peers we depend
        on (the judge reads even with nobody to judge: it must see Redis answer every sweep to
        tell a paused Redis from a dead peer)."""
        instance, machine = self.instance, self.instance.machine
        sweep = self.settings.sweep_s
        heartbeat = self.settings.heartbeat_interval_s
        # Not right after a freeze of this process: the nodes' heartbeats wait unread meanwhile.
        freezes = FreezeWatch(
            sweep_s=sweep,
            heartbeat_s=heartbeat,
            silence_deadline_s=heartbeat * self.settings.heartbeat_misses,
            now=instance.clock(),
        )
        while True:
            await trio.sleep(sweep)
            now = instance.clock()
            instance.apply(machine.tick(now, silence_deadline_s=freezes.tick(now)))
            # Every listed peer too, not only those we wait on: a killed peer's closed inbox
            # takes it out of placement and of the API's lists at once, not at its TTL.
            suspects = set(machine.peers_of_interest())
            suspects.update(p.instance_id for p in machine.peers())
            try:
                dead = await instance.membership.dead_among(sorted(suspects))
            except CoordinationUnavailable:
                continue  # cannot tell: nobody is declared dead on a silent Redis
            if dead:
                instance.peers_died(dead)
            instance.peers_reborn(instance.membership.incarnations)

    async def check_ownership(self) -> None:
        """Every beat, one read of our nodes' owner records (a replace envelope lost on the
        bus cannot leave an identity live on two instances) when a claim moved them, and a
        refresh of the records whose turn it is (each once in a third of the owner TTL)."""
        instance = self.instance
        while True:
            await trio.sleep(self.settings.beat_s)
            try:
                lost = await instance.ownership.owned_elsewhere(instance.nodes.connections())
                lost += await instance.ownership.confirm_turn(instance.nodes.by_conn)
            except CoordinationUnavailable as exc:
                log.warning("could not check node ownership: %s", exc)
                continue
            for conn in lost:
                instance.node_owned_elsewhere(conn)

    async def after_presence_lapsed(self) -> None:
        """Our presence had lapsed (a freeze, Redis lost to us alone): peers may have declared
        us dead and failed what they asked of us, and our nodes may have reconnected
        elsewhere. Stop what we run for peers; keep only the nodes we still own."""
        instance = self.instance
        dropped = instance.machine.owner.forwarding.remote_count(instance.instance_id)
        instance.apply(instance.machine.presence_lapsed(instance.clock()))
        log.warning(
            "instance %s may have been declared dead; dropped %d forwarded task(s), "
            "re-checking ownership of %d node(s)",
            instance.instance_id,
            dropped,
            len(instance.nodes),
        )
        # One batched round trip for all of them: this runs inside the presence beat, and one
        # round trip per node (thousands) kept the beat from its next write for seconds, so
        # the lapse fed itself.
        for conn in await instance.ownership.confirm_all(instance.nodes.connections()):
            instance.node_owned_elsewhere(conn)

    async def refresh_ratings(self) -> None:
        while True:
            try:
                self.instance.machine.set_ratings(await self.instance.store.node_ratings())
            except Exception:
                log.exception("could not refresh node ratings")
            await trio.sleep(RATINGS_REFRESH_S)
