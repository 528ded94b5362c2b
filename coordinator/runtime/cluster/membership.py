"""Membership: the I/O of one instance's presence in a shared coordination backend.

``Membership`` owns everything about "who is in the cluster and who is dead":

* it beats into the presence registry (``keys.PRESENCE``) every ``beat_s`` (and at once
  after ``snapshot_changed``), publishing the instance's snapshot with the beat: one atomic
  call, stamped with the backend's clock, on a connection of its own (Redis);
* it keeps the last snapshots of the peers that beat recently (``peers``), judged by the same
  stall-aware rule as deaths, so a paused Redis does not empty the placement view;
* it answers ``dead_among`` for the requester and owner sweeps: an inbox with no listener is
  dead at once; a peer that stopped beating is dead once its silence exceeds the TTL counted
  over responsive time only (``coordinator/core/liveness.py``);
* it notices when its *own* presence lapsed while Redis served the others (our process froze
  or lost Redis alone): peers may have declared us dead, so ``on_presence_lapsed`` runs and
  ``liveness_lost`` counts it. A Redis pause is not such a lapse.

The decisions are the pure ``LivenessJudge`` and ``presence_lapsed``; this class only reads,
measures round trips with the injected clock, and feeds them.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import trio

from coordinator.coordination import (
    CoordinationUnavailable,
    KeyValue,
    Presence,
    PresenceView,
    keys,
)
from coordinator.coordination.bus.base import Bus
from coordinator.core import registry
from coordinator.core.liveness import LivenessJudge, presence_lapsed
from coordinator.core.registry import InstanceSnapshot
from coordinator.errors import StartupRefused
from coordinator.settings import Settings

__all__ = ["FORGET_AFTER_S", "MemberLiveness", "Membership"]

log = logging.getLogger("gemmanet.membership")

#: A member silent this long is removed from the registry (a dead peer's snapshot must not
#: linger; far longer than any stall we ride out, so a paused Redis forgets nobody).
FORGET_AFTER_S = 60.0
#: a graceful stop's removal from the registry, a beat in flight included (app.py bounds the
#: whole of leaving at 3 s)
LEAVE_WITHIN_S = 2.5
#: how long a change waits for more before it is published (far below the beat)
COALESCE_S = 0.05


@dataclass(frozen=True, slots=True)
class MemberLiveness:
    """One instance of the shared registry as this instance's last beat saw it (for operators:
    the System Health page). ``live``: placement uses it; ``stale``: silent past the TTL by the
    beat's reading, not yet judged; ``dead``: judged dead (or unreachable) and forgotten, listed
    until the registry drops it (``FORGET_AFTER_S``)."""

    instance_id: str
    state: Literal["live", "stale", "dead"]
    #: seconds since its last beat, on the backend's clock (0 for this instance's own)
    last_beat_age_s: float
    #: from its last snapshot; None when that is not trusted (stale or dead)
    nodes: int | None
    in_flight: int | None


class Membership:
    """Presence of this instance and the liveness of its peers (see the module docstring)."""

    def __init__(
        self,
        key_value: KeyValue,
        presence: Presence,
        bus: Bus,
        settings: Settings,
        *,
        snapshot: Callable[[], InstanceSnapshot],
        clock: Callable[[], float],
        loads: Callable[[], registry.BeatLoads] | None = None,
    ) -> None:
        #: the members' snapshots (plain keys) and the presence registry
        self.key_value = key_value
        self.presence = presence
        self.bus = bus
        self.settings = settings
        self.me = settings.instance_id
        self.timing = settings.liveness_timing()
        self._snapshot = snapshot
        self._clock = clock
        # roster version, busy connections and requests of this instance: given, the stored
        # snapshot is rewritten only when the roster moves and each beat carries the load (a
        # busy cluster then builds, writes and fetches no node list per beat); None:
        # rewritten on every change
        self._loads = loads
        # Deaths are judged on the sweep's own reads (that is what the bound is computed on);
        # the beat's reads, with the same rule, only decide whom placement may use.
        self._judge = LivenessJudge(self.timing)
        self._beat_view = LivenessJudge(self.timing)
        self._peers: dict[str, InstanceSnapshot] = {}
        # Each peer's last snapshot with its digest: while the digest in the registry does not
        # move (no node came or went; or, from a writer that does not beat its loads, none
        # changed its load), the snapshot is neither fetched nor
        # decoded again nor turned into new placement views (idle cost follows changes).
        self._known: dict[str, tuple[str, InstanceSnapshot]] = {}
        # The digest of our snapshot as last written under its key, and when (our clock)
        self._written: tuple[str, float] | None = None
        # our last snapshot, its bytes and their digest (``_encoded``), and the roster version
        # they were made at (with ``loads``)
        self._last_encoded: tuple[InstanceSnapshot, bytes, str] | None = None
        self._encoded_roster = -1
        #: each live peer's load as its last beat told it (peers that carry ``loads``)
        self.peer_loads: dict[str, registry.PeerLoad] = {}
        #: told ``peer_loads`` after every beat that read them
        self.on_peer_loads: Callable[[dict[str, registry.PeerLoad]], None] | None = None
        # Peers forgotten (judged dead, or an assign reached nobody) -> their last beat then:
        # they stay out of ``peers`` until they beat again, so the next beat's read does not
        # bring a killed peer back into the placement view and the API's lists for its TTL.
        self._forgotten: dict[str, float] = {}
        self._last_beats: dict[str, float] = {}
        # Backend time of the last beat's read: ages in ``members`` are counted from it.
        self._last_read_at: float | None = None
        self._dirty = trio.Event()
        # A graceful stop: no beat may write our entry again once ``leave`` removed it (a beat
        # in flight during the removal did, on a loaded machine, and the restarted instance
        # then counted its predecessor as a peer).
        self._leaving = False
        self._beat_lock = trio.Lock()
        #: each member's life (``InstanceSnapshot.incarnation``) as the judge's last read saw it
        self.incarnations: dict[str, str] = {}
        #: called (awaited) when our presence lapsed long enough that peers may have declared
        #: us dead: drop what we forward for them, re-check ownership of our nodes
        self.on_presence_lapsed: Callable[[], Awaitable[None]] | None = None
        #: called when a beat finds our registry entry gone (the store lost its data)
        self.on_forgotten: Callable[[], None] | None = None
        #: how often our own presence lapsed (see ``on_presence_lapsed``)
        self.liveness_lost = 0
        #: bumped whenever ``peers`` may have changed (callers cache views on it)
        self.version = 0
        #: told the live peers' snapshots after every beat (the placement view)
        self.on_peers: Callable[[list[InstanceSnapshot]], None] | None = None

    # -- lifecycle --------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Announce ourselves (``StartupRefused`` if Redis cannot take it), then beat."""
        try:
            await self._beat(first=True)
        except CoordinationUnavailable as exc:
            raise StartupRefused(f"cannot register this instance in Redis: {exc}") from None
        task_status.started()
        while True:
            with trio.move_on_after(self.timing.beat_s):
                await self._dirty.wait()
                # A burst of changes (hundreds of nodes connecting) makes one write of the
                # snapshot, not one each: it costs O(nodes) to write and to fetch.
                await trio.sleep(COALESCE_S)
            self._dirty = trio.Event()
            try:
                await self._beat()
            except CoordinationUnavailable as exc:
                log.warning("presence beat failed: %s", exc)

    def snapshot_changed(self) -> None:
        """A node came or went: publish the snapshot now, not at the next beat."""
        self._dirty.set()

    async def leave(self) -> None:
        """Leave politely: peers stop placing here at once (a closed inbox tells the sweeps)."""
        self._leaving = True
        # Shielded from the cancellation that stops us, but bounded, inside app.py's bound on
        # leaving: a beat in flight finishes first (up to one store timeout), then the entry goes.
        with trio.CancelScope(shield=True), trio.move_on_after(LEAVE_WITHIN_S):
            async with self._beat_lock:
                try:
                    await self.presence.presence_leave(keys.PRESENCE, self.me)
                except CoordinationUnavailable:
                    pass

    # -- presence ---------------------------------------------------------------------------

    async def _beat(self, *, first: bool = False) -> None:
        busy: Mapping[str, int] | None = None
        in_flight: int | None = None
        if self._loads is None:
            snapshot = self._snapshot()
            encoded, digest = self._encoded(snapshot)
        else:
            loads = self._loads()
            busy, in_flight = loads.busy, loads.in_flight
            if loads.roster != self._encoded_roster or self._last_encoded is None:
                self._encoded_roster = loads.roster  # the roster moved: encode a new snapshot
                snapshot = self._snapshot()
                self._last_encoded = None
                encoded, digest = self._encoded(snapshot)
            else:
                # The node list as stored: only loads moved, and they travel in the beat. A
                # fresh snapshot here cost a pass over every node each beat under requests
                # (20-40 ms of the loop at 3,334 nodes: the request p99 at 10,000 nodes).
                snapshot, encoded, digest = self._last_encoded
        await self._publish_snapshot(encoded, digest)
        async with self._beat_lock:
            if self._leaving:
                return
            sent = self._clock()
            view = await self.presence.presence_beat(
                keys.PRESENCE,
                self.me,
                registry.encode_presence(snapshot, digest, busy, in_flight),
                stall_after_s=self.timing.stall_gap_s,
                forget_after_s=FORGET_AFTER_S,
            )
        self._absorb(view, self._clock() - sent)
        if view.previous_beat is None and not first:
            # The store no longer had our entry: it restarted empty (or forgot us). What we
            # keep there besides the beat (node facts, our snapshot) has to be written again.
            self._written = None
            self._dirty.set()
            if self.on_forgotten is not None:
                self.on_forgotten()
        lapsed = presence_lapsed(
            previous_beat=view.previous_beat,
            now=view.now,
            stalls=view.stalls,
            alive_ttl_s=self.timing.alive_ttl_s,
        )
        if lapsed and not first:
            self.liveness_lost += 1
            log.warning(
                "instance %s was silent in the registry for %.1f s while Redis served the others; "
                "peers may have declared it dead",
                self.me,
                view.now - (view.previous_beat or view.now),
            )
            if self.on_presence_lapsed is not None:
                await self.on_presence_lapsed()
        try:
            await self._refresh_peers(view)
        except CoordinationUnavailable as exc:
            # The beat itself went through: only the placement view stays a beat older.
            log.warning("could not fetch the peers' snapshots: %s", exc)

    def _encoded(self, snapshot: InstanceSnapshot) -> tuple[bytes, str]:
        """The snapshot's bytes and digest, made again only when it changed: an idle beat's
        snapshot is the previous one itself, or holds its very entries (``Owner.snapshot``),
        and comparing them by identity costs far less than encoding and hashing thousands of
        them twice a second."""
        last = self._last_encoded
        if last is not None and (last[0] is snapshot or _same_entries(last[0], snapshot)):
            return last[1], last[2]
        encoded = registry.encode_snapshot(snapshot)
        digest = registry.snapshot_digest(encoded)
        self._last_encoded = (snapshot, encoded, digest)
        return encoded, digest

    async def _publish_snapshot(self, encoded: bytes, digest: str) -> None:
        """Write our full snapshot under its own key when it changed (or its TTL needs it): a
        beat carries only its digest. Best effort: the beat goes on without it (peers then keep
        fetching until the key and the digest agree)."""
        now = self._clock()
        written = self._written
        if written and written[0] == digest and now - written[1] < registry.SNAPSHOT_REWRITE_S:
            return
        try:
            await self.key_value.set(keys.snapshot_key(self.me), encoded, ttl_s=FORGET_AFTER_S)
        except CoordinationUnavailable as exc:
            log.warning("could not publish this instance's snapshot: %s", exc)
            return
        self._written = (digest, now)

    def _absorb(self, view: PresenceView, round_trip_s: float) -> None:
        beats = {e.member: e.last_beat for e in view.entries}
        self._beat_view.observe(now=view.now, round_trip_s=round_trip_s, beats=beats)
        self._last_beats = beats
        self._last_read_at = view.now
        self._forgotten = registry.still_forgotten(self._forgotten, beats)

    async def _refresh_peers(self, view: PresenceView) -> None:
        """The live peers' snapshots: the ones we hold where their digest did not move, the
        others fetched in one round trip (idle, a beat reads a few dozen bytes per peer)."""
        current: dict[str, registry.PresenceData] = {}
        for entry in view.entries:
            member = entry.member
            if member == self.me or self._beat_view.stale(member) or member in self._forgotten:
                continue
            presence = registry.decode_presence(entry.data)
            if presence is not None:
                current[member] = presence
        self._known = {m: k for m, k in self._known.items() if m in self._last_beats}
        moved = sorted(
            m
            for m, p in current.items()
            if p.digest and (m not in self._known or self._known[m][0] != p.digest)
        )
        if moved:
            fetched = await self.key_value.get_many([keys.snapshot_key(m) for m in moved])
            for member, data in zip(moved, fetched, strict=True):
                snapshot = registry.decode_snapshot(data) if data is not None else None
                if snapshot is not None:
                    self._known[member] = (registry.snapshot_digest(data or b""), snapshot)
        loads = {
            m: registry.PeerLoad(p.in_flight, p.loads)
            for m, p in current.items()
            if p.loads is not None
        }
        if loads != self.peer_loads:
            self.peer_loads = loads
            if self.on_peer_loads is not None:
                self.on_peer_loads(loads)
        peers = {}
        for member, presence in current.items():
            if not presence.digest:
                peers[member] = self._legacy(member, presence)
            elif member in self._known:
                # The newest snapshot its key held (if that is not yet the one the digest
                # names, a write is under way or failed: the next beat fetches again).
                peers[member] = self._known[member][1]
        if _same_snapshots(peers, self._peers):
            return  # nothing placement sees has changed: keep its views as they are
        self._peers = peers
        self.version += 1
        if self.on_peers is not None:
            self.on_peers(self.peers())

    def _legacy(self, member: str, presence: registry.PresenceData) -> InstanceSnapshot:
        """A writer that predates digests: its snapshot is in the registry (same object while
        it does not change, so placement views are not rebuilt)."""
        snapshot = registry.legacy_snapshot(presence)
        known = self._known.get(member)
        if known is not None and known[0] == "" and known[1] == snapshot:
            return known[1]
        self._known[member] = ("", snapshot)
        return snapshot

    def peers(self) -> list[InstanceSnapshot]:
        """Last snapshots of the live peers, sorted by instance id, without this instance."""
        return [s for i, s in sorted(self._peers.items()) if i != self.me]

    def members(self) -> list[MemberLiveness]:
        """Every instance in the registry (this one included), sorted by instance id."""
        now = self._last_read_at
        own = self._snapshot()
        found = [MemberLiveness(self.me, "live", 0.0, len(own.nodes), own.in_flight)]
        for instance_id, last_beat in self._last_beats.items():
            if instance_id == self.me or now is None:
                continue
            age = max(0.0, now - last_beat)
            snapshot = self._peers.get(instance_id)
            if snapshot is not None:
                entry = MemberLiveness(
                    instance_id,
                    "live",
                    age,
                    len(snapshot.nodes),
                    registry.requests_load(self.peer_loads.get(instance_id), snapshot),
                )
            else:
                state: Literal["stale", "dead"] = (
                    "dead" if instance_id in self._forgotten else "stale"
                )
                entry = MemberLiveness(instance_id, state, age, None, None)
            found.append(entry)
        return sorted(found, key=lambda m: m.instance_id)

    def forget_peer(self, instance_id: str) -> None:
        """Stop placing on (and listing) ``instance_id`` until it beats again (it reached
        nobody, or it was judged dead)."""
        self._forgotten[instance_id] = self._last_beats.get(instance_id, float("-inf"))
        if self._peers.pop(instance_id, None) is not None:
            self.version += 1

    # -- the judge --------------------------------------------------------------------------

    async def dead_among(self, instance_ids: Sequence[str]) -> set[str]:
        """Which of ``instance_ids`` are dead. Call it every ``sweep_s`` even with no ids: the
        judge counts staleness only across reads no further apart than the stall gap.
        Raises ``CoordinationUnavailable`` when it cannot tell."""
        # Listener checks first, the registry read last: a stale peer is known when that read
        # answers, which is what failover_bound_s counts.
        listening = {i: await self.bus.is_listening(i) for i in sorted(set(instance_ids))}
        sent = self._clock()
        view = await self.presence.presence_read(
            keys.PRESENCE, stall_after_s=self.timing.stall_gap_s
        )
        dead = self._judge.judge(
            now=view.now,
            round_trip_s=self._clock() - sent,
            beats={e.member: e.last_beat for e in view.entries},
            listening=listening,
        )
        for instance_id in dead:
            self.forget_peer(instance_id)
        incarnations = {}
        for entry in view.entries:
            presence = registry.decode_presence(entry.data)
            if presence is not None:
                incarnations[entry.member] = presence.incarnation
        self.incarnations = incarnations
        return dead


def _same_snapshots(a: dict[str, InstanceSnapshot], b: dict[str, InstanceSnapshot]) -> bool:
    """Whether two peer maps hold the very same snapshot objects (a snapshot is decoded once
    per digest and then handed out as the same object, so identity is equality here, and
    O(peers))."""
    return a.keys() == b.keys() and all(a[k] is b[k] for k in a)


def _same_entries(a: InstanceSnapshot, b: InstanceSnapshot) -> bool:
    """Whether two of our snapshots say the same: same header, the very same entry objects."""
    return (
        a.in_flight == b.in_flight
        and a.instance_id == b.instance_id
        and a.incarnation == b.incarnation
        and len(a.nodes) == len(b.nodes)
        and all(x is y for x, y in zip(a.nodes, b.nodes, strict=True))
    )
