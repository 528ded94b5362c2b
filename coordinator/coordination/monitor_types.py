"""The elected residency monitor's shared state: types and semantics (key names: ``keys.py``).

Election: one lease (``monitor:lease``, value ``"<candidate>|<epoch>"``, TTL = the election
TTL). Acquiring a free or expired lease INCRs ``monitor:epoch`` (persistent: never expires,
never goes backwards, survives the lease key being deleted) and the new value is the holder's
*fencing token*. Only the holder, naming its epoch, can renew or resign.

Fenced fact writes: a write names the writer and its epoch and is accepted only when that epoch
is the current ``monitor:epoch`` *and* the lease is still ``"<writer>|<epoch>"``, both checked
in the same atomic step as the write (a Lua script on Redis). A rejected write changes nothing
readable and counts one in ``monitor:fenced_rejects``; an accepted one counts in
``monitor:accepted:<epoch>`` (how ``gemmanet prove-takeover`` sees, on the store's side, whether
a deposed owner's write got through). ``unfenced`` skips the compare: a test-only switch that
exists to show the takeover gate can fail.

Facts are stamped with the store's clock at the write (Redis: server TIME); ``host_facts``
reports each host's record with that stamp and its age on the same clock, so readers on other
machines never compare clocks.

The placement switch (``hosts:placement``, no expiry): whether instances with the default
``GEMMANET_HOST_PLACEMENT=gated`` may place on direct hosts (``core/hosts/gate.py``), who set it
and when, as ``gemmanet audit --enable`` / ``--disable`` wrote it. A value that does not decode
as a switch reads as none (off: fail closed).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ACCEPTED_TTL_S",
    "HostFacts",
    "MonitorClaim",
    "MonitorStatus",
    "PlacementSwitch",
    "decode_facts",
    "lease_value",
    "parse_lease",
]

#: accepted writes per epoch live this long (diagnostics for prove-takeover, not state)
ACCEPTED_TTL_S = 3600.0


def lease_value(candidate: str, epoch: int) -> bytes:
    return f"{candidate}|{epoch}".encode()


def parse_lease(raw: bytes | None) -> tuple[str | None, int | None]:
    if not raw:
        return None, None
    holder, _, epoch = raw.decode().rpartition("|")
    return holder, int(epoch)


@dataclass(frozen=True, slots=True)
class MonitorClaim:
    """The answer to an acquire: whether ``candidate`` now holds the lease, and the lease as
    it is (``epoch`` is the fencing token when ``held``)."""

    held: bool
    holder: str | None
    epoch: int | None


@dataclass(frozen=True, slots=True)
class MonitorStatus:
    """The election as one atomic read saw it."""

    holder: str | None
    #: the epoch in the lease (None: no lease)
    lease_epoch: int | None
    #: ``monitor:epoch``: the newest token ever handed out (0: none yet)
    epoch: int
    fenced_rejects: int


@dataclass(frozen=True, slots=True)
class HostFacts:
    """What the monitor last wrote about one direct host (placement reads this)."""

    host_id: str
    #: the JSON record: host_id, kind, reachable, resident {model: GB}, models [...], epoch
    record: dict[str, Any]
    #: store time of the write, seconds (Redis: server TIME)
    polled_at: float
    #: seconds since the write on the store's clock: compare with GEMMANET_RESIDENCY_STALE_S
    age_s: float

    @property
    def reachable(self) -> bool:
        return bool(self.record.get("reachable"))

    @property
    def epoch(self) -> int:
        return int(self.record.get("epoch", 0))

    @property
    def resident(self) -> dict[str, float]:
        return dict(self.record.get("resident") or {})

    def fresh(self, stale_s: float) -> bool:
        return self.age_s <= stale_s


def decode_facts(host_id: str, raw: bytes, polled_at: float, now: float) -> HostFacts:
    record = json.loads(raw)
    record["polled_at"] = polled_at
    return HostFacts(host_id, record, polled_at, max(0.0, now - polled_at))


@dataclass(frozen=True, slots=True)
class PlacementSwitch:
    """The shared switch of placement on direct hosts, as last set."""

    enabled: bool
    #: who switched it (``gemmanet audit --by``, default user@host)
    by: str
    #: when, in Unix seconds on the clock of the machine that switched it
    at: float
    #: the monitor epoch the audit judged green (an enable), else None
    epoch: int | None = None

    def encode(self) -> bytes:
        return json.dumps(
            {"enabled": self.enabled, "by": self.by, "at": self.at, "epoch": self.epoch},
            sort_keys=True,
        ).encode()

    @classmethod
    def decode(cls, raw: bytes | None) -> PlacementSwitch | None:
        """The switch stored as ``raw``; None when absent or not a switch (read as off)."""
        if raw is None:
            return None
        try:
            value = json.loads(raw)
            enabled, by, at, epoch = value["enabled"], value["by"], value["at"], value["epoch"]
        except (ValueError, TypeError, KeyError):
            return None
        if not (
            isinstance(enabled, bool)
            and isinstance(by, str)
            and isinstance(at, int | float)
            and not isinstance(at, bool)
            and (epoch is None or (isinstance(epoch, int) and not isinstance(epoch, bool)))
        ):
            return None
        return cls(enabled, by, float(at), epoch)

    def to_json(self) -> dict[str, Any]:
        return {"enabled": self.enabled, "by": self.by, "at": self.at, "epoch": self.epoch}
