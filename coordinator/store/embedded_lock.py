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
import os
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from coordinator.errors import StartupRefused

from .engine import is_sqlite_memory, safe_url

__all__ = ["EMBEDDED_LOCK_ID", "EmbeddedStoreLock", "lock_embedded_store"]

#: names the advisory lock in the database (``create_tables`` uses another number)
EMBEDDED_LOCK_ID = 0x67_6E_73_69  # "gnsi"

_HOW = (
    "run one instance per database without Redis, or set GEMMANET_REDIS_URL and "
    "GEMMANET_MULTI_INSTANCE=1 to run several"
)


class EmbeddedStoreLock:
    """Held until ``release`` or the end of the process."""

    def __init__(self, release: Any, where: str) -> None:
        self._release = release
        #: what is locked, for the log line
        self.where = where

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


def _lock_postgresql(engine: Engine) -> EmbeddedStoreLock:
    # A connection outside the pool: the lock lives exactly as long as this session.
    connection = engine.connect()
    try:
        # Keyed by the schema the tables live in, so that deployments in separate schemas of
        # one database do not lock each other out.
        schema = connection.execute(sa.text("SELECT current_schema()")).scalar() or "public"
        got = connection.execute(
            sa.text("SELECT pg_try_advisory_lock(:k, hashtext(:s))"),
            {"k": EMBEDDED_LOCK_ID, "s": schema},
        ).scalar()
        holder = None
        if not got:
            holder = connection.execute(
                sa.text(
                    "SELECT a.client_addr FROM pg_locks l JOIN pg_stat_activity a "
                    "ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.granted "
                    "AND l.classid = :k AND l.objid::int = hashtext(:s) AND l.objsubid = 2 "
                    "AND l.database = (SELECT oid FROM pg_database "
                    "WHERE datname = current_database())"
                ),
                {"k": EMBEDDED_LOCK_ID, "s": schema},
            ).first()
        connection.commit()
    except sa.exc.DBAPIError as exc:
        connection.close()
        raise StartupRefused(
            f"cannot take the embedded-store lock in {safe_url(engine.url)}: {exc.orig}"
        ) from None
    if not got:
        connection.close()
        who = f" (a session from {holder[0] or 'a local socket'})" if holder else ""
        raise StartupRefused(
            f"another instance{who} already runs on the embedded store {safe_url(engine.url)} "
            f"(schema {schema}) without Redis (it holds the advisory lock {EMBEDDED_LOCK_ID}); "
            f"{_HOW}"
        )
    connection.detach()  # never handed back to the pool, never reused by a request

    def release() -> None:
        connection.close()

    return EmbeddedStoreLock(release, f"advisory lock {EMBEDDED_LOCK_ID} of schema {schema}")
