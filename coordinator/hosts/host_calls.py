"""The calls a requesting instance makes to direct model hosts, one cancellable trio task each.

The cluster machine decides (``CallHost`` when a task is placed on a host, ``StopHostCall``
when nobody waits for it any more: answered, client gone, timed out); this runs the call and
reports what the host answered the way an owner instance reports a node's answers: numbered
``BusChunk`` envelopes while the task streams, then one ``BusResult`` (the joined output with the
usage and finish reason the host reported and the call's timings, or a ``backend_error``
failure). So the requester's tracker checks them like any node's answers, and SSE and OpenAI
streaming work unchanged. The host is asked in its own API (``protocol/model_servers/``, over
``host_client``): the conversation, the raw prompt and the options as the task carries them.

A call that the machine stops is cancelled, which drops its HTTP connection (the host stops
generating). A call never outlives its task's deadline by more than ``OVERRUN_GRACE_S``, even
if a stop were lost: the task itself ends with 504 at its deadline (the requester's tick).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Callable, Mapping
from contextlib import AsyncExitStack, aclosing
from typing import TYPE_CHECKING

import msgspec
import trio

from coordinator.capacity import HostSpec
from coordinator.core.effects import CallHost
from coordinator.core.hosts.direct_hosts import host_conn_id
from coordinator.core.tracker import MAX_STREAMED_CHARS
from protocol import BusChunk, BusResult, TaskErrorCode, TaskFailure, Timings, stamped
from protocol.model_servers import Finish, Generation, HostError, ollama_call, openai_call

if TYPE_CHECKING:
    import httpx

__all__ = ["HostCalls"]

log = logging.getLogger("gemmanet.hosts")

OVERRUN_GRACE_S = 5.0
#: how long connecting to a host may take (then the call fails: 502)
CONNECT_TIMEOUT_S = 5.0
#: the longest a timing may say (what the bus decoder accepts)
MAX_TIMING_S = 86_400.0

Answer = BusChunk | BusResult


class HostCalls:
    def __init__(
        self,
        hosts: Mapping[str, HostSpec],
        on_answer: Callable[[Answer], None],
        *,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._hosts = dict(hosts)
        self._on_answer = on_answer
        self._transport = transport
        self._client: httpx.AsyncClient | None = None
        self._nursery: trio.Nursery | None = None
        self._scopes: dict[str, trio.CancelScope] = {}

    def __len__(self) -> int:
        return len(self._scopes)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with AsyncExitStack() as stack:
            # No direct host, no client: building one loads the TLS trust store (~60 ms a
            # time, which the simulator pays at every instance start), and importing httpx
            # (~0.15 s with the command line it brings) waits for the first instance with hosts.
            if self._hosts:
                import httpx

                # No read timeout: the task's deadline bounds a call (a model may think a long
                # time before its first token).
                timeout = httpx.Timeout(None, connect=CONNECT_TIMEOUT_S)
                self._client = await stack.enter_async_context(
                    httpx.AsyncClient(timeout=timeout, transport=self._transport)
                )
            try:
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    task_status.started()
                    await trio.sleep_forever()
            finally:
                self._nursery = self._client = None

    def start(self, effect: CallHost) -> None:
        task_id = effect.envelope.task_id
        if self._nursery is None:  # shutting down: the task ends with its instance
            return
        # Registered before the task runs: a stop that comes first still finds it.
        scope = trio.CancelScope(deadline=effect.deadline + OVERRUN_GRACE_S)
        self._scopes[task_id] = scope
        self._nursery.start_soon(self._call, effect, scope)

    def stop(self, task_id: str) -> None:
        scope = self._scopes.pop(task_id, None)
        if scope is not None:
            scope.cancel()

    async def _call(self, effect: CallHost, scope: trio.CancelScope) -> None:
        try:
            with scope:
                self._on_answer(stamped(await self._answer(effect)))
        finally:
            self._scopes.pop(effect.envelope.task_id, None)

    async def _answer(self, effect: CallHost) -> BusResult:
        """Runs the call, reporting its chunks as they come; the result to report at the end."""
        envelope = effect.envelope
        task_id, conn_id = envelope.task_id, host_conn_id(effect.host_id)
        pieces: list[str] = []
        chars = 0
        finish = Finish()
        began = trio.current_time()
        first_at: float | None = None

        def failed(code: TaskErrorCode, message: str) -> BusResult:
            return BusResult(
                task_id=task_id,
                node_id=effect.host_id,
                conn_id=conn_id,
                chunks=len(pieces) if envelope.stream else 0,
                failure=TaskFailure(code=code, message=message),
            )

        try:
            async with aclosing(self._generate(effect)) as deltas:
                async for piece in deltas:
                    if isinstance(piece, Finish):
                        finish = piece
                        continue
                    if first_at is None and piece:
                        first_at = trio.current_time()
                    chars += len(piece)
                    if chars > MAX_STREAMED_CHARS:
                        return failed(
                            TaskErrorCode.OUTPUT_TOO_LARGE,
                            f"the output grew past {MAX_STREAMED_CHARS:,} characters",
                        )
                    if envelope.stream:
                        self._on_answer(
                            BusChunk(task_id=task_id, conn_id=conn_id, seq=len(pieces), delta=piece)
                        )
                    pieces.append(piece)
        except HostError as exc:
            log.warning("task %s: direct host %s failed: %s", task_id, effect.host_id, exc)
            return failed(TaskErrorCode.BACKEND_ERROR, f"direct host {effect.host_id}: {exc}")
        # Measured as a node agent measures them (from the call to the first output and to
        # the end), so a client sees the same numbers from a node and from a direct host.
        ended = trio.current_time()
        return BusResult(
            task_id=task_id,
            node_id=effect.host_id,
            conn_id=conn_id,
            output="".join(pieces),
            chunks=len(pieces) if envelope.stream else 0,
            usage=finish.usage if finish.usage is not None else msgspec.UNSET,
            finish_reason=finish.finish_reason or msgspec.UNSET,
            timings=Timings(
                total_s=_seconds(ended - began),
                ttft_s=None if first_at is None else _seconds(first_at - began),
            ),
        )

    def _generate(self, effect: CallHost) -> AsyncGenerator[str | Finish, None]:
        from coordinator.hosts.host_client import stream_call  # httpx's side, loaded by run()

        assert self._client is not None
        spec = self._hosts[effect.host_id]
        call = ollama_call if spec.kind == "ollama" else openai_call
        call_ = call(Generation.of(effect.envelope))
        return stream_call(self._client, spec.url, call_, spec.auth_headers())


def _seconds(elapsed: float) -> float:
    return min(elapsed, MAX_TIMING_S)
