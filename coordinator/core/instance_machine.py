"""One instance's side of the cluster protocol as a pure state machine.

It joins the ``Requester`` (tasks this instance's clients asked for) and the ``Owner`` (the
node connections this instance holds). Envelopes one side addresses to this very instance go
straight to the other side without touching the bus, so a single instance is simply the same
machine with no peers: a local task is an assign from this requester to this owner.
A direct model host (``hosts/direct_hosts.py``) is a node whose owner is every instance itself: an
assign to it becomes a ``CallHost`` effect, and what the host answers comes back through
``host_answer`` as the chunks and result an owner would have sent.

Every method takes an event and the current time, and returns the effects for the shell
(``coordinator/core/effects.py``); nothing here does I/O, reads a clock or draws randomness
except from the ``random.Random`` it is given.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping
from dataclasses import replace

from coordinator.core import registry
from coordinator.core.effects import CallHost, Dispatch, Effect, Publish, StopHostCall, WakeQueue
from coordinator.core.hosts.direct_hosts import DirectHosts
from coordinator.core.node_table import NodeConnection, view_of
from coordinator.core.owner import Owner
from coordinator.core.placement import fit
from coordinator.core.placement.affinity import PrefixPrediction
from coordinator.core.placement.choose import SAMPLE_ABOVE, Indexable, NodeView, sample_across
from coordinator.core.registry import InstanceSnapshot, NodeEntry, PeerLoad
from coordinator.core.requests.requester import Requester
from coordinator.core.tracker import Verdict
from coordinator.errors import GemmaNetError
from protocol import (
    Assign,
    BusAccepted,
    BusAssign,
    BusCancel,
    BusChunk,
    BusEnvelope,
    BusNodeGone,
    BusRefused,
    BusReplace,
    BusResult,
    BusWake,
)

Ratings = dict[str, tuple[float, int]]


class _RemoteViews:
    """The peers' nodes as placement views: all of them, and per model."""

    def __init__(self, views: list[NodeView], peers: Iterable[InstanceSnapshot] = ()) -> None:
        self.all = views
        self.by_node = {view.node_id: view for view in views}
        self.by_model: dict[str, list[NodeView]] = {}
        for view in views:
            for model in view.models:
                self.by_model.setdefault(model, []).append(view)
        #: model -> the largest memory budget among the peers' nodes serving it
        #: (core/placement/fit.py)
        self.largest_budget: dict[str, float] = {}
        for snapshot in peers:
            for entry in snapshot.nodes:
                budget = fit.budget_of(entry.vram_gb)
                for model in entry.models:
                    if budget > self.largest_budget.get(model, -math.inf):
                        self.largest_budget[model] = budget


def _corrected(
    view: NodeView, pending: Mapping[str, int], loads: Mapping[str, PeerLoad]
) -> NodeView:
    """A peer's node with its load as the peer's last beat told it (when the peer beats its
    loads; else as its snapshot says), and at least the tasks this instance sent it since."""
    told = registry.node_load(loads.get(view.instance_id), view.conn_id, view.in_flight)
    in_flight = max(told, pending.get(view.conn_id, 0))
    return view if in_flight == view.in_flight else replace(view, in_flight=in_flight)


