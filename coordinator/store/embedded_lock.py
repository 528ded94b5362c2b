"""One process per embedded store: without Redis an instance keeps its nodes, leases and queue
in its own memory, so a second ``gemmanet serve`` on the same database would run beside it
with a private view (capacity enforced per process, one node identity connected twice). The
second one is refused at start instead.

* SQLite: an exclusive ``flock`` on a lock file beside the database (``gemmanet.db.lock``).
  The kernel drops it when the process ends, however it ends (``kill -9`` included), so a
  restart is never blocked by a dead holder; the file keeps the holder's pid for the message.
* PostgreSQL: a session advisory lock (``pg_try_advisory_lock``, keyed by the schema the
  tables live in) on a connection of its own, kept for the life of the process. The server drops it when that session ends: a killed
  process's socket closes with it.
* An in-memory SQLite database belongs to its process anyway: nothing to lock.

With Redis the single-instance lock lives there (``runtime/cluster/single_instance_lock.py``).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sqlalchemy as sa
import trio
from sqlalchemy.engine import Engine

from coordinator.errors import StartupRefused

from .engine import is_sqlite_memory, safe_url

__all__ = ["EMBEDDED_LOCK_ID", "EmbeddedStoreLock", "lock_embedded_store", "watch_embedded_lock"]

log = logging.getLogger("gemmanet.store")
#: how often the PostgreSQL lock's session is checked (and the lock taken again if it was lost)
WATCH_S = 5.0

#: names the advisory lock in the database (``create_tables`` uses another number)
EMBEDDED_LOCK_ID = 0x67_6E_73_69  # "gnsi"

_HOW = (
    "run one instance per database without Redis, or set GEMMANET_REDIS_URL and "
    "GEMMANET_MULTI_INSTANCE=1 to run several"
)


class EmbeddedStoreLock:
    """Held until ``release`` or the end of the process."""

    def __init__(
        self, release: Any, where: str, *, check: Callable[[], str | None] | None = None
    ) -> None:
        self._release = release
        #: what is locked, for the log line
        self.where = where
        #: blocking: None while the lock is held (taken again if its session was lost), else
        #: why not; None for a lock that cannot be lost
        self.check = check

    def release(self) -> None:
        release, self._release = self._release, None
        if release is not None:
            with contextlib.suppress(Exception):
                release()


def lock_embedded_store(engine: Engine) -> EmbeddedStoreLock | None:
    """Take the lock of the database behind ``engine`` or raise ``StartupRefused`` in one line.
    Blocking (a file or a database call): run it in a thread. None: nothing to lock."""
    url = engine.url
    if url.get_backend_name() == "sqlite":
        if is_sqlite_memory(url):
            return None
        return _lock_sqlite_file(Path(str(url.database)), safe_url(url))
    if engine.dialect.name == "postgresql":
        return _lock_postgresql(engine)
    return None


def _lock_sqlite_file(database: Path, shown: str) -> EmbeddedStoreLock:
    path = database.resolve().with_name(database.name + ".lock")
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise StartupRefused(f"cannot open the lock file {path}: {exc.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
        os.close(fd)
        who = f" (pid {holder})" if holder.isdigit() else ""
        raise StartupRefused(
            f"another instance{who} already runs on the embedded store {shown} without "
            f"Redis (it holds {path}); {_HOW}"
        ) from None
    except OSError as exc:
        os.close(fd)
        raise StartupRefused(f"cannot lock {path}: {exc.strerror}") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)

    def release() -> None:
        # Closing the descriptor drops the lock; the file stays (removing it would race a
        # starting process that has just opened it).
        os.close(fd)

    return EmbeddedStoreLock(release, str(path))


def _try_advisory_lock(connection: sa.Connection) -> tuple[bool, str, str | None]:
    """(got it, the schema, the holder's client address when another session has it)."""
    # Keyed by the schema the tables live in, so that deployments in separate schemas of one
    # database do not lock each other out.
    schema = connection.execute(sa.text("SELECT current_schema()")).scalar() or "public"
    got = connection.execute(
        sa.text("SELECT pg_try_advisory_lock(:k, hashtext(:s))"),
        {"k": EMBEDDED_LOCK_ID, "s": schema},
    ).scalar()
    holder = None
    if not got:
        row = connection.execute(
            sa.text(
                "SELECT a.client_addr FROM pg_locks l JOIN pg_stat_activity a "
                "ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.granted "
                "AND l.classid = :k AND l.objid::int = hashtext(:s) AND l.objsubid = 2 "
                "AND l.database = (SELECT oid FROM pg_database "
                "WHERE datname = current_database())"
            ),
            {"k": EMBEDDED_LOCK_ID, "s": schema},
        ).first()
        holder = "" if row is None else str(row[0] or "a local socket")
    connection.commit()
    return bool(got), schema, holder


def _lock_postgresql(engine: Engine) -> EmbeddedStoreLock:
    # A connection outside the pool: the lock lives exactly as long as this session.
    connection = engine.connect()
    try:
        got, schema, holder = _try_advisory_lock(connection)
    except sa.exc.DBAPIError as exc:
        connection.close()
        raise StartupRefused(
            f"cannot take the embedded-store lock in {safe_url(engine.url)}: {exc.orig}"
        ) from None
    if not got:
        connection.close()
        who = f" (a session from {holder})" if holder else ""
        raise StartupRefused(
            f"another instance{who} already runs on the embedded store {safe_url(engine.url)} "
            f"(schema {schema}) without Redis (it holds the advisory lock {EMBEDDED_LOCK_ID}); "
            f"{_HOW}"
        )
    connection.detach()  # never handed back to the pool, never reused by a request
    held = [connection]

    def release() -> None:
        held[0].close()

    def check() -> str | None:
        """The session still answers, or a new one took the lock again (None); else why not."""
        try:
            held[0].execute(sa.text("SELECT 1")).scalar()
            held[0].commit()
            return None
        except sa.exc.DBAPIError:
            with contextlib.suppress(Exception):
                held[0].close()
        try:
            fresh = engine.connect()
        except sa.exc.DBAPIError as exc:
            return f"the embedded-store lock's session was lost and the database is out of reach: {exc.orig}"
        try:
            got, _, holder = _try_advisory_lock(fresh)
        except sa.exc.DBAPIError as exc:
            fresh.close()
            return f"the embedded-store lock's session was lost; taking it again failed: {exc.orig}"
        if not got:
            fresh.close()
            return (
                f"the embedded-store lock's session was lost and another session (from "
                f"{holder or 'somewhere'}) holds the lock now: another instance may be running "
                "on this store without Redis"
            )
        fresh.detach()
        held[0] = fresh
        return "the embedded-store lock's session was lost; it was taken again on a new one"

    return EmbeddedStoreLock(
        release, f"advisory lock {EMBEDDED_LOCK_ID} of schema {schema}", check=check
    )


async def watch_embedded_lock(lock: EmbeddedStoreLock, *, every_s: float = WATCH_S) -> None:
    """Every ``every_s``: is the lock still held (``EmbeddedStoreLock.check``)? Logs what it finds
    when not; runs until cancelled. Nothing to do for a lock that cannot be lost (SQLite)."""
    if lock.check is None:
        return
    while True:
        await trio.sleep(every_s)
        problem = await trio.to_thread.run_sync(lock.check)
        if problem is not None:
            log.warning("%s", problem)
