"""Presence registries of the memory backend, on the time the caller passes (the backend's
injected clock). The same semantics as the Redis script in ``redis_scripts.PRESENCE``."""

from __future__ import annotations

from dataclasses import dataclass, field

from coordinator.coordination.base import PresenceEntry, PresenceView

__all__ = ["PresenceRegistries"]


@dataclass(slots=True)
class _Registry:
    beats: dict[str, tuple[float, bytes]] = field(default_factory=dict)
    pulse: float | None = None  # time of the last presence call
    stalls: list[tuple[float, float]] = field(default_factory=list)


class PresenceRegistries:
    def __init__(self) -> None:
        self._registries: dict[str, _Registry] = {}

    def _touch(self, name: str, now: float, stall_after_s: float) -> _Registry:
        registry = self._registries.setdefault(name, _Registry())
        if registry.pulse is not None and now - registry.pulse > stall_after_s:
            registry.stalls.append((registry.pulse, now))
        registry.pulse = now
        return registry

    @staticmethod
    def _view(registry: _Registry, now: float, **extra: object) -> PresenceView:
        entries = tuple(
            PresenceEntry(member=m, last_beat=b, data=d)
            for m, (b, d) in sorted(registry.beats.items())
        )
        return PresenceView(now=now, entries=entries, **extra)  # type: ignore[arg-type]

    def beat(
        self,
        name: str,
        member: str,
        data: bytes,
        *,
        now: float,
        stall_after_s: float,
        forget_after_s: float,
    ) -> PresenceView:
        registry = self._touch(name, now, stall_after_s)
        horizon = now - forget_after_s
        registry.stalls = [s for s in registry.stalls if s[1] >= horizon]
        before = registry.beats.get(member)
        previous = before[0] if before is not None and before[0] >= horizon else None
        registry.beats[member] = (now, bytes(data))
        for other, (beat, _) in list(registry.beats.items()):
            if beat < horizon:
                del registry.beats[other]
        stalls = tuple(s for s in registry.stalls if previous is not None and s[1] > previous)
        return self._view(registry, now, previous_beat=previous, stalls=stalls)

    def read(self, name: str, *, now: float, stall_after_s: float) -> PresenceView:
        return self._view(self._touch(name, now, stall_after_s), now)

    def alive(self, name: str, member: str, window_s: float, now: float) -> bool:
        """Whether ``member`` beat in registry ``name`` within the last ``window_s``."""
        registry = self._registries.get(name)
        beat = registry.beats.get(member) if registry is not None else None
        return beat is not None and now - beat[0] <= window_s

    def leave(self, name: str, member: str) -> None:
        registry = self._registries.get(name)
        if registry is not None:
            registry.beats.pop(member, None)

    def size(self) -> int:
        return sum(len(r.beats) + len(r.stalls) for r in self._registries.values())
