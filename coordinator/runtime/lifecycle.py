"""``LifecycleWatch``: an instance's side of key and node lifecycle, off the request path.

* reads the store's revocation epoch every 0.5 s (``store.auth.CachedAuth.watch``), which
  empties the authentication cache when any process revoked or rotated something;
* after such a move, closes the sockets of this instance's nodes that are revoked (close code
  4001, which a node agent does not reconnect after); a node that connected in the meantime
  (its token checked before the revocation, its socket attached after) is checked as soon as
  it appears, so it cannot slip through;
* writes the "last used" time of API keys in batches (at most once a minute per key);
* writes which nodes this instance holds ("last seen", "online on"): at once when a node comes
  or goes (noticed within ``POLL_S``), and every ``SEEN_EVERY_S`` while it stays.

Everything here runs in its own tasks; a slow or absent database delays these writes and
checks but no request.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import trio

from coordinator.core.effects import CloseNode, Effect
from coordinator.core.node_table import NodeTable
from coordinator.errors import StoreError
from coordinator.store import Store
from protocol import CloseCode

log = logging.getLogger("gemmanet.lifecycle")

#: how often the node sockets are compared with the last look (new ones are checked at once)
POLL_S = 0.5
#: how often the uses of API keys are written (each key at most once a minute)
USES_EVERY_S = 5.0
#: how often the nodes this instance holds are written as seen
SEEN_EVERY_S = 60.0
REVOKED_REASON = "this node's enrollment was revoked"


class LifecycleWatch:
    def __init__(
        self,
        instance_id: str,
        store: Store,
        nodes: NodeTable,
        close: Callable[[list[Effect]], None],
        *,
        wall_clock: Callable[[], float] = time.time,
        poll_s: float = POLL_S,
        uses_every_s: float = USES_EVERY_S,
        seen_every_s: float = SEEN_EVERY_S,
    ) -> None:
        self._instance_id = instance_id
        self._store = store
        self._nodes = nodes
        self._close = close
        self._wall_clock = wall_clock
        self._poll_s = poll_s
        self._uses_every_s = uses_every_s
        self._seen_every_s = seen_every_s
        #: node id -> conn id, as of the last look
        self._known: dict[str, str] = {}
        self._recheck_all = False
        self._wake = trio.Event()
        store.auth.on_revocation.append(self._revoked_somewhere)

    def _revoked_somewhere(self) -> None:
        self._recheck_all = True
        self._wake.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._store.auth.watch)
                nursery.start_soon(self._watch_nodes)
                nursery.start_soon(self._write_uses)
                task_status.started()
        finally:
            # A graceful stop: the uses not yet written, and our nodes as gone (their sockets
            # close with the instance), so `nodes list` does not wait 150 s to say so.
            with trio.CancelScope(shield=True), trio.move_on_after(2):
                await self._flush_uses(final=True)
                await self._forget_nodes()

    async def _forget_nodes(self) -> None:
        try:
            await self._store.run_sync(
                self._store.lifecycle.write_nodes_gone,
                self._instance_id,
                set(self._known),
                self._wall_clock(),
            )
        except StoreError as exc:
            log.warning("cannot write that this instance's nodes left: %s", exc)

    # ------------------------------------------------------------------ API keys

    async def _write_uses(self) -> None:
        while True:
            await trio.sleep(self._uses_every_s)
            await self._flush_uses()

    async def _flush_uses(self, *, final: bool = False) -> None:
        uses = self._store.auth.uses
        due = uses.due(final=final)
        if not due:
            return
        try:
            await self._store.run_sync(self._store.lifecycle.write_last_used, due)
        except StoreError as exc:
            log.warning("cannot write when %d API keys were last used: %s", len(due), exc)
            return
        uses.written(due)

    # ------------------------------------------------------------------ nodes

    async def _watch_nodes(self) -> None:
        next_seen = trio.current_time() + self._seen_every_s
        while True:
            with trio.move_on_after(self._poll_s):
                await self._wake.wait()
            self._wake = trio.Event()
            try:
                await self.look_at_nodes(write_all=trio.current_time() >= next_seen)
            except StoreError as exc:
                log.warning("cannot check this instance's nodes against the store: %s", exc)
                continue
            if trio.current_time() >= next_seen:
                next_seen = trio.current_time() + self._seen_every_s

    async def look_at_nodes(self, *, write_all: bool = False) -> None:
        """Compare the node sockets with the last look: close revoked ones (every one after a
        revocation, new ones always), write the comings and goings. Raises StoreError."""
        current = {conn.node_id: conn.conn_id for conn in self._nodes.connections()}
        new = {n for n, c in current.items() if self._known.get(n) != c}
        gone = set(self._known) - set(current)
        recheck_all, self._recheck_all = self._recheck_all, False
        check = set(current) if recheck_all else new
        lifecycle = self._store.lifecycle
        revoked: set[str] = set()
        try:
            if check:
                revoked = await self._store.run_sync(lifecycle.revoked_nodes, check)
        except BaseException:
            self._recheck_all = self._recheck_all or recheck_all  # try again next time
            raise
        closing: list[Effect] = [
            CloseNode(current[node_id], CloseCode.AUTH_FAILED, REVOKED_REASON)
            for node_id in sorted(revoked)
        ]
        if closing:
            log.warning("closing revoked nodes: %s", ", ".join(sorted(revoked)))
            self._close(closing)
        now = self._wall_clock()
        seen = set(current) if write_all else new - revoked
        if seen:
            await self._store.run_sync(lifecycle.write_nodes_seen, self._instance_id, seen, now)
        if gone:
            await self._store.run_sync(lifecycle.write_nodes_gone, self._instance_id, gone, now)
        # Only once written: a failed write is tried again at the next look. (A revoked node
        # seen here stays known; its going is written once its socket is gone.)
        self._known = current
