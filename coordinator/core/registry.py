"""The shared registry as data: what each instance publishes about itself and its nodes, and
the cluster-wide view built from those snapshots. Pure: the shell reads and writes the keys
(their names, and what each holds: ``coordination/keys.py``): the presence registry's data is
a ``PresenceData``, a snapshot key's value an ``InstanceSnapshot``, an owner record
``owner_value``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping

import msgspec

from coordinator.core.placement.choose import NodeView

#: an unchanged snapshot is written again this often, to keep its key's TTL ahead
SNAPSHOT_REWRITE_S = 20.0


def owner_value(instance_id: str, conn_id: str) -> bytes:
    return f"{instance_id} {conn_id}".encode()


def parse_owner(value: bytes | None) -> tuple[str, str] | None:
    if not value:
        return None
    instance_id, _, conn_id = value.decode(errors="replace").partition(" ")
    return (instance_id, conn_id) if conn_id else None


class NodeEntry(msgspec.Struct, frozen=True, kw_only=True):
    node_id: str
    conn_id: str
    models: list[str]
    max_parallel: int
    in_flight: int
    vram_gb: float | None = None
    agent_version: str = ""
    connected_at: float = 0.0
    #: why its agent says its model backend is down (``models`` is then empty); None: it
    #: answers (or a writer that predates this)
    backend_down: str | None = None


class InstanceSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    instance_id: str
    in_flight: int
    nodes: list[NodeEntry]
    #: random per process start: a restart with the same instance id is a new life, and the
    #: tasks placed on the previous life are lost with it ("": a writer that predates this)
    incarnation: str = ""


class PresenceData(msgspec.Struct, frozen=True, kw_only=True):
    """What an instance beats into the registry: its snapshot's digest, not the snapshot.
    Field-compatible with ``InstanceSnapshot`` (a reader that predates digests decodes it as a
    snapshot with no nodes); ``digest`` "" marks a writer that predates digests, whose data is
    the full snapshot (``nodes`` then holds them)."""

    instance_id: str
    in_flight: int
    incarnation: str = ""
    nodes: list[NodeEntry] = []
    #: ``snapshot_digest`` of the snapshot at ``keys.snapshot_key(instance_id)``
    digest: str = ""
    node_count: int = 0
    #: conn id -> tasks running, for every connection running any, as of this beat; the
    #: snapshot's own ``in_flight`` per node is as of its last write, which happens only when
    #: a node comes or goes (None: a writer that republishes the snapshot on every change)
    loads: dict[str, int] | None = None


class BeatLoads(msgspec.Struct, frozen=True):
    """What an instance's beat carries besides its snapshot's digest, read at the beat: the
    roster version (the stored snapshot is rewritten when it moves), the busy connections
    (conn id -> tasks running) and the requests in flight."""

    roster: int
    busy: Mapping[str, int]
    in_flight: int


class PeerLoad(msgspec.Struct, frozen=True):
    """A peer's load as its last beat told it: tasks it runs for requesters, and per busy
    connection."""

    in_flight: int
    busy: dict[str, int]

    def of(self, conn_id: str) -> int:
        return self.busy.get(conn_id, 0)


def node_load(load: PeerLoad | None, conn_id: str, stored: int) -> int:
    """Tasks on a peer's node: as its last beat told them when it beats its loads (``load``),
    else as its stored snapshot said (``stored``)."""
    return stored if load is None else load.of(conn_id)


def requests_load(load: PeerLoad | None, snapshot: InstanceSnapshot) -> int:
    """Requests a peer carries, by the same rule as ``node_load``."""
    return snapshot.in_flight if load is None else load.in_flight


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(InstanceSnapshot)
_presence_decoder = msgspec.json.Decoder(PresenceData)


def snapshot_digest(encoded: bytes) -> str:
    """A short fingerprint of an encoded snapshot (equal bytes, equal digest)."""
    return hashlib.blake2b(encoded, digest_size=8).hexdigest()


def encode_presence(
    snapshot: InstanceSnapshot,
    digest: str,
    loads: Mapping[str, int] | None = None,
    in_flight: int | None = None,
) -> bytes:
    """The registry data for ``snapshot`` (``digest``: ``snapshot_digest`` of the bytes
    stored for it; ``loads``: the busy connections now, when the stored snapshot is only
    rewritten as nodes come and go; ``in_flight``: the requests now, when ``snapshot`` is the
    stored one and older than that)."""
    return _encoder.encode(
        PresenceData(
            instance_id=snapshot.instance_id,
            in_flight=snapshot.in_flight if in_flight is None else in_flight,
            incarnation=snapshot.incarnation,
            digest=digest,
            node_count=len(snapshot.nodes),
            loads=None if loads is None else dict(loads),
        )
    )


def decode_presence(data: bytes) -> PresenceData | None:
    """Registry data, or None for anything unreadable."""
    try:
        return _presence_decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


def legacy_snapshot(presence: PresenceData) -> InstanceSnapshot:
    """The full snapshot a writer that predates digests put in the registry itself."""
    return InstanceSnapshot(
        instance_id=presence.instance_id,
        in_flight=presence.in_flight,
        nodes=presence.nodes,
        incarnation=presence.incarnation,
    )


def encode_snapshot(snapshot: InstanceSnapshot) -> bytes:
    return _encoder.encode(snapshot)


def decode_snapshot(data: bytes) -> InstanceSnapshot | None:
    """A snapshot, or None for anything unreadable (another version, a corrupted value)."""
    try:
        return _decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


def remote_views(
    snapshots: Iterable[InstanceSnapshot],
    ratings: Mapping[str, tuple[float, int]],
    *,
    exclude_instance: str,
    pending_per_conn: Mapping[str, int],
) -> list[NodeView]:
    """Placement candidates on other instances. ``pending_per_conn`` (this instance's own
    tasks in flight per connection) corrects snapshots that are a heartbeat old."""
    views = []
    for snap in sorted(snapshots, key=lambda s: s.instance_id):
        if snap.instance_id == exclude_instance:
            continue
        for entry in snap.nodes:
            views.append(
                NodeView(
                    node_id=entry.node_id,
                    instance_id=snap.instance_id,
                    conn_id=entry.conn_id,
                    models=frozenset(entry.models),
                    max_parallel=entry.max_parallel,
                    in_flight=max(entry.in_flight, pending_per_conn.get(entry.conn_id, 0)),
                    rating=ratings[entry.node_id][0] if entry.node_id in ratings else None,
                    incarnation=snap.incarnation,
                )
            )
    return views


def online_node_ids(snapshots: Iterable[InstanceSnapshot]) -> set[str]:
    """Node identities online anywhere; one identity counts once even while it is being
    replaced across instances."""
    return {entry.node_id for snap in snapshots for entry in snap.nodes}


def recent_members(
    beats: Mapping[str, float], *, now: float, alive_ttl_s: float, me: str
) -> list[str]:
    """The members other than ``me`` whose last beat is within ``alive_ttl_s`` of ``now``,
    sorted (who else runs on this registry right now, for the start-up mode check)."""
    return sorted(m for m, beat in beats.items() if m != me and now - beat <= alive_ttl_s)


def still_forgotten(forgotten: Mapping[str, float], beats: Mapping[str, float]) -> dict[str, float]:
    """Of the peers forgotten at their last beat (``forgotten``: member -> that beat), those
    that have not beaten since, by the registry's ``beats``. A killed peer stays forgotten
    until the registry forgets it; a peer that was only unreachable for a moment comes back
    with its next beat."""
    return {
        member: beat
        for member, beat in forgotten.items()
        if member in beats and beats[member] <= beat
    }
