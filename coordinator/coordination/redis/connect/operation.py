"""What the link's guard knows of an operation in flight: the connection it waits on, so a
timeout can drop exactly that one. Apart from ``link.py`` so that the lean lane
(``redis/lean/lane.py``), which the link holds, can name it too."""

from __future__ import annotations

from typing import Protocol

__all__ = ["Droppable", "Operation"]


class Droppable(Protocol):
    """A connection the guard can drop: a coredis one or a lean one (``redis/lean/``)."""

    def invalidate(self, reason: str) -> None: ...


class Operation:
    """The connection an operation is waiting on, so a timeout can drop exactly that one."""

    __slots__ = ("waiting_on",)

    def __init__(self) -> None:
        self.waiting_on: Droppable | None = None
