"""One task against the backend: its chunks, then its result or its error.

The node agent runs one of these per assign, inside the task's own cancel scope
(``NodeAgent._run_task``). It bounds the task by its ``timeout_s``, stops a model that says
more than a result can carry, turns every failure of the backend into an ``error`` envelope,
and on a protocol v2 connection reports the server's usage and finish reason and the node's
own timings (time to the first output and to the end).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from contextlib import aclosing

import msgspec
import trio

from protocol import (
    MAX_OUTPUT_BYTES,
    Assign,
    Chunk,
    Error,
    Result,
    TaskErrorCode,
    Timings,
    stamped,
    text_bytes,
)
from protocol.model_servers import Finish, Generation
from tools.node_agent.backends import Backend, BackendError, BackendUnreachable
from tools.node_agent.config import AgentConfig

__all__ = ["refusal_of", "run_task", "short"]

log = logging.getLogger("gemmanet.node")

_MAX_MESSAGE_CHARS = 200
#: the most a timing may say (Timings' range): a day
_MAX_TIMING_S = 86_400.0

Send = Callable[[Error | Chunk | Result], Awaitable[None]]


def short(text: str) -> str:
    """One line of at most 200 characters, for an error message a peer reads."""
    text = " ".join(str(text).split())
    return text if len(text) <= _MAX_MESSAGE_CHARS else text[: _MAX_MESSAGE_CHARS - 1] + "…"


def refusal_of(
    assign: Assign,
    config: AgentConfig,
    *,
    running: int,
    draining: bool,
    backend_down: str | None = None,
) -> tuple[str, str] | None:
    """Why the node turns ``assign`` down (an error code and a message), or None to run it.
    ``backend_down``: why its backend cannot serve now (health.py)."""
    node = config.node_id
    if draining:
        return TaskErrorCode.NODE_DRAINING, f"node {node} is shutting down"
    if assign.model not in config.models:
        return TaskErrorCode.MODEL_NOT_SERVED, f"node {node} does not serve model {assign.model!r}"
    if backend_down is not None:
        return TaskErrorCode.BACKEND_UNAVAILABLE, (
            f"node {node} cannot reach its model backend: {backend_down}"
        )
    if running >= config.max_parallel:
        return TaskErrorCode.NODE_BUSY, (
            f"node {node} already runs {running} task(s) (max_parallel {config.max_parallel})"
        )
    return None


async def _fail(send: Send, task_id: str, code: str, message: str) -> None:
    log.warning("task %s failed: %s", task_id, message)
    await send(Error(task_id=task_id, code=code, message=short(message)))


async def run_task(
    assign: Assign,
    backend: Backend,
    protocol: int,
    send: Send,
    *,
    failed: Callable[[Exception | None], None] | None = None,
) -> None:
    """Run ``assign`` on ``backend``; every envelope it produces goes to ``send``. ``failed``
    is told when the backend failed it, and how (None: it timed out; the agent then checks the
    backend at once, health.py)."""
    task_id = assign.task_id
    parts: list[str] = []
    size = 0
    finish = Finish()
    began = trio.current_time()
    first_at: float | None = None
    try:
        with trio.fail_after(max(float(assign.timeout_s), 0.0)):
            generator = backend.generate(Generation.of(assign))
            async with aclosing(generator) as deltas:  # type: ignore[type-var]
                async for delta in deltas:
                    if isinstance(delta, Finish):
                        finish = delta
                        continue
                    if not delta:
                        continue
                    if first_at is None:
                        first_at = trio.current_time()
                    size += text_bytes(delta)
                    if size > MAX_OUTPUT_BYTES:
                        # Sent anyway, the coordinator would close this connection over the
                        # oversized result, failing every other task here.
                        message = (
                            f"output exceeds {MAX_OUTPUT_BYTES:,} bytes, the most a result"
                            " can carry"
                        )
                        await _fail(send, task_id, TaskErrorCode.OUTPUT_TOO_LARGE, message)
                        return
                    if assign.stream:
                        await send(Chunk(task_id=task_id, seq=len(parts), delta=delta))
                    parts.append(delta)
    except trio.TooSlowError:
        if failed is not None:
            failed(None)
        message = f"backend did not finish within {assign.timeout_s:g} s"
        await _fail(send, task_id, TaskErrorCode.BACKEND_TIMEOUT, message)
        return
    except BackendError as exc:
        if failed is not None:
            failed(exc)
        # Not even a connection: the task never reached the model server, nor produced
        # anything, so the coordinator may place it on another node (503 if none).
        never_ran = isinstance(exc, BackendUnreachable) and not parts
        code = TaskErrorCode.BACKEND_UNAVAILABLE if never_ran else TaskErrorCode.BACKEND_ERROR
        await _fail(send, task_id, code, str(exc))
        return
    except Exception as exc:  # a backend bug must not take the node down
        log.exception("task %s: backend crashed", task_id)
        await send(
            Error(
                task_id=task_id,
                code=TaskErrorCode.BACKEND_ERROR,
                message=short(f"{type(exc).__name__}: {exc}"),
            )
        )
        return
    chunks = len(parts) if assign.stream else 0
    result = Result(task_id=task_id, output="".join(parts), chunks=chunks)
    if protocol >= 2:
        ended = trio.current_time()
        ttft = None if first_at is None else min(first_at - began, _MAX_TIMING_S)
        result = stamped(
            msgspec.structs.replace(
                result,
                usage=finish.usage if finish.usage is not None else msgspec.UNSET,
                finish_reason=finish.finish_reason or msgspec.UNSET,
                timings=Timings(total_s=min(ended - began, _MAX_TIMING_S), ttft_s=ttft),
            )
        )
    await send(result)
