"""Turning GEMMANET_DATABASE_URL into a configured engine with the tables in place."""

from __future__ import annotations

import logging
import time
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event, pool
from sqlalchemy.engine import URL, Engine, make_url

from coordinator.url_credentials import hide_credentials

from .errors import StoreError, StoreUnavailable
from .keys.lifecycle import ensure_epoch_row
from .migrations import add_missing_columns
from .schema import metadata

log = logging.getLogger(__name__)

SQLITE_BUSY_TIMEOUT_MS = 5000
POSTGRES_CONNECT_TIMEOUT_S = 5
# Arbitrary constant naming the advisory lock that serialises table creation on PostgreSQL.
_SCHEMA_LOCK_ID = 0x67_6E_73_63  # "gnsc"


SUPPORTED_BACKENDS = ("sqlite", "postgresql", "postgres")


def normalize_url(url: str | URL) -> URL:
    """Parse ``url``; a bare ``postgresql://`` (or ``postgres://``) gets the psycopg 3 driver.
    Anything but SQLite or PostgreSQL is refused in one line (the CLI prints StoreError so)."""
    try:
        parsed = make_url(url)
    except sa.exc.ArgumentError:
        raise StoreError(
            "GEMMANET_DATABASE_URL is not a database URL (sqlite:///PATH or postgresql://...)"
        ) from None
    if parsed.get_backend_name() not in SUPPORTED_BACKENDS:
        raise StoreError(
            f"GEMMANET_DATABASE_URL: unsupported database {parsed.get_backend_name()!r};"
            " use sqlite:///PATH or postgresql://USER@HOST/DB"
        )
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed


def safe_url(url: URL) -> str:
    """The URL as it may appear in logs and error messages: password and secret query values
    hidden."""
    return hide_credentials(url.render_as_string(hide_password=True))


def is_sqlite_memory(url: URL) -> bool:
    return url.get_backend_name() == "sqlite" and url.database in (None, "", ":memory:")


def create_engine(url: URL, *, pool_size: int) -> Engine:
    backend = url.get_backend_name()
    kwargs: dict[str, Any] = {}
    if backend == "sqlite":
        if is_sqlite_memory(url):
            # One shared connection, or every worker thread would see its own empty database.
            kwargs.update(poolclass=pool.StaticPool, connect_args={"check_same_thread": False})
        else:
            kwargs.update(pool_size=pool_size, max_overflow=pool_size)
    else:
        kwargs.update(pool_size=pool_size, max_overflow=pool_size, pool_pre_ping=True)
        if backend == "postgresql" and "connect_timeout" not in url.query:
            kwargs["connect_args"] = {"connect_timeout": POSTGRES_CONNECT_TIMEOUT_S}
    try:
        engine = sa.create_engine(url, **kwargs)
    except ModuleNotFoundError as exc:
        # Say what to install instead of a traceback (the CLI prints StoreError as one line).
        raise StoreError(
            f"the database driver for {backend} is not installed ({exc.name}); "
            "for PostgreSQL: pip install 'gemmanet[postgres]'"
        ) from None
    if backend == "sqlite":
        event.listen(engine, "connect", _sqlite_on_connect)
    return engine


def _sqlite_on_connect(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    try:
        # busy_timeout first: switching to WAL itself needs a lock another process may hold.
        cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA journal_mode = WAL")
        # NORMAL is durable across application crashes under WAL; only an OS crash or power
        # loss can drop the last commits, which is the usual trade for a coordinator.
        cursor.execute("PRAGMA synchronous = NORMAL")
        cursor.execute("PRAGMA foreign_keys = ON")
    finally:
        cursor.close()


def create_tables(engine: Engine, *, attempts: int = 3) -> None:
    """Create missing tables and indexes, and add columns newer than an existing table
    (``migrations``); safe when several processes open one DB at once.

    On PostgreSQL an advisory lock serialises creators. Elsewhere (and as a second line of
    defence) a creator that loses the race sees "already exists" or a unique violation in the
    catalog; by then the winner has made the tables, so the retry's existence check passes.
    """
    for attempt in range(1, attempts + 1):
        try:
            with engine.begin() as conn:
                if engine.dialect.name == "postgresql":
                    conn.execute(
                        sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": _SCHEMA_LOCK_ID}
                    )
                metadata.create_all(conn, checkfirst=True)
                add_missing_columns(conn)
                ensure_epoch_row(conn)
            return
        except (sa.exc.OperationalError, sa.exc.ProgrammingError, sa.exc.IntegrityError) as exc:
            if attempt == attempts or not _is_creation_race(exc):
                if isinstance(exc, sa.exc.OperationalError):
                    raise StoreUnavailable(
                        f"cannot open the database {safe_url(engine.url)}: {exc.orig}"
                    ) from exc
                raise
            log.debug("lost the table-creation race (attempt %d), retrying", attempt)
            time.sleep(0.05 * attempt)


def _is_creation_race(exc: sa.exc.DBAPIError) -> bool:
    text = str(exc.orig).lower()
    return (
        "already exists" in text
        or "duplicate" in text
        or "unique" in text
        or "database is locked" in text
    )