class InstanceMachine:
    def __init__(
        self,
        instance_id: str,
        *,
        forward_grace_s: float,
        rng: random.Random,
        incarnation: str = "",
        tracks_keys: bool = False,
        hosts: DirectHosts | None = None,
        needs: Mapping[str, float] | None = None,
    ) -> None:
        self.me = instance_id
        #: model -> GB one request of it needs on an empty node (``fit.request_needs``)
        self.needs = dict(needs or {})
        self.owner = Owner(instance_id, forward_grace_s=forward_grace_s, incarnation=incarnation)
        self.hosts = hosts if hosts is not None else DirectHosts(instance_id, {}, 0.0)
        self.requester = Requester(
            instance_id,
            views=self.views,
            rng=rng,
            tracks_keys=tracks_keys,
            host_views=self.hosts.views if self.hosts else None,
            serves=self.serves,
            sample=self.sample_views,
            named=self.views_of,
        )
        self.ratings: Ratings = {}
        self._peers: dict[str, InstanceSnapshot] = {}
        #: the peers' loads as their last beats told them (registry.PeerLoad)
        self.peer_loads: dict[str, PeerLoad] = {}
        # Peers' nodes as placement sees them, built once per change of the peers or ratings
        # (not per request): all of them, and per model (the pools samples are drawn from).
        self._remote: _RemoteViews | None = None

    # -- what placement sees ----------------------------------------------------------------

    def set_peers(self, snapshots: Iterable[InstanceSnapshot]) -> None:
        """The last published snapshots of the live peers."""
        self._peers = {s.instance_id: s for s in snapshots if s.instance_id != self.me}
        self._remote = None

    def set_peer_loads(self, loads: dict[str, PeerLoad]) -> None:
        """The peers' loads from their last beats (no views are rebuilt: they are applied to
        the few nodes a request looks at)."""
        self.peer_loads = loads

    def loads(self) -> registry.BeatLoads:
        """This instance's roster version, busy connections and requests in flight, for its
        beat (read there and then, not kept). O(1): no node is looked at."""
        nodes = self.owner.nodes
        return registry.BeatLoads(nodes.roster_changes, nodes.busy, len(self.requester))

    def peer_requests(self, snapshot: InstanceSnapshot) -> int:
        """Requests a peer is carrying, by its last word."""
        return registry.requests_load(self.peer_loads.get(snapshot.instance_id), snapshot)

    def peer_in_flight(self, instance_id: str, entry: NodeEntry) -> int:
        """Tasks running on a peer's node, by the peer's last word on it."""
        return registry.node_load(self.peer_loads.get(instance_id), entry.conn_id, entry.in_flight)

    def forget_peer(self, instance_id: str) -> None:
        if self._peers.pop(instance_id, None) is not None:
            self._remote = None

    def set_ratings(self, ratings: Ratings) -> None:
        # Re-read every RATINGS_REFRESH_S on every instance: the peers' views are made again
        # only when a rating moved (at 10,000 nodes that is 6,666 views, tens of ms).
        if ratings != self.ratings:
            self.ratings = ratings
            self._remote = None

    def peers(self) -> list[InstanceSnapshot]:
        return [self._peers[i] for i in sorted(self._peers)]

    def serves(self, model: str) -> bool:
        """Whether a connected node (here or on a live peer) serves ``model``: the check every
        request makes first, without building the views."""
        return bool(self.owner.nodes.serving(model)) or model in self._remote_views().by_model

    def served_models(self) -> set[str]:
        """Models a connected node (here or on a live peer) serves, from the per-model pools:
        no view is made (``/api/v1/status`` asks on every call)."""
        return self.owner.nodes.models() | self._remote_views().by_model.keys()

    def _remote_views(self) -> _RemoteViews:
        if self._remote is None:
            views = registry.remote_views(
                self.peers(), self.ratings, exclude_instance=self.me, pending_per_conn={}
            )
            peers = self.peers() if self.needs else ()
            self._remote = _RemoteViews(views, peers)
        return self._remote

    def views(self) -> list[NodeView]:
        """Placement candidates: local nodes as they are, peers' nodes from their snapshots
        (up to a beat old) corrected for the tasks this instance sent them since."""
        local = self.owner.nodes.views(self.me, self.ratings)
        if not self._peers:
            return local
        pending = self.requester.pending_per_remote_conn()
        # A node being replaced across instances may briefly show twice: the local
        # connection, when there is one, is the newest this instance knows of.
        local_ids = {v.node_id for v in local}
        remote = [
            _corrected(v, pending, self.peer_loads)
            for v in self._remote_views().all
            if v.node_id not in local_ids
        ]
        return local + remote

    def sample_views(self, model: str, k: int, rng: random.Random) -> list[NodeView] | None:
        """``k`` nodes serving ``model`` drawn at random from here and the live peers, seen as
        ``views`` sees them; None when no more than ``SAMPLE_ABOVE`` serve it (rank them all).
        Costs O(k), not O(nodes): the pools are kept per model."""
        local = self.owner.nodes.serving(model)
        remote = self._remote_views().by_model.get(model, [])
        if len(local) + len(remote) <= SAMPLE_ABOVE:
            return None
        pending = self.requester.pending_per_remote_conn() if remote else {}
        sample: list[NodeView] = []
        pools: list[Indexable[NodeConnection | NodeView]] = [local, remote]
        for item in sample_across(pools, k, rng):
            if isinstance(item, NodeConnection):
                sample.append(view_of(item, self.me, self.ratings))
            elif self.owner.nodes.by_node(item.node_id) is None:  # the local one is newer
                sample.append(_corrected(item, pending, self.peer_loads))
        return sample

    def views_of(self, node_ids: Iterable[str]) -> list[NodeView]:
        """The nodes named, here or on a live peer, seen as ``views`` sees them (those not
        connected left out): the nodes a request's prefix prediction names, which a sample
        may have missed. O(names), not O(nodes)."""
        found: list[NodeView] = []
        remote = None
        for node_id in node_ids:
            conn = self.owner.nodes.by_node(node_id)
            if conn is not None:
                found.append(view_of(conn, self.me, self.ratings))
                continue
            remote = self._remote_views() if remote is None else remote
            view = remote.by_node.get(node_id)
            if view is not None:
                pending = self.requester.pending_per_remote_conn()
                found.append(_corrected(view, pending, self.peer_loads))
        return found

    # -- requests ---------------------------------------------------------------------------

    def submit(
        self,
        assign: Assign,
        deadline: float,
        now: float,
        key_id: str = "",
        prediction: PrefixPrediction | None = None,
    ) -> list[Effect]:
        """A client's task (``prediction``: which nodes hold how much of its prefix). Raises
        NoNodeForModel when no online node serves its model, and ModelNeverFits when none
        serving it has the memory budget one request of it needs."""
        need = self.needs.get(assign.model)
        if need is not None:
            self._refuse_if_never_fits(assign.model, need, now)
        effects = self.requester.submit(assign, deadline, key_id, now, prediction)
        return self._route(effects, now)

    def _refuse_if_never_fits(self, model: str, need: float, now: float) -> None:
        # Cheap when all is well: the first local node that fits ends the look.
        local = self.owner.nodes.serving(model)
        if fit.fits_somewhere(need, (local[i].vram_gb for i in range(len(local)))):
            return
        budgets = [fit.largest(local[i].vram_gb for i in range(len(local)))]
        budgets.append(self._remote_views().largest_budget.get(model, -math.inf))
        hosts = [v for v in self.hosts.views(now) if model in v.models] if self.hosts else []
        budgets.append(fit.largest(self.hosts.terms[v.node_id].memory_gb for v in hosts))
        largest = max(budgets)
        if largest != -math.inf and largest + 1e-9 < need:  # -inf: nobody serves it
            raise fit.never_fits(model, need, largest)

    def reserved(
        self, task_id: str, attempt: int, view: NodeView, lease_id: str, now: float
    ) -> list[Effect]:
        return self._route(self.requester.reserved(task_id, attempt, view, lease_id), now)

    def reserve_failed(
        self, task_id: str, attempt: int, error: GemmaNetError, now: float
    ) -> list[Effect]:
        return self._route(self.requester.reserve_failed(task_id, attempt, error), now)

    def request_ended(self, task_id: str, outcome: str, now: float) -> list[Effect]:
        return self._route(self.requester.ended(task_id, outcome, now), now)

    def dispatched(self, task_id: str, placement: int, now: float) -> list[Effect]:
        return self._route(self.requester.dispatched(task_id, placement), now)

    def unreached(self, task_id: str, placement: int, target: str, now: float) -> list[Effect]:
        self.forget_peer(target)
        return self._route(self.requester.unreached(task_id, placement, target, now), now)

    def dispatch_failed(
        self, task_id: str, placement: int, target: str, error: GemmaNetError, now: float
    ) -> list[Effect]:
        effects = self.requester.dispatch_failed(task_id, placement, target, error, now)
        return self._route(effects, now)

    # -- nodes ------------------------------------------------------------------------------

    def node_connected(self, conn: NodeConnection, now: float) -> list[Effect]:
        return self._route(self.owner.connected(conn), now)

    def node_claimed(
        self, conn: NodeConnection, previous: tuple[str, str] | None, now: float
    ) -> list[Effect]:
        """The shared owner record of ``conn``'s node names it now; ``previous``: the (instance,
        connection) it named before."""
        return self._route(self.owner.claimed(conn, previous, now), now)

    def node_disconnected(self, conn_id: str, why: str, now: float) -> list[Effect]:
        return self._route(self.owner.disconnected(conn_id, why), now)

    def node_replaced(self, conn_id: str, node_id: str, now: float) -> list[Effect]:
        """The node's identity is owned by a newer connection elsewhere now."""
        return self._route(self.owner.replaced(conn_id, node_id), now)

    def move_nodes(self, now: float, *, at_once: bool = False) -> list[Effect]:
        """The instance drains: its nodes take no new task and move (4004) once idle, or
        ``at_once``. (core/drain.py decides when.)"""
        return self._route(self.owner.move_nodes(now=at_once), now)

    def node_envelope(self, conn_id: str, envelope: object, now: float) -> list[Effect]:
        return self._route(self.owner.node_envelope(conn_id, envelope, now), now)

    # -- peers and the bus ------------------------------------------------------------------

    def bus_envelope(self, envelope: BusEnvelope, now: float) -> list[Effect]:
        return self._route(self._receive(envelope, now), now)

    def host_answer(self, envelope: BusChunk | BusResult, now: float) -> list[Effect]:
        """A direct host's chunk or result, for a call this instance runs."""
        if isinstance(envelope, BusResult):
            self.hosts.finished(envelope.task_id)
        return self._route(self._receive(envelope, now), now)

    def answer_unreached(self, task_id: str, now: float) -> list[Effect]:
        return self._route(self.owner.answer_unreached(task_id), now)

    def peers_of_interest(self) -> list[str]:
        """Instances whose death would change something here: owners we wait on, requesters
        we work for."""
        return sorted(self.requester.owners() | self.owner.remote_requesters())

    def peers_dead(self, dead: set[str], now: float) -> list[Effect]:
        """Tasks waiting on a dead owner end with 502; tasks for a dead requester stop."""
        dead = dead - {self.me}
        for instance_id in sorted(dead):
            self.forget_peer(instance_id)
        effects = self.requester.owners_dead(dead, now) + self.owner.requesters_dead(dead, now)
        return self._route(effects, now)

    def peers_reborn(self, incarnations: Mapping[str, str], now: float) -> list[Effect]:
        """Each peer's life as the registry reads now (``registry.InstanceSnapshot``): tasks
        placed on an earlier life of a peer were lost with it and end with 502."""
        return self._route(self.requester.owners_reborn(incarnations, now), now)

    def bus_lost(self, now: float) -> list[Effect]:
        """Our inbox was lost: what crosses the bus may be lost both ways."""
        effects = self.requester.remote_tasks_lost(now) + self.owner.drop_remote("bus_lost")
        return self._route(effects, now)

    def presence_lapsed(self, now: float) -> list[Effect]:
        """Peers may have declared this instance dead and failed what they asked of it."""
        return self._route(self.owner.drop_remote("owner_lost_liveness"), now)

    def tick(self, now: float, *, silence_deadline_s: float | None) -> list[Effect]:
        effects = self.requester.tick(now)
        effects += self.owner.tick(now, silence_deadline_s=silence_deadline_s)
        return self._route(effects, now)

    # -- status -----------------------------------------------------------------------------

    def snapshot(self) -> InstanceSnapshot:
        return self.owner.snapshot(in_flight=len(self.requester))

    def dropped_answers(self) -> dict[str, int]:
        counts = dict(self.requester.tracker.dropped)
        for verdict, n in self.owner.dropped.items():
            counts[verdict] = counts.get(verdict, 0) + n
        return {v.value: counts.get(v, 0) for v in Verdict if v is not Verdict.ACCEPTED}

    # -- routing ----------------------------------------------------------------------------

    def _route(self, effects: list[Effect], now: float) -> list[Effect]:
        """Effects for the shell; what this instance addresses to itself is handled here, in
        place, so the order of everything a request sees is the order it happened in."""
        out: list[Effect] = []
        for effect in effects:
            if (
                isinstance(effect, Publish)
                and effect.target == self.me
                and isinstance(effect.envelope, BusCancel)
                and self.hosts.finished(effect.envelope.task_id)
            ):
                out.append(StopHostCall(effect.envelope.task_id))
            elif isinstance(effect, Publish) and effect.target == self.me:
                out += self._route(self._receive(effect.envelope, now), now)
            elif (
                isinstance(effect, Dispatch)
                and effect.target == self.me
                and (host_id := self.hosts.host_of_conn(effect.envelope.conn_id)) is not None
            ):
                task_id = effect.envelope.task_id
                # The call starts now; its task is tracked like any other assigned to a node.
                deadline = self.requester.deadline_of(task_id)
                self.hosts.started(task_id, host_id)
                out += self._route(self.requester.dispatched(task_id, effect.placement), now)
                out.append(CallHost(host_id, effect.envelope, deadline if deadline else now))
            elif isinstance(effect, Dispatch) and effect.target == self.me:
                task_id = effect.envelope.task_id
                # Received, by definition; then whatever the owner says about it.
                out += self._route(self.requester.dispatched(task_id, effect.placement), now)
                out += self._route(self.owner.assign(effect.envelope, now), now)
            else:
                out.append(effect)
        return out

    def _receive(self, envelope: BusEnvelope, now: float) -> list[Effect]:
        if isinstance(envelope, BusChunk):
            return self.requester.chunk(envelope, now)
        if isinstance(envelope, BusAccepted):
            return self.requester.accepted(envelope)
        if isinstance(envelope, BusResult):
            return self.requester.result(envelope, now)
        if isinstance(envelope, BusNodeGone):
            return self.requester.node_gone(envelope)
        if isinstance(envelope, BusRefused):
            return self.requester.refused(envelope, now)
        if isinstance(envelope, BusAssign):
            return self.owner.assign(envelope, now)
        if isinstance(envelope, BusCancel):
            return self.owner.cancel(envelope.task_id, envelope.reason)
        if isinstance(envelope, BusReplace):
            return self.owner.replaced(envelope.conn_id, envelope.node_id)
        if isinstance(envelope, BusWake):
            return [WakeQueue(envelope.model)]
        return []
