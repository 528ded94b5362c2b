"""The ``KeyValue`` role on Redis: plain commands where one is atomic on its own (GET, MGET,
SET, SET … GET, DEL, SCAN), Lua scripts (``scripts.py``) for the compound ones."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from coordinator.coordination.redis.connect.link import Operation, RedisLink
from coordinator.coordination.redis.scripts import (
    COMPARE_AND_SET,
    INCR_WITH_TTL,
    REFRESH_IF,
    REFRESH_MANY,
    SWAP_MANY,
)

__all__ = ["REFRESH_BATCH", "RedisKeyValue", "ttl_ms"]

_SCAN_COUNT = 1000
#: keys per ``refresh_many`` / ``swap_many`` script: one script blocks Redis, so it stays short
REFRESH_BATCH = 500


def ttl_ms(ttl_s: float | None) -> str:
    """A TTL as the scripts and PX take it, in milliseconds ("" for None: no expiry)."""
    if ttl_s is None:
        return ""
    if not ttl_s > 0:
        raise ValueError(f"ttl_s must be positive or None, got {ttl_s!r}")
    return str(max(1, round(ttl_s * 1000)))


def _glob_escape(text: str) -> str:
    return "".join("\\" + ch if ch in "\\*?[]" else ch for ch in text)


class RedisKeyValue:
    """``KeyValue`` on the keys of one link's prefix."""

    def __init__(self, link: RedisLink) -> None:
        self._link = link

    async def get(self, key: str) -> bytes | None:
        reply: bytes | None = await self._link.execute("GET", b"GET", self._link.redis_key(key))
        return reply

    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        if not keys:
            return []
        link = self._link
        reply = await link.execute("MGET", b"MGET", *(link.redis_key(key) for key in keys))
        return list(reply)

    async def set(
        self, key: str, value: bytes, *, ttl_s: float | None = None, only_if_absent: bool = False
    ) -> bool:
        args: list[Any] = [self._link.redis_key(key), value]
        ttl = ttl_ms(ttl_s)
        if ttl:
            args += [b"PX", ttl]
        if only_if_absent:
            args.append(b"NX")
        reply = await self._link.execute("SET", b"SET", *args)
        return reply is not None

    async def swap(self, key: str, value: bytes, *, ttl_s: float | None = None) -> bytes | None:
        # SET ... GET (Redis >= 6.2) is atomic on its own.
        args: list[Any] = [self._link.redis_key(key), value, b"GET"]
        ttl = ttl_ms(ttl_s)
        if ttl:
            args += [b"PX", ttl]
        reply: bytes | None = await self._link.execute("SET GET", b"SET", *args)
        return reply

    async def swap_many(
        self,
        items: Sequence[tuple[str, bytes]],
        *,
        ttl_s: float | None = None,
        bump: str | None = None,
    ) -> list[bytes | None]:
        link = self._link
        ttl = ttl_ms(ttl_s)
        previous: list[bytes | None] = []
        for at in range(0, len(items), REFRESH_BATCH):
            batch = items[at : at + REFRESH_BATCH]
            keys = [link.redis_key(k) for k, _ in batch]
            if bump is not None:
                keys.append(link.redis_key(bump))  # the script bumps the key past the values
            args = [ttl, "1" if bump is not None else "0", *(v for _, v in batch)]
            previous.extend(await link.run_script(SWAP_MANY, keys, args))
        return previous

    async def compare_and_set(
        self,
        key: str,
        expected: bytes | None,
        value: bytes | None,
        *,
        ttl_s: float | None = None,
    ) -> bool:
        args = [
            b"0" if expected is None else b"1",
            b"" if expected is None else expected,
            b"0" if value is None else b"1",
            b"" if value is None else value,
            ttl_ms(ttl_s),
        ]
        link = self._link
        return bool(await link.run_script(COMPARE_AND_SET, [link.redis_key(key)], args))

    async def refresh_if(self, key: str, expected: bytes, ttl_s: float) -> bool:
        ttl = ttl_ms(ttl_s)
        link = self._link
        return bool(await link.run_script(REFRESH_IF, [link.redis_key(key)], [expected, ttl]))

    async def refresh_many(self, expected: Sequence[tuple[str, bytes]], ttl_s: float) -> list[bool]:
        link = self._link
        ttl = ttl_ms(ttl_s)
        done: list[bool] = []
        for at in range(0, len(expected), REFRESH_BATCH):
            batch = expected[at : at + REFRESH_BATCH]
            reply = await link.run_script(
                REFRESH_MANY, [link.redis_key(k) for k, _ in batch], [ttl, *(v for _, v in batch)]
            )
            done.extend(bool(int(r)) for r in reply)
        return done

    async def delete(self, key: str) -> None:
        await self._link.execute("DEL", b"DEL", self._link.redis_key(key))

    async def incr(self, key: str, amount: int = 1, *, ttl_s: float | None = None) -> int:
        link = self._link
        args = [int(amount), ttl_ms(ttl_s)]
        return int(await link.run_script(INCR_WITH_TTL, [link.redis_key(key)], args))

    async def keys_with_prefix(self, prefix: str) -> list[str]:
        link = self._link
        pattern = _glob_escape(link.redis_key(prefix)) + "*"
        cut = len(link.prefix)

        async def scan(op: Operation) -> list[str]:
            found: set[str] = set()
            cursor: bytes | int = b"0"
            while True:
                # TYPE string: rate-limit logs (sorted sets) are not "keys" of this interface.
                reply = await link.request(
                    op,
                    b"SCAN",
                    cursor,
                    b"MATCH",
                    pattern,
                    b"COUNT",
                    _SCAN_COUNT,
                    b"TYPE",
                    b"string",
                )
                cursor, batch = reply[0], reply[1]
                found.update(raw.decode()[cut:] for raw in batch)
                if cursor in (b"0", 0, "0"):
                    return sorted(found)

        return await link.guarded("SCAN", scan)
