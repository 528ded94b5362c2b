"""The garbage collector of a coordinator process, tuned for thousands of connections.

CPython's cyclic collector scans every tracked object of the generations it collects. A
coordinator holding thousands of node WebSockets holds about a million objects (each connection
brings its trio tasks, coroutine frames, cancel scopes, wsproto and h11 state: some 300), and
with the default thresholds (700, 10, 10) a full collection came every few seconds during a
connect storm and about every 15 s idle, each stopping the event loop for 1-1.5 s (measured at
10,000 nodes over three instances: 14 s of full collections in the first 50 s of one instance).
Those stops were the loop stalls of connect storms (peers then judged the instance dead for a
moment), most of the 1.5 s request p99, and about half of the idle CPU.

* ``tune`` (when the server starts) raises the thresholds: a young collection after 20,000
  allocations instead of 700 (short-lived objects are gone by then; a collection takes tens of
  milliseconds), a middle one after 5 young ones (at most ~100,000 objects to scan), a full one
  only after 100 middle ones and, CPython's own rule, once the long-lived objects grew by a
  quarter since the last. It times every collection for ``pauses``
  (``gemmanet_gc_pause_seconds``).
* ``freeze_startup`` (once the instance runs) collects once and freezes what start-up built
  (modules, the application, the instance): never garbage, never scanned again.

Reference cycles are still collected, later; memory stays flat (``gemmanet loadtest`` checks
RSS growth over its steady phase).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any

__all__ = ["THRESHOLDS", "freeze_startup", "pauses", "tune"]

THRESHOLDS = (20_000, 5, 100)

#: told every collection's generation and duration in seconds, once ``tune`` has run
pauses: list[Callable[[int, float], None]] = []

_started = 0.0


def _observe(phase: str, info: dict[str, Any]) -> None:
    global _started
    if phase == "start":
        _started = time.perf_counter()
        return
    took = time.perf_counter() - _started
    for listener in pauses:
        listener(int(info["generation"]), took)


def tune() -> None:
    """Raise the thresholds and time every collection. Idempotent."""
    gc.set_threshold(*THRESHOLDS)
    if _observe not in gc.callbacks:
        gc.callbacks.append(_observe)


def freeze_startup() -> None:
    """Collect once, then keep everything alive now out of every later collection's scan."""
    gc.collect()
    gc.freeze()
