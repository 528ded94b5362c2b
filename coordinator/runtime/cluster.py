"""Membership of one instance in a shared Redis: heartbeat and registry, node ownership, the
instance bus, and the sweepers that turn a dead peer into fast 502s.

Presence and the liveness judge live in ``membership.Membership``; this module asks it who is
dead every ``sweep_s`` and carries out the consequences (502s, cancels on nodes). Ownership
keys keep the long ``owner_ttl_s`` and are checked every beat.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING

import msgspec
import trio

from coordinator.coordination import Coordination, CoordinationUnavailable
from coordinator.core import registry
from coordinator.core.forwarding import Forward, ForwardingTable
from coordinator.core.node_table import NodeConnection
from coordinator.core.placement import NodeView
from coordinator.core.registry import InstanceSnapshot, NodeEntry
from coordinator.runtime.bus import Bus
from coordinator.runtime.bus_outbox import BusOutbox
from coordinator.runtime.membership import Membership, StartupRefused
from protocol import (
    Assign,
    BusAssign,
    BusCancel,
    BusChunk,
    BusNodeGone,
    BusReplace,
    BusResult,
    Chunk,
    Error,
    ProtocolError,
    Result,
    TaskFailure,
    decode_bus,
    encode,
)

if TYPE_CHECKING:
    from coordinator.runtime.instance import Instance

log = logging.getLogger("gemmanet.cluster")


__all__ = ["Cluster", "StartupRefused", "hold_single_instance_lock"]


class Cluster:
    def __init__(self, instance: Instance, coordination: Coordination, bus: Bus) -> None:
        self.instance = instance
        self.settings = instance.settings
        self.me = instance.instance_id
        self.coordination = coordination
        self.bus = bus
        self.forwarding = ForwardingTable()
        self._clock = instance.clock
        self.membership = Membership(
            coordination, bus, self.settings, snapshot=self._snapshot, clock=self._clock
        )
        self.membership.on_presence_lapsed = self._after_liveness_gap
        self._views: list[NodeView] | None = None
        self._views_version = -1
        self._claimed: set[str] = set()  # conn ids whose ownership claim completed
        self._views_ratings: dict[str, tuple[float, int]] | None = None
        self.outbox = BusOutbox(bus, self._clock)
        self.bus_losses = 0

    @property
    def liveness_lost(self) -> int:
        return self.membership.liveness_lost

    # -- lifecycle --------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            await self.coordination.ping()
        except CoordinationUnavailable as exc:
            raise StartupRefused(f"cannot reach Redis at start: {exc}") from None
        async with trio.open_nursery() as nursery:
            # Listen before announcing ourselves: an assign sent the moment we appear alive
            # must find our inbox open.
            await nursery.start(self._read_bus)
            await nursery.start(self.membership.run)
            await nursery.start(self.outbox.run)
            nursery.start_soon(self._watch_ownership)
            nursery.start_soon(self._refresh_ownership)
            nursery.start_soon(self._sweep)
            task_status.started()

    async def aclose(self) -> None:
        """Leave the cluster politely: peers see us gone now rather than at the TTL."""
        await self.membership.leave()

    # -- registry ---------------------------------------------------------------------------

    def _snapshot(self) -> InstanceSnapshot:
        return InstanceSnapshot(
            instance_id=self.me,
            in_flight=len(self.instance.tracker),
            nodes=[
                NodeEntry(
                    node_id=c.node_id,
                    conn_id=c.conn_id,
                    models=sorted(c.models),
                    max_parallel=c.max_parallel,
                    in_flight=c.in_flight,
                    vram_gb=c.vram_gb,
                    agent_version=c.agent_version,
                    connected_at=c.connected_at,
                )
                for c in self.instance.nodes.connections()
            ],
        )

    async def _after_liveness_gap(self) -> None:
        """Our alive key had expired (first start, a freeze, a Redis outage). Peers may have
        declared us dead and failed the tasks they forwarded here, and our nodes may have
        reconnected elsewhere: drop forwards and keep only the nodes we still own."""
        dropped = self.forwarding.clear()
        for forward in dropped:
            self.instance.cancel_on_node(forward.conn_id, forward.task_id, "owner_lost_liveness")
        if dropped or self.instance.nodes.connections():
            log.warning(
                "instance %s was considered dead; dropped %d forwarded task(s), re-checking "
                "ownership of %d node(s)",
                self.me,
                len(dropped),
                len(self.instance.nodes),
            )
        for conn in self.instance.nodes.connections():
            await self._confirm_ownership(conn)

    async def _watch_ownership(self) -> None:
        while True:
            await trio.sleep(self.settings.beat_s)
            try:
                await self._check_ownership()
            except CoordinationUnavailable as exc:
                log.warning("ownership check failed: %s", exc)

    def snapshot_changed(self) -> None:
        """A node came or went: publish the registry now, not at the next beat."""
        self.membership.snapshot_changed()

    def peer_snapshots(self) -> list[InstanceSnapshot]:
        """Last known snapshots of the other live instances."""
        return self.membership.peers()

    def remote_views(self, ratings: dict[str, tuple[float, int]]) -> list[NodeView]:
        """Placement candidates on peers: built once per registry refresh (placement runs on
        every request), corrected for the tasks this instance sent since the snapshot."""
        if (
            self._views is None
            or self._views_ratings is not ratings
            or self._views_version != self.membership.version
        ):
            self._views_version = self.membership.version
            self._views = registry.remote_views(
                self.peer_snapshots(), ratings, exclude_instance=self.me, pending_per_conn={}
            )
            self._views_ratings = ratings
        pending: dict[str, int] = {}
        for task in self.instance.tracker.pending():
            if task.owner_instance != self.me:
                pending[task.conn_id] = pending.get(task.conn_id, 0) + 1
        if not pending:
            return self._views
        return [
            replace(v, in_flight=pending[v.conn_id])
            if pending.get(v.conn_id, 0) > v.in_flight
            else v
            for v in self._views
        ]

    def forget_peer(self, instance_id: str) -> None:
        self.membership.forget_peer(instance_id)

    # -- ownership --------------------------------------------------------------------------

    async def claim(self, conn: NodeConnection) -> None:
        """Make this connection the owner of its node identity everywhere; an older owner on
        another instance is told to close its connection with 4000."""
        previous = registry.parse_owner(
            await self.coordination.swap(
                registry.owner_key(conn.node_id),
                registry.owner_value(self.me, conn.conn_id),
                ttl_s=self.settings.owner_ttl_s,
            )
        )
        self._claimed.add(conn.conn_id)
        if previous is not None and previous[0] != self.me:
            old_instance, old_conn = previous
            self.outbox.send(
                old_instance,
                BusReplace(node_id=conn.node_id, conn_id=old_conn, new_instance=self.me),
                give_up_in=5.0,
            )
        self.snapshot_changed()

    async def release(self, conn: NodeConnection) -> None:
        """Drop our ownership record, unless a newer connection already took it over."""
        self._claimed.discard(conn.conn_id)
        try:
            await self.coordination.compare_and_set(
                registry.owner_key(conn.node_id), registry.owner_value(self.me, conn.conn_id), None
            )
        except CoordinationUnavailable:
            pass  # it expires with its TTL
        self.snapshot_changed()

    async def _confirm_ownership(self, conn: NodeConnection) -> None:
        key, mine = registry.owner_key(conn.node_id), registry.owner_value(self.me, conn.conn_id)
        ttl = self.settings.owner_ttl_s
        if await self.coordination.refresh_if(key, mine, ttl):
            return
        if await self.coordination.compare_and_set(key, None, mine, ttl_s=ttl):
            return
        log.warning("node %s is owned elsewhere now; closing our stale connection", conn.node_id)
        self.instance.replace_connection(conn.conn_id, conn.node_id)

    async def _check_ownership(self) -> None:
        """Every beat, one read of our nodes' owner keys: a connection whose identity is owned
        elsewhere now is closed even if the replace envelope was lost on the bus (at-most-once)."""
        # Only connections whose claim completed before this read: a claim still in flight
        # would otherwise look like a connection owned elsewhere.
        conns = [c for c in self.instance.nodes.connections() if c.conn_id in self._claimed]
        if not conns:
            return
        values = await self.coordination.get_many([registry.owner_key(c.node_id) for c in conns])
        for conn, value in zip(conns, values, strict=True):
            owner = registry.parse_owner(value)
            if owner is None:
                await self._confirm_ownership(conn)  # expired (a long freeze): claim it back
            elif owner != (self.me, conn.conn_id):
                log.warning(
                    "node %s is owned by %s now; closing our connection", conn.node_id, owner[0]
                )
                self.instance.replace_connection(conn.conn_id, conn.node_id)

    async def _refresh_ownership(self) -> None:
        while True:
            await trio.sleep(self.settings.owner_ttl_s / 3)
            for conn in self.instance.nodes.connections():
                try:
                    await self._confirm_ownership(conn)
                except CoordinationUnavailable as exc:
                    log.warning("could not refresh ownership of %s: %s", conn.node_id, exc)
                    break

    # -- requester side ---------------------------------------------------------------------

    async def dispatch(self, view: NodeView, assign: Assign) -> bool:
        """Send a task to the instance owning ``view``'s connection. False when that instance
        has nobody listening (it is gone; the caller places the task elsewhere)."""
        envelope = BusAssign(
            task_id=assign.task_id,
            node_id=view.node_id,
            conn_id=view.conn_id,
            model=assign.model,
            prompt=assign.prompt,
            stream=assign.stream,
            timeout_s=assign.timeout_s,
            reply_to=self.me,
        )
        reached = await self.bus.send(view.instance_id, encode(envelope))
        if reached == 0:
            self.forget_peer(view.instance_id)
        return reached > 0

    def cancel_remote(self, owner_instance: str, task_id: str, reason: str) -> None:
        self.outbox.send(owner_instance, BusCancel(task_id=task_id, reason=reason), give_up_in=5.0)

    async def _sweep(self) -> None:
        """Both sides of cross-instance tasks, every beat. Requester side: tasks waiting on a
        dead owner fail with 502. Owner side: tasks requested by a dead instance are cancelled
        on their nodes (nobody will read the answer; the node's slot and compute are freed at
        once rather than at the task's timeout), and expired forwards are dropped."""
        while True:
            await trio.sleep(self.settings.sweep_s)
            for forward in self.forwarding.expired(self._clock()):
                self.instance.cancel_on_node(forward.conn_id, forward.task_id, "task_timeout")
            owners = {t.owner_instance for t in self.instance.tracker.pending()} - {self.me}
            requesters = self.forwarding.requesters() - {self.me}
            peers = sorted(owners | requesters)
            try:
                # Even with no peers to judge: the judge must see Redis answer every sweep.
                dead = await self.membership.dead_among(peers)
            except CoordinationUnavailable:
                continue  # cannot tell: nobody is declared dead on a silent Redis
            if not dead:
                continue
            alive = set(peers) - dead
            if owners & dead:
                self.instance.fail_tasks_of_dead_owners(alive | {self.me})
            for forward in self.forwarding.of_requesters(dead):
                self.instance.cancel_on_node(forward.conn_id, forward.task_id, "requester_gone")
                # A requester that was only frozen reads this when it resumes: 502, not 504.
                self.outbox.send(
                    forward.reply_to,
                    BusNodeGone(
                        task_id=forward.task_id,
                        node_id=forward.node_id,
                        conn_id=forward.conn_id,
                        reason="the requesting instance was considered dead",
                    ),
                )

    # -- owner side -------------------------------------------------------------------------

    def forward_answer(self, conn: NodeConnection, envelope: object) -> bool:
        """A node answered a task that a peer requested; False when it is not one of ours."""
        task_id = getattr(envelope, "task_id", None)
        if task_id is None or task_id not in self.forwarding:
            return False
        forward = self.forwarding.answerable(task_id, conn.conn_id)
        if forward is None:
            return True  # assigned to another connection: dropped and counted
        out: msgspec.Struct
        if isinstance(envelope, Chunk):
            out = BusChunk(
                task_id=task_id, conn_id=conn.conn_id, seq=envelope.seq, delta=envelope.delta
            )
        elif isinstance(envelope, Result):
            out = BusResult(
                task_id=task_id,
                node_id=conn.node_id,
                conn_id=conn.conn_id,
                output=envelope.output,
                chunks=envelope.chunks,
            )
        elif isinstance(envelope, Error):
            out = BusResult(
                task_id=task_id,
                node_id=conn.node_id,
                conn_id=conn.conn_id,
                failure=TaskFailure(code=envelope.code, message=envelope.message),
            )
        else:
            return True
        if not isinstance(envelope, Chunk):
            self.forwarding.remove(task_id)
            conn.tasks.discard(task_id)

        def requester_gone() -> None:
            # Nobody waits any more: stop the node working on it.
            if self.forwarding.remove(task_id) is not None:
                self.instance.cancel_on_node(conn.conn_id, task_id, "requester_gone")

        self.outbox.send(
            forward.reply_to, out, give_up_at=forward.expires_at, on_unreached=requester_gone
        )
        return True

    def connection_lost(self, conn: NodeConnection, why: str) -> None:
        self._claimed.discard(conn.conn_id)
        for forward in self.forwarding.of_connection(conn.conn_id):
            self.outbox.send(
                forward.reply_to,
                BusNodeGone(
                    task_id=forward.task_id, node_id=conn.node_id, conn_id=conn.conn_id, reason=why
                ),
                give_up_at=forward.expires_at,
            )

    def _on_assign(self, envelope: BusAssign) -> None:
        conn = self.instance.nodes.by_node(envelope.node_id)

        def refuse(failure: TaskFailure | None, reason: str) -> None:
            reply: msgspec.Struct
            if failure is None:
                reply = BusNodeGone(
                    task_id=envelope.task_id,
                    node_id=envelope.node_id,
                    conn_id=envelope.conn_id,
                    reason=reason,
                )
            else:
                reply = BusResult(
                    task_id=envelope.task_id,
                    node_id=envelope.node_id,
                    conn_id=envelope.conn_id,
                    failure=failure,
                )
            self.outbox.send(envelope.reply_to, reply, give_up_in=5.0)

        if conn is None or conn.conn_id != envelope.conn_id:
            refuse(None, "the node's connection is no longer here")
            return
        if envelope.task_id in self.forwarding:
            return  # a replayed assign
        if conn.in_flight >= conn.max_parallel:
            refuse(
                TaskFailure(code="all_nodes_busy", message=f"node {conn.node_id} is at capacity"),
                "",
            )
            return
        self.forwarding.add(
            Forward(
                task_id=envelope.task_id,
                node_id=conn.node_id,
                conn_id=conn.conn_id,
                reply_to=envelope.reply_to,
                expires_at=self._clock() + envelope.timeout_s + self.settings.forward_grace_s,
            )
        )
        conn.tasks.add(envelope.task_id)
        self.instance.send_to_node(
            conn.conn_id,
            Assign(
                task_id=envelope.task_id,
                model=envelope.model,
                prompt=envelope.prompt,
                stream=envelope.stream,
                timeout_s=envelope.timeout_s,
            ),
        )

    def _on_cancel(self, envelope: BusCancel) -> None:
        forward = self.forwarding.remove(envelope.task_id)
        if forward is not None:
            self.instance.cancel_on_node(forward.conn_id, forward.task_id, envelope.reason)

    # -- the bus ----------------------------------------------------------------------------

    async def _read_bus(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        backoff = 0.1
        started = False
        while True:
            try:
                async with self.bus.listen(self.me) as inbox:
                    if not started:
                        task_status.started()
                        started = True
                    elif self.bus_losses:
                        log.info("instance bus re-established")
                    backoff = 0.1
                    async for payload in inbox:
                        self._dispatch(payload)
            except CoordinationUnavailable as exc:
                if not started:
                    raise StartupRefused(f"cannot subscribe to the instance bus: {exc}") from None
                self.bus_losses += 1
                log.warning("instance bus lost (%s); failing tasks whose answers may be lost", exc)
                self.instance.fail_remote_tasks("lost the instance bus; the answer may be lost")
                for forward in self.forwarding.clear():
                    self.instance.cancel_on_node(forward.conn_id, forward.task_id, "bus_lost")
                await trio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)

    def _dispatch(self, payload: bytes) -> None:
        try:
            envelope = decode_bus(payload)
        except ProtocolError as exc:
            log.warning("dropped an unreadable bus envelope: %s", exc)
            return
        if isinstance(envelope, BusChunk):
            self.instance.accept_chunk(
                envelope.task_id, envelope.conn_id, envelope.seq, envelope.delta
            )
        elif isinstance(envelope, BusResult):
            self.instance.accept_remote_finish(envelope)
        elif isinstance(envelope, BusNodeGone):
            self.instance.accept_node_gone(envelope)
        elif isinstance(envelope, BusAssign):
            self._on_assign(envelope)
        elif isinstance(envelope, BusCancel):
            self._on_cancel(envelope)
        elif isinstance(envelope, BusReplace):
            conn = self.instance.nodes.by_conn(envelope.conn_id)
            if conn is not None and conn.node_id == envelope.node_id:
                self.instance.replace_connection(conn.conn_id, conn.node_id)


async def hold_single_instance_lock(
    coordination: Coordination,
    instance_id: str,
    *,
    ttl_s: float,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """GEMMANET_MULTI_INSTANCE=0 with Redis: exactly one instance may run. A second one
    refuses to start; the lock expires ``ttl_s`` after its holder dies."""
    key, value = registry.SINGLE_INSTANCE_LOCK, instance_id.encode()
    try:
        acquired = await coordination.set(key, value, ttl_s=ttl_s, only_if_absent=True)
        holder = None if acquired else await coordination.get(key)
    except CoordinationUnavailable as exc:
        raise StartupRefused(f"cannot reach Redis at start: {exc}") from None
    if not acquired and holder != value:
        name = holder.decode(errors="replace") if holder else "another instance"
        raise StartupRefused(
            f"instance {name} holds the single-instance lock in this Redis; set "
            f"GEMMANET_MULTI_INSTANCE=1 to run several instances (the lock expires {ttl_s:g} s "
            "after its holder stops)"
        )
    task_status.started()
    try:
        while True:
            await trio.sleep(ttl_s / 3)
            try:
                if not await coordination.refresh_if(key, value, ttl_s):
                    await coordination.set(key, value, ttl_s=ttl_s, only_if_absent=True)
            except CoordinationUnavailable as exc:
                log.warning("could not refresh the single-instance lock: %s", exc)
    finally:
        with trio.move_on_after(1), trio.CancelScope(shield=True):
            try:
                await coordination.compare_and_set(key, value, None)
            except CoordinationUnavailable:
                pass
