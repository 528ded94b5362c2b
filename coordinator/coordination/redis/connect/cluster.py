"""What the Redis backend needs to know about Redis Cluster: the URL form, hash slots and the
slot table.

The key layout (docs/redis.md "Redis Cluster"): on a cluster every key and channel of a deployment
is named ``{<prefix>}:…``, so the hash tag ``{<prefix>}`` puts all of them in one slot. Each Lua
script can then touch any set of the deployment's keys (an admission reads the presence
registry, the node facts, the queue and every candidate's leases in one atomic step), MGET and
SCAN see everything on one node, and a sharded pub/sub channel (SPUBLISH/SSUBSCRIBE) lives on
the same node. The price: one deployment's state is served by one master (its replicas take
over when it fails); several deployments (prefixes) spread over the masters.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from coordinator.errors import SettingsError

__all__ = [
    "CLUSTER_SCHEMES",
    "SLOTS",
    "crc16",
    "key_slot",
    "plain_url",
    "slot_owner",
    "tagged_prefix",
]

SLOTS = 16384

#: URL schemes that select Redis Cluster, mapped to the scheme of one node's connection
CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}


def _crc16_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
        table.append(crc & 0xFFFF)
    return table


_TABLE = _crc16_table()


def crc16(data: bytes) -> int:
    """CRC16-CCITT (XMODEM), the checksum Redis Cluster hashes keys with."""
    crc = 0
    for byte in data:
        crc = ((crc << 8) & 0xFFFF) ^ _TABLE[((crc >> 8) ^ byte) & 0xFF]
    return crc


def key_slot(key: str | bytes) -> int:
    """The hash slot of ``key``: of its hash tag (the first non-empty ``{…}``) when it has one."""
    raw = key.encode() if isinstance(key, str) else key
    start = raw.find(b"{")
    if start >= 0:
        end = raw.find(b"}", start + 1)
        if end > start + 1:
            raw = raw[start + 1 : end]
    return crc16(raw) % SLOTS


def tagged_prefix(key_prefix: str) -> str:
    """The cluster form of a deployment's key prefix: ``gn`` -> ``{gn}:``."""
    if "{" in key_prefix or "}" in key_prefix:
        raise SettingsError(f"GEMMANET_KEY_PREFIX={key_prefix!r} must not hold braces")
    return f"{{{key_prefix}}}:"


def plain_url(url: str) -> tuple[str, bool]:
    """``(url of the seed node, is a cluster)``: ``redis+cluster://h:p/0`` -> ``redis://h:p/0``."""
    parts = urlsplit(url)
    scheme = CLUSTER_SCHEMES.get(parts.scheme)
    if scheme is None:
        return url, False
    if parts.path not in ("", "/", "/0"):
        raise SettingsError("a Redis Cluster has only database 0: use redis+cluster://host:port")
    return urlunsplit(parts._replace(scheme=scheme)), True


def slot_owner(reply: Sequence[Any], slot: int) -> tuple[str, int] | None:
    """The master's ``(host, port)`` serving ``slot`` in a CLUSTER SLOTS reply, if any."""
    for entry in reply:
        first, last, master = int(entry[0]), int(entry[1]), entry[2]
        if first <= slot <= last:
            host = master[0].decode() if isinstance(master[0], bytes) else str(master[0])
            return host, int(master[1])
    return None
