"""One coordinator instance: its node connections, its pending tasks, and their supervision.

Local nodes are served directly from the NodeTable (no Redis on that path); nodes on other
instances are reached through the Cluster (multi-instance mode only). Every answer, local or
from the bus, is checked by the TaskTracker before it reaches the waiting request.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import msgspec
import trio

from coordinator.coordination import Coordination, CoordinationUnavailable
from coordinator.core import registry
from coordinator.core.node_table import NodeConnection, NodeTable
from coordinator.core.placement import NodeView, choose_node
from coordinator.core.tracker import TaskTracker, Verdict
from coordinator.errors import (
    AllNodesBusy,
    CoordinationDown,
    GemmaNetError,
    NodeDisconnected,
    NodeFailed,
    RateLimited,
    TaskTimedOut,
)
from coordinator.runtime.node_link import NodeLink
from coordinator.runtime.task_handle import (
    ChunkEvent,
    DoneEvent,
    FailedEvent,
    TaskEvent,
    TaskHandle,
)
from coordinator.runtime.task_recorder import TaskRecorder
from coordinator.settings import Settings
from coordinator.store import Store, TaskNotFound, TaskRecord
from protocol import (
    Assign,
    BusNodeGone,
    BusResult,
    Cancel,
    Chunk,
    Error,
    Heartbeat,
    Hello,
    Result,
)

if TYPE_CHECKING:
    from coordinator.runtime.cluster import Cluster

log = logging.getLogger("gemmanet.instance")

CLOSE_REPLACED = 4000
# A node silent past its heartbeat deadline (an extension of INTERFACE.md's 4000-4002; the agent
# reconnects on it like on any other loss).
CLOSE_HEARTBEAT_TIMEOUT = 4003
# Node-reported errors that mean "not now" rather than "this task is broken".
_BUSY_CODES = {"node_busy", "node_draining", "all_nodes_busy"}
RATINGS_REFRESH_S = 15.0
# How often a request re-places its task when the instance it chose turned out to be gone.
PLACEMENT_ATTEMPTS = 3


def failure_error(node_id: str, code: str, message: str) -> GemmaNetError:
    """The client-facing error for a task failure a node (or its owner instance) reported."""
    if code in _BUSY_CODES:
        return AllNodesBusy(f"node {node_id} refused the task: {message}", retry_after_s=1)
    if code == "node_disconnected":
        return NodeDisconnected(message)
    return NodeFailed(f"node {node_id} failed the task ({code}): {message}")


class Instance:
    def __init__(
        self,
        settings: Settings,
        store: Store,
        coordination: Coordination,
        *,
        clock: Callable[[], float] = trio.current_time,
        wall_clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
    ) -> None:
        self.settings = settings
        self.instance_id = settings.instance_id
        self.store = store
        self.coordination = coordination
        self.cluster: Cluster | None = None
        self.nodes = NodeTable()
        self.tracker = TaskTracker()
        self.ratings: dict[str, tuple[float, int]] = {}
        self.clock = clock
        self._wall_clock = wall_clock
        self._rng = rng or random.Random()
        self._ids = random.Random(self._rng.getrandbits(64)) if rng else random.SystemRandom()
        self._links: dict[str, NodeLink] = {}
        self._waiting: dict[str, trio.MemorySendChannel[TaskEvent]] = {}
        self._nursery: trio.Nursery | None = None
        self.recorder = TaskRecorder(store)

    # -- supervision ------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await nursery.start(self.recorder.run)
            if self.cluster is not None:
                await nursery.start(self.cluster.run)
            nursery.start_soon(self._drop_silent_nodes)
            nursery.start_soon(self._refresh_ratings)
            nursery.start_soon(self._sweep_expired_tasks)
            task_status.started()

    async def _drop_silent_nodes(self) -> None:
        interval = self.settings.heartbeat_interval_s
        deadline = interval * self.settings.heartbeat_misses
        last_tick = self.clock()
        while True:
            await trio.sleep(interval)
            now = self.clock()
            overslept = now - last_tick > 2 * interval
            last_tick = now
            if overslept:
                # This process was frozen (SIGSTOP, swapping, a debugger): the nodes' heartbeats
                # are still waiting in the sockets. Read them before judging anybody silent.
                continue
            for conn in self.nodes.silent(now, deadline):
                log.warning("node %s silent for over %.1f s; dropping it", conn.node_id, deadline)
                self._close_link(conn.conn_id, CLOSE_HEARTBEAT_TIMEOUT, "heartbeat timeout")
                # Fail its tasks now: the socket may take a while to notice it is dead.
                self.detach_node(conn, "stopped sending heartbeats")

    async def _refresh_ratings(self) -> None:
        while True:
            try:
                self.ratings = await self.store.node_ratings()
            except Exception:
                log.exception("could not refresh node ratings")
            await trio.sleep(RATINGS_REFRESH_S)

    async def _sweep_expired_tasks(self) -> None:
        """Safety net for handles nobody ended (a client that vanished before its stream
        began): past its deadline a task fails, and its node is told to stop."""
        while True:
            await trio.sleep(1.0)
            for task in self.tracker.expired(self.clock()):
                self._deliver(
                    task.task_id, FailedEvent(TaskTimedOut(f"task {task.task_id} timed out"))
                )
                self._waiting.pop(task.task_id, None)
                self._cancel(task.owner_instance, task.conn_id, task.task_id, "task_timeout")

    def new_id(self, prefix: str) -> str:
        return f"{prefix}{self._ids.getrandbits(96):024x}"

    def _spawn(self, fn: Callable[..., object], *args: object) -> None:
        """Background work that may be skipped when the instance is shutting down (what it
        would tidy up in Redis expires with its TTL anyway)."""
        if self._nursery is None:
            return
        try:
            self._nursery.start_soon(fn, *args)  # type: ignore[arg-type]
        except RuntimeError:  # the nursery is closed: we are shutting down
            pass

    # -- node side --------------------------------------------------------------------------

    async def attach_node(self, hello: Hello, link: NodeLink) -> NodeConnection:
        """Register an authenticated connection; an older one of the same identity (here or on
        any instance) is closed with 4000. Raises CoordinationUnavailable when ownership
        cannot be recorded (the node retries later)."""
        now = self.clock()
        conn = NodeConnection(
            conn_id=self.new_id("c-"),
            node_id=hello.node_id,
            models=frozenset(hello.models),
            max_parallel=hello.max_parallel,
            vram_gb=hello.vram_gb,
            agent_version=hello.agent_version,
            connected_at=self._wall_clock(),
            last_seen=now,
        )
        replaced = self.nodes.register(conn)
        self._links[conn.conn_id] = link
        if replaced is not None:
            log.info("node %s reconnected; closing its previous connection", hello.node_id)
            self._close_link(
                replaced.conn_id,
                CLOSE_REPLACED,
                f"replaced by a newer connection of node {hello.node_id}",
            )
            self._forget_connection(replaced, "was replaced by a newer connection")
        if self.cluster is not None:
            try:
                await self.cluster.claim(conn)
            except BaseException:
                self.detach_node(conn, "could not be registered")
                raise
        return conn

    def detach_node(self, conn: NodeConnection, why: str = "disconnected") -> None:
        """The connection is gone: forget it and fail its pending tasks at once (502)."""
        if self.nodes.by_conn(conn.conn_id) is None and conn.conn_id not in self._links:
            return
        self.nodes.unregister(conn.conn_id)
        self._forget_connection(conn, why)
        if self.cluster is not None:
            self._spawn(self.cluster.release, conn)

    def replace_connection(self, conn_id: str, node_id: str) -> None:
        """A newer connection of the node exists on another instance: close ours with 4000."""
        conn = self.nodes.by_conn(conn_id)
        self._close_link(
            conn_id, CLOSE_REPLACED, f"replaced by a newer connection of node {node_id}"
        )
        if conn is not None:
            self.nodes.unregister(conn_id)
            self._forget_connection(conn, "was replaced by a newer connection")

    def _forget_connection(self, conn: NodeConnection, why: str) -> None:
        self._links.pop(conn.conn_id, None)
        for task in self.tracker.fail_connection(conn.conn_id):
            self._deliver(
                task.task_id,
                FailedEvent(NodeDisconnected(f"node {conn.node_id} {why} during the task")),
            )
        if self.cluster is not None:
            self.cluster.connection_lost(conn, why)
        conn.tasks.clear()

    def _close_link(self, conn_id: str, code: int, reason: str) -> None:
        link = self._links.get(conn_id)
        if link is not None:
            link.request_close(code, reason)

    def send_to_node(self, conn_id: str, envelope: msgspec.Struct) -> None:
        link = self._links.get(conn_id)
        if link is not None:
            link.send_nowait(envelope)

    def cancel_on_node(self, conn_id: str, task_id: str, reason: str) -> None:
        """Tell a local node to stop a task and free its slot."""
        conn = self.nodes.by_conn(conn_id)
        if conn is not None:
            conn.tasks.discard(task_id)
        self.send_to_node(conn_id, Cancel(task_id=task_id, reason=reason))

    def on_node_envelope(self, conn: NodeConnection, envelope: object) -> None:
        """An envelope arrived on ``conn``. Answers are checked against the tracker (tasks
        requested here) or the forwarding table (tasks requested on other instances)."""
        self.nodes.touch(conn.conn_id, self.clock())
        if isinstance(envelope, Heartbeat):
            return
        if self.cluster is not None and self.cluster.forward_answer(conn, envelope):
            return
        if isinstance(envelope, Chunk):
            self.accept_chunk(envelope.task_id, conn.conn_id, envelope.seq, envelope.delta)
        elif isinstance(envelope, Result):
            self._accept_finish(envelope.task_id, conn.conn_id, DoneEvent(envelope.output))
        elif isinstance(envelope, Error):
            if envelope.task_id is None:
                log.warning("node %s reports %s: %s", conn.node_id, envelope.code, envelope.message)
                return
            error = failure_error(conn.node_id, envelope.code, envelope.message)
            self._accept_finish(envelope.task_id, conn.conn_id, FailedEvent(error))

    # -- answers, local or from the bus -----------------------------------------------------

    def accept_chunk(self, task_id: str, conn_id: str, seq: int, delta: str) -> None:
        verdict, deltas = self.tracker.on_chunk(task_id, conn_id, seq, delta)
        for piece in deltas:
            self._deliver(task_id, ChunkEvent(piece))
        if verdict is Verdict.OVERFLOW:
            task = self.tracker.get(task_id)
            if task is not None:
                error = NodeFailed(f"node {task.node_id} sent chunks too far out of order")
                self._accept_finish(task_id, conn_id, FailedEvent(error))

    def accept_remote_finish(self, envelope: BusResult) -> None:
        event: TaskEvent
        if envelope.failure is not None:
            error = failure_error(envelope.node_id, envelope.failure.code, envelope.failure.message)
            event = FailedEvent(error)
        else:
            event = DoneEvent(envelope.output or "")
        self._accept_finish(envelope.task_id, envelope.conn_id, event)

    def accept_node_gone(self, envelope: BusNodeGone) -> None:
        error = NodeDisconnected(
            f"node {envelope.node_id} went away during the task ({envelope.reason or 'disconnected'})"
        )
        self._accept_finish(envelope.task_id, envelope.conn_id, FailedEvent(error))

    def _accept_finish(self, task_id: str, conn_id: str, event: TaskEvent) -> None:
        task = self.tracker.get(task_id)
        if self.tracker.on_finish(task_id, conn_id) is Verdict.ACCEPTED:
            if task is not None and task.owner_instance == self.instance_id:
                conn = self.nodes.by_conn(conn_id)
                if conn is not None:
                    conn.tasks.discard(task_id)
            self._deliver(task_id, event)

    def _deliver(self, task_id: str, event: TaskEvent) -> None:
        channel = self._waiting.get(task_id)
        if channel is not None:
            channel.send_nowait(event)

    def fail_tasks_of_dead_owners(self, alive: set[str], why: str | None = None) -> None:
        """Tasks waiting on an instance not in ``alive`` end now with 502."""
        for task in self.tracker.fail_tasks_of_dead_owners(alive):
            message = why or f"instance {task.owner_instance} serving node {task.node_id} went away"
            self._deliver(task.task_id, FailedEvent(NodeDisconnected(message)))

    def fail_remote_tasks(self, why: str) -> None:
        """Every task waiting on another instance ends now (its answer may have been lost)."""
        self.fail_tasks_of_dead_owners({self.instance_id}, why)

    # -- request side -----------------------------------------------------------------------

    def node_views(self) -> list[NodeView]:
        local = self.nodes.views(self.instance_id, self.ratings)
        if self.cluster is None:
            return local
        # A node being replaced across instances may briefly show twice: the local
        # connection, when there is one, is the newest this instance knows of.
        local_ids = {v.node_id for v in local}
        remote = [v for v in self.cluster.remote_views(self.ratings) if v.node_id not in local_ids]
        return local + remote

    async def check_rate_limit(self, key_id: str) -> None:
        limit, period = self.settings.rate_limit
        try:
            decision = await self.coordination.rate_limit(
                f"ratelimit:{key_id}", limit=limit, period_s=period
            )
        except CoordinationUnavailable as exc:
            raise CoordinationDown(f"coordination store unavailable: {exc}") from None
        if not decision.allowed:
            raise RateLimited(
                f"rate limit of {limit} requests per {period:g} s exceeded for this API key",
                retry_after_s=decision.retry_after_s,
            )

    async def start_task(
        self, *, key_id: str, model: str, prompt: str, stream: bool, timeout_s: float | None
    ) -> TaskHandle:
        """Place a task on a node and send it there. The caller must ``end_task`` the handle
        (``open_task`` does it); a handle that is never ended is swept at its deadline."""
        timeout = min(timeout_s or self.settings.task_timeout_s, self.settings.task_timeout_s)
        task_id = self.new_id("t-")
        deadline = self.clock() + timeout
        assign = Assign(
            task_id=task_id, model=model, prompt=prompt, stream=stream, timeout_s=timeout
        )
        view, events = await self._place(assign, deadline)
        return TaskHandle(
            task_id=task_id,
            node_id=view.node_id,
            conn_id=view.conn_id,
            owner_instance=view.instance_id,
            events=events,
            deadline=deadline,
            timeout_s=timeout,
            key_id=key_id,
            model=model,
            stream=stream,
            created_at=self._wall_clock(),
        )

    async def _place(
        self, assign: Assign, deadline: float
    ) -> tuple[NodeView, trio.MemoryReceiveChannel[TaskEvent]]:
        task_id = assign.task_id
        for _ in range(PLACEMENT_ATTEMPTS):
            view = choose_node(self.node_views(), assign.model, rng=self._rng)
            # A fresh channel per attempt: what happened to an attempt that reached nobody
            # (its owner declared dead meanwhile) must not reach the request.
            send, receive = trio.open_memory_channel[TaskEvent](math.inf)
            self._waiting[task_id] = send
            self.tracker.open(
                task_id,
                node_id=view.node_id,
                conn_id=view.conn_id,
                owner_instance=view.instance_id,
                deadline=deadline,
            )
            if view.instance_id == self.instance_id:
                conn = self.nodes.by_conn(view.conn_id)
                assert conn is not None, "a local view always has its connection"
                conn.tasks.add(task_id)
                self.send_to_node(conn.conn_id, assign)
                return view, receive
            assert self.cluster is not None
            try:
                reached = await self.cluster.dispatch(view, assign)
            except BaseException as exc:
                self.tracker.forget(task_id)
                self._waiting.pop(task_id, None)
                if isinstance(exc, CoordinationUnavailable):
                    raise CoordinationDown(f"cannot reach the instance bus: {exc}") from None
                raise
            if reached:
                # Delivered. If its owner was declared dead meanwhile, the 502 already waits.
                return view, receive
            # Nobody received it, so no node ever saw it: forget the attempt, place again.
            self.tracker.forget(task_id)
            self._waiting.pop(task_id, None)
        raise NodeDisconnected(f"the instances serving model {assign.model!r} went away")

    async def end_task(self, handle: TaskHandle, outcome: str) -> None:
        """The request is done with its task (``outcome``: "ok" or an error code). Cancels it
        on the node if it is still running, and records it. Idempotent."""
        if handle.outcome is not None:
            return
        handle.outcome = outcome
        self._waiting.pop(handle.task_id, None)
        task = self.tracker.close(handle.task_id)
        if task is not None:
            # Nobody waits for the answer any more: free the node's slot and tell the node.
            self._cancel(task.owner_instance, task.conn_id, task.task_id, outcome)
        self._record(handle)

    def _cancel(self, owner_instance: str, conn_id: str, task_id: str, reason: str) -> None:
        if owner_instance == self.instance_id:
            self.cancel_on_node(conn_id, task_id, reason)
        elif self.cluster is not None:
            self.cluster.cancel_remote(owner_instance, task_id, reason)

    @asynccontextmanager
    async def open_task(
        self, *, key_id: str, model: str, prompt: str, stream: bool, timeout_s: float | None
    ) -> AsyncIterator[TaskHandle]:
        """``start_task`` … ``end_task`` as a block; leaving it early cancels the task."""
        handle = await self.start_task(
            key_id=key_id, model=model, prompt=prompt, stream=stream, timeout_s=timeout_s
        )
        outcome = "internal_error"
        try:
            yield handle
            outcome = "ok"
        except GemmaNetError as exc:
            outcome = exc.code
            raise
        except trio.Cancelled:
            outcome = "client_gone"
            raise
        finally:
            await self.end_task(handle, outcome)

    def _record(self, handle: TaskHandle) -> None:
        outcome = handle.outcome or "ok"
        self.recorder.add(
            TaskRecord(
                task_id=handle.task_id,
                key_id=handle.key_id,
                node_id=handle.node_id,
                model=handle.model,
                status="ok" if outcome == "ok" else "error",
                error_code=None if outcome == "ok" else outcome,
                created_at=handle.created_at,
                finished_at=self._wall_clock(),
                stream=handle.stream,
                instance_id=self.instance_id,
            )
        )

    async def rate_task(self, task_id: str, key_id: str, score: int) -> None:
        """Rate a task. Its record may still be on its way to the database (written in
        batches every 50 ms, here or on the instance that served it): wait for it briefly
        before answering that the task does not exist."""
        for delay in (0.0, 0.1, 0.2, 0.4):
            await trio.sleep(delay)
            if self.recorder.is_pending(task_id):
                await self.recorder.flush()
            try:
                await self.store.rate_task(task_id, key_id, score)
                return
            except TaskNotFound:
                continue
        raise TaskNotFound(task_id)

    # -- status -----------------------------------------------------------------------------

    async def cluster_status(self) -> dict[str, object]:
        mine = {c.node_id for c in self.nodes.connections()}
        peers = self.cluster.peer_snapshots() if self.cluster is not None else []
        return {
            "online_nodes": len(mine | registry.online_node_ids(peers)),
            "instances": 1 + len(peers),
            "in_flight": len(self.tracker) + sum(p.in_flight for p in peers),
            "instance_id": self.instance_id,
            "diagnostics": self.diagnostics(),
        }

    def diagnostics(self) -> dict[str, object]:
        """Counters of this instance only: what was refused or lost, for operators and tests."""
        cluster = self.cluster
        return {
            "local_nodes": len(self.nodes),
            "local_in_flight": len(self.tracker),
            "dropped_answers": {v.value: n for v, n in self.tracker.dropped.items()},
            "forwarded_in_flight": len(cluster.forwarding) if cluster else 0,
            "forwards_dropped_wrong_source": cluster.forwarding.dropped_wrong_source
            if cluster
            else 0,
            "liveness_lost": cluster.liveness_lost if cluster else 0,
            "bus_losses": cluster.bus_losses if cluster else 0,
        }

    async def cluster_nodes(self) -> list[dict[str, object]]:
        infos: dict[str, dict[str, object]] = {}
        for conn in self.nodes.connections():
            infos[conn.node_id] = {
                "node_id": conn.node_id,
                "instance_id": self.instance_id,
                "models": sorted(conn.models),
                "max_parallel": conn.max_parallel,
                "in_flight": conn.in_flight,
                "vram_gb": conn.vram_gb,
                "agent_version": conn.agent_version,
                "connected_at": conn.connected_at,
            }
        if self.cluster is not None:
            for snap in self.cluster.peer_snapshots():
                for entry in snap.nodes:
                    infos.setdefault(
                        entry.node_id,
                        {
                            "node_id": entry.node_id,
                            "instance_id": snap.instance_id,
                            "models": list(entry.models),
                            "max_parallel": entry.max_parallel,
                            "in_flight": entry.in_flight,
                            "vram_gb": entry.vram_gb,
                            "agent_version": entry.agent_version,
                            "connected_at": entry.connected_at,
                        },
                    )
        for node_id, info in infos.items():
            mean, count = self.ratings.get(node_id, (None, 0))
            info["rating"], info["ratings"] = mean, count
        return [infos[k] for k in sorted(infos)]
