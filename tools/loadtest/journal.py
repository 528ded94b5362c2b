"""Reading the node helpers' journals (see ``tools.loadtest.nodes``), incrementally."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Assignment:
    node_id: str
    #: index of the instance the node was connected to when it started the task
    instance: int
    started: float


@dataclass
class JournalReader:
    paths: list[Path]
    assigned: dict[str, Assignment] = field(default_factory=dict)
    delays: dict[str, float] = field(default_factory=dict)
    #: (node_id, instance index, monotonic time) of every welcome
    connects: list[tuple[str, int, float]] = field(default_factory=list)
    #: tags a node started more than once (should not happen: one assign per task)
    duplicates: int = 0
    _offsets: dict[Path, int] = field(default_factory=dict)

    def poll(self) -> None:
        """Read whatever complete lines were appended since the last call."""
        for path in self.paths:
            try:
                with path.open("rb") as stream:
                    stream.seek(self._offsets.get(path, 0))
                    data = stream.read()
            except FileNotFoundError:
                continue
            end = data.rfind(b"\n")
            if end < 0:
                continue
            self._offsets[path] = self._offsets.get(path, 0) + end + 1
            for line in data[: end + 1].decode("utf-8", "replace").splitlines():
                self._parse(line)

    def _parse(self, line: str) -> None:
        parts = line.split("\t")
        try:
            if parts[0] == "A" and len(parts) == 5:
                if parts[1] in self.assigned:
                    self.duplicates += 1
                    return
                self.assigned[parts[1]] = Assignment(parts[2], int(parts[3]), float(parts[4]))
            elif parts[0] == "D" and len(parts) == 3:
                self.delays.setdefault(parts[1], float(parts[2]))
            elif parts[0] == "C" and len(parts) == 4:
                self.connects.append((parts[1], int(parts[2]), float(parts[3])))
        except ValueError:
            pass
