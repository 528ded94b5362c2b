"""The event trace of one run: every observable step, with its virtual time.

The digest covers the canonical JSON of every event in order, so two runs agree on it only if
they did exactly the same things at exactly the same virtual times. Nothing in an event may
depend on hash order, wall time or ambient randomness."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

Event = dict[str, Any]

TRACE_FORMAT = "gemmanet-sim-trace/1"


def _canonical(event: Event) -> str:
    return json.dumps(event, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


class Trace:
    def __init__(self, clock: Callable[[], float], *, keep_events: bool = True) -> None:
        self._clock = clock
        self._hash = hashlib.sha256()
        self._keep = keep_events
        self.events: list[Event] = []
        self.count = 0
        self.listeners: list[Callable[[Event], None]] = []

    def emit(self, kind: str, /, **fields: Any) -> Event:
        event: Event = {"t": round(self._clock(), 6), "kind": kind, **fields}
        self._hash.update(_canonical(event).encode())
        self._hash.update(b"\n")
        self.count += 1
        if self._keep:
            self.events.append(event)
        for listener in self.listeners:
            listener(event)
        return event

    @property
    def digest(self) -> str:
        return self._hash.hexdigest()


def write_trace(path: Path, header: dict[str, Any], events: list[Event]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="ascii") as out:
        out.write(_canonical({"format": TRACE_FORMAT, **header}) + "\n")
        for event in events:
            out.write(_canonical(event) + "\n")


def read_trace_header(path: Path) -> dict[str, Any]:
    with path.open(encoding="ascii") as handle:
        header: dict[str, Any] = json.loads(handle.readline())
    if header.get("format") != TRACE_FORMAT:
        raise ValueError(f"{path} is not a {TRACE_FORMAT} file")
    return header
