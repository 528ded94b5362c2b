"""The node agent: one outbound WebSocket to the coordinator, tasks run against a backend.

Lifetimes nest like this::

    NodeAgent.run                  the backend checked once, then the reconnect loop
                                   (reconnect.py: the coordinators in turn, at once when
                                   told to move, else backoff with full jitter) beside:
      BackendHealth.watch          the backend's checks (health.py), for the agent's life
      one connection               hello -> welcome, then a nursery of:
        send_all                   the only writer of the socket (frames never interleave)
        Heartbeats                 every interval, and at once when the backend goes down or
                                   returns (heartbeats.py)
        _drain_watch               on drain: wait for running tasks, then close with 1000
        _run_task (one per task)   own CancelScope, bounded by the task's timeout_s
        _receive_loop              the body; a silent coordinator (3 intervals) ends it

Losing the connection cancels that nursery, so the tasks of a lost connection die with it (the
coordinator has already failed them). Close codes 4000 (replaced) and 4001 (bad token) end the
agent with :class:`AgentExit`; 4004 (move) dials the next coordinator at once; any other loss
reconnects to the next one with backoff.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import replace
from typing import Final

import trio
from trio_websocket import (
    ConnectionClosed,
    HandshakeError,
    WebSocketConnection,
    open_websocket_url,
)

from protocol import (
    MAX_FRAME_BYTES,
    Assign,
    Cancel,
    CloseCode,
    Error,
    Heartbeat,
    ProtocolError,
    Welcome,
    decode_node,
)
from protocol.log_lines import bind_log_ids
from protocol.model_servers import Generation
from protocol.telemetry import TelemetrySample
from tools.node_agent.backends import Backend
from tools.node_agent.config import (
    AGENT_VERSION,
    AgentConfig,
    AgentExit,
    backoff_delay,
    final_exit,
)
from tools.node_agent.connection import (
    PROTOCOLS,
    CloseRequest,
    Outbound,
    handshake,
    send_all,
    why,
)
from tools.node_agent.health import BackendHealth
from tools.node_agent.heartbeats import Heartbeats
from tools.node_agent.reconnect import Reconnects
from tools.node_agent.silence import receive_unless_silent
from tools.node_agent.stats import NodeStats
from tools.node_agent.task_run import refusal_of, run_task, short

__all__ = [
    "AGENT_VERSION",
    "AgentConfig",
    "AgentExit",
    "NodeAgent",
    "backoff_delay",
]

log = logging.getLogger("gemmanet.node")

# Silence from the coordinator for this many heartbeat intervals means the link is dead.
MISSED_HEARTBEATS: Final = 3


class NodeAgent:
    """Serves tasks from one coordinator until drained (returns) or refused (AgentExit)."""

    def __init__(
        self,
        config: AgentConfig,
        backend: Backend,
        *,
        rng: random.Random,
        telemetry: Callable[[], TelemetrySample | None] | None = None,
        health_rng: random.Random | None = None,
    ) -> None:
        self.config = config
        self.backend = backend
        # Its own generator: the checks' jitter does not shift the reconnect jitter.
        self.health = BackendHealth(
            backend,
            config.models,
            check_s=config.backend_check_s,
            timeout_s=config.backend_check_timeout_s,
            rng=health_rng or random.Random(config.node_id),
        )
        self._running: dict[str, trio.CancelScope] = {}
        self._idle = trio.Event()
        self._idle.set()
        self._drain_requested = trio.Event()
        self._hurry = False
        self._grace_scope: trio.CancelScope | None = None
        self._attempt_scope: trio.CancelScope | None = None
        self._live = False
        self.beats = Heartbeats(
            backend,
            self.health,
            config.models,
            in_flight=lambda: len(self._running),
            telemetry=telemetry,
        )
        #: where and when to dial next (the coordinators in turn)
        self.dialing = Reconnects(
            config.ws_urls or (config.ws_url,),
            rng,
            initial_s=config.backoff_initial_s,
            max_s=config.backoff_max_s,
        )
        # How the last connection was closed (its close code; None: not by the coordinator).
        self._closed_with: int | None = None
        # The protocol version of the current connection (its welcome's ``v``): a v1
        # coordinator gets results without usage, finish reason or timings.
        self.protocol = 1
        # Observable counters (logs, tests).
        self.attempts = 0
        self.welcomes = 0
        self._stats = NodeStats()

    # --- control ---------------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        return len(self._running)

    @property
    def draining(self) -> bool:
        return self._drain_requested.is_set()

    def request_drain(self) -> None:
        """Stop taking tasks; finish running ones within ``drain_s``; then close and return.

        A second request skips what is left of the grace period.
        """
        if self._drain_requested.is_set():
            self._hurry = True
            if self._grace_scope is not None:
                self._grace_scope.cancel()
            return
        self._drain_requested.set()
        if not self._live and self._attempt_scope is not None:
            # Not serving yet (connecting, handshaking): nothing to finish.
            self._attempt_scope.cancel()

    # --- reconnect loop --------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Connect, serve, reconnect; returns after a drain, raises AgentExit on 4000/4001."""
        # Every line of this agent (and of its tasks) names its node (JSON logs).
        bind_log_ids(node_id=self.config.node_id)
        task_status.started()
        # Before the first hello: it says whether the backend is down (no model placed here).
        await self.health.check_now()
        refused: AgentExit | None = None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.health.watch)
            try:
                await self._reconnect()
            except AgentExit as exc:
                refused = exc
            nursery.cancel_scope.cancel()
        if refused is not None:
            raise refused
        log.info("node %s stopped", self.config.node_id)

    async def _reconnect(self) -> None:
        dialing = self.dialing
        while not self._drain_requested.is_set():
            if len(dialing.urls) > 1:  # with one URL, a subclass may choose it (the load test)
                self.config = replace(self.config, ws_url=dialing.url)
            self._closed_with = None
            welcomed = await self._connect_once()
            if self._drain_requested.is_set():
                break
            delay = dialing.after(welcomed=welcomed, close_code=self._closed_with)
            if delay == 0 and self._closed_with == CloseCode.MOVE:
                log.info("told to move: connecting to %s now", dialing.url)
                continue
            log.info("reconnecting in %.2f s (attempt %d)", delay, dialing.failures)
            with trio.move_on_after(delay):
                await self._drain_requested.wait()

    async def _connect_once(self) -> bool:
        """One connection from dial to close; True when the coordinator welcomed us."""
        welcomed = False
        connection: WebSocketConnection | None = None
        self.attempts += 1
        with trio.CancelScope() as attempt_scope:
            self._attempt_scope = attempt_scope
            try:
                async with open_websocket_url(
                    self.config.ws_url,
                    connect_timeout=self.config.connect_timeout_s,
                    disconnect_timeout=self.config.close_timeout_s,
                    # The coordinator's limit, not the library's default of exactly 1 MiB: the
                    # largest assign the HTTP API lets through must arrive (protocol.codec).
                    max_message_size=MAX_FRAME_BYTES,
                ) as ws:
                    connection = ws
                    welcome = await self._handshake(ws)
                    if welcome is not None:
                        welcomed = True
                        self.welcomes += 1
                        await self._serve(ws, welcome)
            except HandshakeError as exc:
                if connection is None:
                    log.warning("cannot connect to %s: %s", self.config.ws_url, why(exc))
            except Exception:  # a daemon outlives surprises: log, then reconnect with backoff
                log.exception("connection to %s failed unexpectedly", self.config.ws_url)
            finally:
                self._attempt_scope = None
                self._live = False
        if connection is not None:
            self._raise_if_refused(connection)
        return welcomed

    def _raise_if_refused(self, ws: WebSocketConnection) -> None:
        reason = ws.closed
        code = reason.code if reason is not None else None
        self._closed_with = code
        final = final_exit(code, self.config.node_id)
        if final is not None:
            raise final
        if code == CloseCode.MOVE:
            log.info("coordinator going away: %s", reason.reason if reason else "")
        elif reason is not None and code != CloseCode.NORMAL:
            log.warning("connection closed: %s %s", code, reason.reason or "")
        elif reason is not None and not self._drain_requested.is_set():
            log.warning("coordinator closed the connection")

    # --- one connection --------------------------------------------------------------------

    async def _handshake(self, ws: WebSocketConnection) -> Welcome | None:
        self.beats.said_down = self.health.problem
        return await handshake(ws, self.config, backend_down=self.beats.said_down)

    async def _serve(self, ws: WebSocketConnection, welcome: Welcome) -> None:
        # While connected, the lines of this connection and its tasks name the instance.
        bind_log_ids(instance_id=welcome.instance_id)
        try:
            await self._serve_welcomed(ws, welcome)
        finally:
            bind_log_ids(instance_id=None)

    async def _serve_welcomed(self, ws: WebSocketConnection, welcome: Welcome) -> None:
        interval = max(float(welcome.heartbeat_interval_s), 0.01)
        # Both ways: ours to the coordinator and the silence we allow it; it may tell us a
        # longer one later, in a heartbeat (``interval_s``).
        self.beats.interval = interval
        self.protocol = welcome.v if welcome.v in PROTOCOLS else 1
        log.info(
            "connected to %s as node %s (instance %s, conn %s, heartbeat %.1f s)",
            self.config.ws_url,
            self.config.node_id,
            welcome.instance_id,
            welcome.conn_id,
            interval,
        )
        outbox_send, outbox_recv = trio.open_memory_channel[Outbound](
            4 * self.config.max_parallel + 16
        )
        async with trio.open_nursery() as nursery:
            self._live = True
            nursery.start_soon(
                send_all, ws, outbox_recv, nursery.cancel_scope, self.config.close_timeout_s
            )
            nursery.start_soon(self.beats.send_every_interval, outbox_send)
            nursery.start_soon(self.beats.report_health, outbox_send)
            nursery.start_soon(self._drain_watch, outbox_send)
            await self._receive_loop(ws, outbox_send, nursery)
            nursery.cancel_scope.cancel()
        self._live = False

    async def _receive_loop(
        self,
        ws: WebSocketConnection,
        outbox: trio.MemorySendChannel[Outbound],
        nursery: trio.Nursery,
    ) -> None:
        while True:
            interval = self.beats.interval
            silence_s = MISSED_HEARTBEATS * interval
            try:
                # judged on the time this process ran: a stall of ours is not their silence
                raw = await receive_unless_silent(
                    ws.get_message, interval_s=interval, misses=MISSED_HEARTBEATS
                )
            except ConnectionClosed:
                return
            if raw is None:
                log.warning("nothing from the coordinator for %.1f s; reconnecting", silence_s)
                # Only the sender writes to the socket: a close written from here raced a
                # heartbeat being sent, and the sender, seeing the connection closing, cut the
                # close short (the coordinator saw 1006 instead of 1001). The sender closes and
                # then ends the connection; a sender stuck on a dead socket is bounded too.
                with trio.move_on_after(self.config.close_timeout_s):
                    await outbox.send(CloseRequest(CloseCode.GOING_AWAY, "heartbeat timeout"))
                    await trio.sleep_forever()
                return
            try:
                envelope = decode_node(raw)
            except ProtocolError as exc:
                # A frame we cannot read (e.g. a newer peer's message type): skip it rather
                # than drop every task of the connection.
                log.warning("ignoring bad frame from coordinator: %s", short(str(exc)))
                continue
            if isinstance(envelope, Assign):
                await self._on_assign(envelope, outbox, nursery)
            elif isinstance(envelope, Cancel):
                scope = self._running.get(envelope.task_id)
                if scope is not None:
                    log.info(
                        "task %s cancelled by coordinator",
                        envelope.task_id,
                        extra={"task_id": envelope.task_id},
                    )
                    scope.cancel()
            elif isinstance(envelope, Heartbeat):
                asked = envelope.interval_s
                if isinstance(asked, int | float) and asked != self.beats.interval:
                    self.beats.interval = max(float(asked), 0.01)
                    log.info("coordinator asks for a heartbeat every %.1f s", self.beats.interval)
            elif isinstance(envelope, Error):
                log.warning("coordinator reports %s: %s", envelope.code, short(envelope.message))
            else:
                log.debug("ignoring unexpected %s", type(envelope).__name__)

    # --- tasks -----------------------------------------------------------------------------

    async def _on_assign(
        self,
        assign: Assign,
        outbox: trio.MemorySendChannel[Outbound],
        nursery: trio.Nursery,
    ) -> None:
        task_id = assign.task_id
        self._stats.asked(task_id in self._running, len(self._running), _input_of(assign))
        if not self._drain_requested.is_set() and task_id in self._running:
            log.warning("ignoring duplicate assign of running task %s", task_id)
            return
        refusal = refusal_of(
            assign,
            self.config,
            running=len(self._running),
            draining=self._drain_requested.is_set(),
            backend_down=self.health.problem,
        )
        if refusal is not None:
            await outbox.send(Error(task_id=task_id, code=refusal[0], message=short(refusal[1])))
            return
        scope = trio.CancelScope()
        self._running[task_id] = scope
        if self._idle.is_set():
            self._idle = trio.Event()
        nursery.start_soon(self._run_task, assign, scope, outbox, name=f"task {task_id}")

    async def _run_task(
        self,
        assign: Assign,
        scope: trio.CancelScope,
        outbox: trio.MemorySendChannel[Outbound],
    ) -> None:
        bind_log_ids(task_id=assign.task_id)
        try:
            with scope:
                await self._execute(assign, outbox)
        finally:
            self._running.pop(assign.task_id, None)
            if not self._running:
                self._idle.set()

    async def _execute(self, assign: Assign, outbox: trio.MemorySendChannel[Outbound]) -> None:
        await run_task(
            assign, self.backend, self.protocol, outbox.send, failed=self.health.task_failed
        )

    # --- drain -----------------------------------------------------------------------------

    async def _wait_idle(self) -> None:
        while self._running:
            await self._idle.wait()

    async def _drain_watch(self, outbox: trio.MemorySendChannel[Outbound]) -> None:
        await self._drain_requested.wait()
        log.info(
            "draining: %d task(s) running, up to %.1f s to finish",
            len(self._running),
            self.config.drain_s,
        )
        with trio.move_on_after(0 if self._hurry else self.config.drain_s) as grace:
            self._grace_scope = grace
            await self._wait_idle()
        self._grace_scope = None
        if self._running:
            log.warning("drain grace over: cancelling %d task(s)", len(self._running))
            for scope in list(self._running.values()):
                scope.cancel()
            await self._wait_idle()
        await outbox.send(CloseRequest(CloseCode.NORMAL, "node shutting down"))


def _input_of(assign: Assign) -> str:
    """What the node was asked, as text (for the stats file)."""
    return Generation.of(assign).input_text
