"""One coordinator instance: the trio driver of the cluster machine (``core/instance_machine``).

The machine decides; this module carries out its effects (node sockets, the bus, the shared
store) and feeds it events (node envelopes, bus envelopes, ticks, liveness verdicts, requests
beginning and ending). A single instance runs exactly the same code with no peers.

The task tree of one instance::

    Instance.run                         the instance nursery
    ├── TaskRecorder.run                 batched task records
    ├── Affinity.run                     who served which prefix, into the store
    ├── _read_bus                        this instance's inbox -> machine.bus_envelope
    ├── BusOutbox.run                    ordered sender lanes -> peers' inboxes
    ├── Membership.run                   presence heartbeat, peers' snapshots
    ├── Supervisor.sweep                 ticks: deadlines, silent nodes, dead peers
    ├── Supervisor.check_ownership       our nodes' owner records, every beat
    ├── Supervisor.refresh_ratings       node ratings from the store
    ├── Admissions.renew                 capacity leases of running tasks
    ├── NodeFactsWriter.run              our nodes' facts (what leases are checked against)
    ├── Ownership.run                    new connections' identity claims, batched
    ├── NodeHeartbeats.run               our heartbeat to every node, one timer for all
    ├── NodeTelemetry.run                our nodes' heartbeat telemetry, paced, into the store
    ├── HostFactsReader.run              direct hosts' monitor facts -> placement; lease facts
    ├── HostCalls.run                    one task per call to a direct host (hosts/host_calls)
    └── serve_node (one per node)        a node WebSocket; stopping the instance closes it

Stopping the instance cancels the whole tree, node sockets included.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import msgspec
import trio

from coordinator.coordination import Coordination, CoordinationUnavailable
from coordinator.coordination.bus.base import Bus
from coordinator.core import cluster_view
from coordinator.core.effects import (
    CallHost,
    CloseNode,
    Deliver,
    Dispatch,
    Effect,
    NodeFactsChanged,
    NodesChanged,
    Publish,
    ReleaseLease,
    ReleaseOwnership,
    Reserve,
    SendToNode,
    StopHostCall,
    TaskEvent,
    WakeQueue,
)
from coordinator.core.instance_machine import InstanceMachine
from coordinator.core.node_table import NodeConnection, NodeTable
from coordinator.core.placement.fit import budget_problem, request_needs
from coordinator.errors import (
    StartupRefused,
)
from coordinator.hosts.facts_reader import HostFactsReader, direct_hosts
from coordinator.hosts.host_calls import HostCalls
from coordinator.runtime.cluster.assign_sender import dispatch
from coordinator.runtime.cluster.bus_outbox import BusOutbox
from coordinator.runtime.cluster.bus_reader import read_inbox
from coordinator.runtime.cluster.membership import Membership
from coordinator.runtime.cluster.ownership import Ownership, refresh_turns
from coordinator.runtime.cluster.single_instance_lock import refuse_a_running_id
from coordinator.runtime.cluster.supervision import Supervisor
from coordinator.runtime.drain import Drain
from coordinator.runtime.log_context import bind_log_ids
from coordinator.runtime.metrics import Metrics
from coordinator.runtime.nodes.facts import NodeFactsWriter
from coordinator.runtime.nodes.heartbeats import NodeHeartbeats
from coordinator.runtime.nodes.link import NodeLink
from coordinator.runtime.nodes.telemetry import NodeTelemetry
from coordinator.runtime.nodes.websocket import NodeSocket, serve_node_in
from coordinator.runtime.requests import task_log
from coordinator.runtime.requests.admission import Admissions
from coordinator.runtime.requests.affinity import Affinity
from coordinator.runtime.requests.task_recorder import TaskRecorder
from coordinator.runtime.requests.task_requests import TaskRequests
from coordinator.settings import Settings
from protocol import (
    Assign,
    Error,
    Heartbeat,
    Hello,
    ProtocolError,
    decode_bus,
)

if TYPE_CHECKING:
    from coordinator.store import Store  # only the type: no SQLAlchemy for the simulator

log = logging.getLogger("gemmanet.instance")


class Instance:
    def __init__(
        self,
        settings: Settings,
        store: Store,
        coordination: Coordination,
        bus: Bus,
        *,
        clock: Callable[[], float] = trio.current_time,
        wall_clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
    ) -> None:
        self.settings = settings
        self.instance_id = settings.instance_id
        self.store = store
        self.coordination = coordination
        self.bus = bus
        self.clock = clock
        self.wall_clock = wall_clock
        # Ids come from the seeded generator in the simulator, from the OS otherwise.
        self._ids = random.Random(rng.getrandbits(64)) if rng else random.SystemRandom()
        # A new one per process start: peers tell a restart with the same id from the life
        # that held their tasks (core/requests/requester.py, owners_reborn).
        self.incarnation = f"{self._ids.getrandbits(64):016x}"
        models = settings.capacity.models
        self.needs = request_needs({m: (c.resident_gb, c.kv_gb) for m, c in models.items()})
        self.machine = InstanceMachine(
            self.instance_id,
            forward_grace_s=settings.forward_grace_s,
            rng=rng or random.Random(),
            incarnation=self.incarnation,
            tracks_keys=settings.max_active_per_key > 0,
            hosts=direct_hosts(settings),
            needs=self.needs,
        )
        self.recorder = TaskRecorder(store)
        self.host_facts = HostFactsReader(
            self.instance_id,
            settings.capacity,
            coordination.monitor,
            coordination.leases,
            self.machine.hosts,
            clock,
        )
        self.metrics = Metrics(self.diagnostics, self.host_facts.gate)
        coordination.op_observer = self.metrics.redis_op
        self.outbox = BusOutbox(bus, clock, self.metrics)
        # Each part is handed the roles of the coordination it uses, nothing more.
        self.membership = Membership(
            coordination.key_value,
            coordination.presence,
            bus,
            settings,
            snapshot=self.machine.snapshot,
            clock=clock,
            loads=self.machine.loads,
        )
        self.supervisor = Supervisor(self)
        #: which nodes are predicted to hold a request's prefix (docs/affinity.md)
        self.affinity = Affinity(settings, coordination.affinity, self.metrics)
        #: the request side: start, end and record the tasks this instance's clients ask for
        self.requests = TaskRequests(self, coordination.rate_limits)
        self.membership.on_presence_lapsed = self.supervisor.after_presence_lapsed
        self.membership.on_peers = self.machine.set_peers
        self.membership.on_peer_loads = self.machine.set_peer_loads
        self.ownership = Ownership(
            coordination.key_value,
            self.instance_id,
            ttl_s=settings.owner_ttl_s,
            turns=refresh_turns(settings.owner_ttl_s, settings.beat_s),
        )
        self.admissions = Admissions(
            settings, coordination.leases, self.machine, self.outbox, clock, self.metrics
        )
        self.node_facts = NodeFactsWriter(
            self.instance_id, settings.capacity, coordination.leases, self.machine.owner.nodes
        )
        self.membership.on_forgotten = self.node_facts.rewrite_all
        #: SIGTERM's drain (runtime/drain.py, started by ``gemmanet serve``); it settles two
        #: beats after our nodes moved, by when every peer has read where they went
        self.drain = Drain(self, settings.drain_s, settle_s=2 * settings.beat_s)
        self.telemetry = NodeTelemetry(
            coordination.telemetry, interval_s=settings.telemetry_interval_s
        )
        self.host_calls = HostCalls(
            settings.capacity.hosts,
            lambda answer: self.apply(self.machine.host_answer(answer, self.clock())),
        )
        self._links: dict[str, NodeLink] = {}
        self.heartbeats = NodeHeartbeats(settings)
        #: task id -> the channel of the request waiting for its events (runtime/requests.py)
        self.waiting: dict[str, trio.MemorySendChannel[TaskEvent]] = {}
        self._nursery: trio.Nursery | None = None
        self.bus_losses = 0

    @property
    def nodes(self) -> NodeTable:
        return self.machine.owner.nodes

    # -- supervision ------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            await self.coordination.ping()
        except CoordinationUnavailable as exc:
            raise StartupRefused(f"cannot reach Redis at start: {exc}") from None
        await refuse_a_running_id(self.bus, self.instance_id)
        # Every task of the instance nursery logs with our id (several instances share one
        # process in the simulator).
        bind_log_ids(instance_id=self.instance_id)
        supervisor = self.supervisor
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await nursery.start(self.recorder.run)
            await nursery.start(self.affinity.run)
            # Listen before announcing ourselves: an assign sent the moment we appear alive
            # must find our inbox open.
            await nursery.start(self._read_bus)
            await nursery.start(self.outbox.run)
            await nursery.start(self.membership.run)
            nursery.start_soon(supervisor.sweep)
            nursery.start_soon(supervisor.check_ownership)
            nursery.start_soon(supervisor.refresh_ratings)
            nursery.start_soon(self.admissions.renew)
            nursery.start_soon(self.node_facts.run)
            nursery.start_soon(self.ownership.run)
            nursery.start_soon(self.heartbeats.run, self._links)
            nursery.start_soon(self.telemetry.run)
            await nursery.start(self.host_calls.run)
            await nursery.start(self.host_facts.run)
            task_status.started()

    async def leave(self) -> None:
        """A graceful stop: peers stop counting on us now rather than at the TTL. (A killed
        process never gets here; its closed inbox tells the peers.)"""
        await self.membership.leave()

    def new_id(self, prefix: str) -> str:
        return f"{prefix}{self._ids.getrandbits(96):024x}"

    def _spawn(self, fn: Callable[..., Awaitable[object]], *args: object) -> None:
        """Background work that may be skipped when the instance is shutting down (what it
        would tidy up in Redis expires with its TTL anyway)."""
        if self._nursery is None:
            return
        try:
            self._nursery.start_soon(fn, *args)
        except RuntimeError:  # the nursery is closed: we are shutting down
            pass

    def node_owned_elsewhere(self, conn: NodeConnection) -> None:
        """The node's identity is owned by a newer connection elsewhere: close ours (4000)."""
        log.warning("node %s is owned elsewhere now; closing our connection", conn.node_id)
        self.apply(self.machine.node_replaced(conn.conn_id, conn.node_id, self.clock()))

    def peers_died(self, dead: set[str]) -> None:
        """Judged dead: tasks waiting on them end with 502, tasks run for them stop."""
        self.metrics.peers_judged_dead(dead, {p.instance_id for p in self.membership.peers()})
        self.apply(self.machine.peers_dead(dead, self.clock()))

    def peers_reborn(self, incarnations: dict[str, str]) -> None:
        """The peers' lives as just read: tasks on an earlier life of a peer end with 502."""
        self.apply(self.machine.peers_reborn(incarnations, self.clock()))

    # -- effects ----------------------------------------------------------------------------

    def apply(self, effects: list[Effect]) -> None:
        """Carry out the machine's effects in order. Dispatches run in the background."""
        for effect in effects:
            if isinstance(effect, Deliver):
                channel = self.waiting.get(effect.task_id)
                if channel is not None:
                    channel.send_nowait(effect.event)
            elif isinstance(effect, SendToNode):
                link = self._links.get(effect.conn_id)
                if link is not None:
                    if isinstance(effect.envelope, Assign) and log.isEnabledFor(logging.DEBUG):
                        conn = self.nodes.by_conn(effect.conn_id)
                        node_id = conn.node_id if conn is not None else None
                        task_log.task_sent(effect.envelope, node_id, effect.conn_id)
                    link.send_nowait(effect.envelope)
            elif isinstance(effect, Publish):
                self._publish(effect)
            elif isinstance(effect, Dispatch):
                self._spawn(self._dispatch_in_background, effect)
            elif isinstance(effect, CloseNode) and effect.conn_id in self._links:
                self._links[effect.conn_id].request_close(effect.code, effect.reason)
            elif isinstance(effect, NodesChanged):
                self.membership.snapshot_changed()
            elif isinstance(effect, ReleaseOwnership):
                self._spawn(self.ownership.release, effect.node_id, effect.conn_id)
            elif isinstance(effect, Reserve):
                self._spawn(self._in_background, self.admissions.reserve, effect)
            elif isinstance(effect, ReleaseLease):
                self._spawn(self.admissions.release, effect)
            elif isinstance(effect, WakeQueue):
                self.admissions.wake_local(effect.model)
            elif isinstance(effect, NodeFactsChanged):
                self.node_facts.changed(effect)
            elif isinstance(effect, CallHost):
                self.host_calls.start(effect)
            elif isinstance(effect, StopHostCall):
                self.host_calls.stop(effect.task_id)

    def _publish(self, effect: Publish) -> None:
        on_unreached = None
        task_id = effect.unreached_task
        if task_id is not None:

            def on_unreached() -> None:
                self.apply(self.machine.answer_unreached(task_id, self.clock()))

        self.outbox.send(
            effect.target, effect.envelope, give_up_at=effect.give_up_at, on_unreached=on_unreached
        )

    async def _dispatch(self, effect: Dispatch) -> list[Effect]:
        """Hand an assign to its owner; the machine hears whether anybody received it."""
        return await dispatch(
            effect, self.bus, self.machine, self.membership, self.metrics, self.settings, self.clock
        )

    async def _dispatch_in_background(self, effect: Dispatch) -> None:
        await self.carry_out(await self._dispatch(effect))

    async def _in_background(
        self, step: Callable[[Reserve], Awaitable[list[Effect]]], effect: Reserve
    ) -> None:
        await self.carry_out(await step(effect))

    async def carry_out(self, effects: list[Effect]) -> None:
        """Apply effects, awaiting leases and dispatches in place (a request being placed
        waits for its lease, for its own assign to reach its owner, and for any placement
        that follows)."""
        while effects:
            steps = [e for e in effects if isinstance(e, Dispatch | Reserve)]
            self.apply([e for e in effects if not isinstance(e, Dispatch | Reserve)])
            effects = []
            for step in steps:
                if isinstance(step, Reserve):
                    effects += await self.admissions.reserve(step)
                else:
                    effects += await self._dispatch(step)

    # -- node side --------------------------------------------------------------------------

    async def serve_node(self, socket: NodeSocket) -> None:
        """Serve a node WebSocket as a task of the instance nursery (stopping the instance
        closes it); returns when the socket is done."""
        assert self._nursery is not None, "the instance is not running"
        await serve_node_in(self._nursery, self, socket)

    async def attach_node(self, hello: Hello, link: NodeLink, protocol: int = 1) -> NodeConnection:
        """Register an authenticated connection; an older one of the same identity (here or on
        any instance) is closed with 4000. Raises CoordinationUnavailable when ownership
        cannot be recorded (the node retries later)."""
        now = self.clock()
        # The operator file's budgets, where it has some for this node, else the hello's.
        max_parallel, vram_gb = self.settings.capacity.budgets(
            hello.node_id, hello.max_parallel, hello.vram_gb
        )
        if problem := budget_problem(f"node {hello.node_id}", vram_gb, hello.models, self.needs):
            log.warning("%s", problem)
        # A node whose backend is down at its hello serves nothing until a heartbeat says so.
        down = None if hello.backend_down is msgspec.UNSET else hello.backend_down
        conn = NodeConnection(
            conn_id=self.new_id("c-"),
            node_id=hello.node_id,
            models=frozenset(hello.models) if down is None else frozenset(),
            advertised=frozenset(hello.models),
            backend_down=down,
            max_parallel=max_parallel,
            vram_gb=vram_gb,
            agent_version=hello.agent_version,
            connected_at=self.wall_clock(),
            last_seen=now,
            protocol=protocol,
        )
        # Leases are checked against these facts: they exist before anybody can place here.
        await self.node_facts.write_now(conn)
        # Its heartbeat interval (longer past GEMMANET_HEARTBEAT_RATE heartbeats a second).
        self.heartbeats.attach(link, conn, self._links, self.machine.owner.nodes)
        self._links[conn.conn_id] = link
        self.apply(self.machine.node_connected(conn, self.clock()))
        try:
            previous = await self.ownership.claim(conn)
        except BaseException:
            self.detach_node(conn, "could not be registered")
            raise
        # A connection of the node on another instance is closed there (the machine says how).
        self.apply(self.machine.node_claimed(conn, previous, self.clock()))
        self.membership.snapshot_changed()
        self.metrics.node_connects.inc()
        return conn

    def detach_node(self, conn: NodeConnection, why: str = "disconnected") -> None:
        """The connection is gone: its pending tasks fail at once (502)."""
        self.apply(self.machine.node_disconnected(conn.conn_id, why, self.clock()))
        self._links.pop(conn.conn_id, None)

    def on_node_envelope(self, conn: NodeConnection, envelope: object) -> None:
        if isinstance(envelope, Error) and envelope.task_id is None:
            log.warning("node %s reports %s: %s", conn.node_id, envelope.code, envelope.message)
        elif isinstance(envelope, Error):
            task_log.task_failed_on_node(envelope, conn.node_id)
        elif isinstance(envelope, Heartbeat):
            self.telemetry.offer(conn.node_id, envelope.telemetry)
        self.apply(self.machine.node_envelope(conn.conn_id, envelope, self.clock()))

    # -- the bus ----------------------------------------------------------------------------

    async def _read_bus(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        await read_inbox(
            self.bus, self.instance_id, self._on_bus_payload, self._on_bus_lost, task_status
        )

    def _on_bus_payload(self, payload: bytes) -> None:
        self.metrics.bus_received.inc()
        try:
            envelope = decode_bus(payload)
        except ProtocolError as exc:
            log.warning("dropped an unreadable bus envelope: %s", exc)
            self.metrics.bus_dropped.labels(reason="unreadable").inc()
            return
        self.apply(self.machine.bus_envelope(envelope, self.clock()))

    def _on_bus_lost(self) -> None:
        self.bus_losses += 1
        self.apply(self.machine.bus_lost(self.clock()))

    # -- request side -----------------------------------------------------------------------

    # -- status (what the API reads of the cluster: runtime/instance_status.py) -------------

    def diagnostics(self) -> dict[str, object]:
        """Counters of this instance only: what was refused or lost, for operators and tests."""
        return cluster_view.diagnostics(
            self.machine,
            liveness_lost=self.membership.liveness_lost,
            bus_losses=self.bus_losses,
            local_queued=self.admissions.queued(),
            lost_leases=self.admissions.lost_leases,
        )
