"""The embedded backend's prefix affinity (the ``PrefixAffinity`` role): per model, the blocks
in the order they were last recorded, each with its holders and when each record expires,
like the Redis hash and sorted set (``redis/affinity.py``). The role object is
``roles.MemoryAffinity``."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from coordinator.coordination.roles import PREFIX_HOLDERS_KEPT

__all__ = ["PrefixTables", "check_record"]


def check_record(ttl_s: float, max_blocks: int) -> None:
    if not ttl_s > 0 or max_blocks < 1:
        raise ValueError(f"ttl_s must be > 0 and max_blocks >= 1, got {ttl_s!r}, {max_blocks!r}")


class PrefixTables:
    """Callers pass ``now`` (the state's injected clock)."""

    def __init__(self) -> None:
        # model -> block hash -> {node id: record deadline}, most recent holder first; the
        # blocks least recently recorded first
        self._models: dict[str, OrderedDict[str, dict[str, float]]] = {}

    def holders(self, model: str, hashes: Sequence[str], now: float) -> list[list[str]]:
        blocks = self._models.get(model)
        if blocks is None:
            return [[] for _ in hashes]
        found = []
        for block in hashes:
            held = blocks.get(block, {})
            found.append([node for node, deadline in held.items() if deadline > now])
        return found

    def record(
        self,
        model: str,
        node_id: str,
        hashes: Sequence[str],
        ttl_s: float,
        max_blocks: int,
        now: float,
    ) -> None:
        check_record(ttl_s, max_blocks)
        blocks = self._models.setdefault(model, OrderedDict())
        deadline = now + ttl_s
        for block in hashes:
            old = blocks.pop(block, {})
            held = {node_id: deadline}
            for node, until in old.items():
                if node != node_id and until > now and len(held) < PREFIX_HOLDERS_KEPT:
                    held[node] = until
            blocks[block] = held
        # Expired blocks from the least recently recorded on; then the bound.
        while blocks:
            first = next(iter(blocks.values()))
            if max(first.values()) > now and len(blocks) <= max_blocks:
                break
            blocks.popitem(last=False)
