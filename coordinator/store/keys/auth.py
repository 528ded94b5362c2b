"""``CachedAuth``: API-key authentication with a cache that a revocation anywhere empties
within a second.

The lookup runs on every request, so positive answers are cached (``AUTH_CACHE_TTL_S``). A
cached answer is trusted only while the last *successful* read of the store's revocation
epoch (``lifecycle.bump_epoch``) began at most ``TRUST_S`` ago; an older one is read again
before the answer is used (one read at a time, shared by every request waiting for it). The
instance also reads it every ``CHECK_INTERVAL_S`` in the background, so the hot path rarely
waits. When the epoch moved, every cached answer is dropped, and lookups that were in flight
across the move are not cached (they may have read the key before it was revoked).

So a key revoked (or rotated) at time t by any process is refused from t + ``TRUST_S`` at the
latest. Expiry needs no epoch: it is compared with the wall clock on every use, cached or not.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Awaitable, Callable

import trio

from ..errors import StoreError
from ..records import ApiKey
from .cache import TtlCache
from .last_used import UseRecorder

log = logging.getLogger(__name__)

AUTH_CACHE_TTL_S = 30.0
AUTH_CACHE_SIZE = 4096
#: how long a cached authentication may be trusted after the epoch read that vouched for it
TRUST_S = 0.75
#: how often a running instance reads the epoch in the background
CHECK_INTERVAL_S = 0.5


class CachedAuth:
    """The cache of positive authentications, kept honest by the revocation epoch."""

    def __init__(
        self,
        lookup: Callable[[str], Awaitable[ApiKey | None]],
        read_epoch: Callable[[], Awaitable[int]],
        *,
        ttl_s: float,
        max_size: int,
        clock: Callable[[], float],
        wall_clock: Callable[[], float],
        trust_s: float = TRUST_S,
    ) -> None:
        self._lookup = lookup
        self._read_epoch = read_epoch
        self._clock = clock
        self._wall_clock = wall_clock
        self._trust_s = trust_s
        self._cache: TtlCache[ApiKey] = TtlCache(ttl_s=ttl_s, max_size=max_size, clock=clock)
        self._epoch: int | None = None
        self._checked_at = -math.inf
        #: bumped whenever the cache is emptied: a lookup that saw another value is not cached
        self._generation = 0
        self._checking: trio.Event | None = None
        #: called (in the trio thread) after the epoch moved: the instance checks its nodes
        self.on_revocation: list[Callable[[], None]] = []
        self.uses = UseRecorder(wall_clock=wall_clock)

    @property
    def epoch(self) -> int | None:
        """The revocation epoch as last read (None before the first read)."""
        return self._epoch

    def clear(self) -> None:
        self._cache.clear()
        self._generation += 1

    async def authenticate(self, key_hash: str) -> ApiKey | None:
        cached = self._cache.get(key_hash)
        if cached is not None and self._clock() - self._checked_at > self._trust_s:
            # Not vouched for lately: read the epoch first, then the cache again (that read
            # may just have emptied it).
            cached = self._cache.get(key_hash) if await self._recheck() else None
        if cached is not None:
            return self._accept(key_hash, cached)
        if self._epoch is None:
            # A baseline first: an answer cached before any epoch read could never be judged.
            with contextlib.suppress(StoreError):
                await self.check()
        generation = self._generation
        record = await self._lookup(key_hash)
        if record is None:
            return None
        if generation == self._generation and self._epoch is not None:
            self._cache.put(key_hash, record)
        return self._accept(key_hash, record)

    def _accept(self, key_hash: str, record: ApiKey) -> ApiKey | None:
        if record.expires_at is not None and record.expires_at <= self._wall_clock():
            self._cache.discard(key_hash)
            return None
        self.uses.touch(record.key_id)
        return record

    async def _recheck(self) -> bool:
        """Read the epoch; whether the cache may be trusted now."""
        try:
            await self.check()
        except StoreError as exc:
            # Not vouched for: the caller looks the key up (and fails as the store does).
            log.debug("revocation epoch unreadable: %s", exc)
            return False
        return self._clock() - self._checked_at <= self._trust_s

    async def check(self, *, fresh: bool = False) -> None:
        """Read the revocation epoch (joining a read already under way; with ``fresh``, only
        one begun after this call); on a move, drop every cached answer and tell
        ``on_revocation``. Raises StoreError when it cannot."""
        if self._checking is not None:
            await self._checking.wait()
            if not fresh:
                return
            if self._checking is not None:  # begun after our call: it sees what we need
                await self._checking.wait()
                return
        self._checking = done = trio.Event()
        try:
            started = self._clock()
            epoch = await self._read_epoch()
            if epoch != self._epoch:
                # The first read too: answers cached before it had no baseline to trust.
                self.clear()
                moved, self._epoch = self._epoch is not None, epoch
                if moved:
                    for callback in self.on_revocation:
                        callback()
            self._checked_at = started
        finally:
            self._checking = None
            done.set()

    async def watch(self, interval_s: float = CHECK_INTERVAL_S) -> None:
        """Read the epoch every ``interval_s`` until cancelled (an instance runs this)."""
        while True:
            try:
                await self.check()
            except StoreError as exc:
                log.warning("cannot read the revocation epoch: %s", exc)
            await trio.sleep(interval_s)
