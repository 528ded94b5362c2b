"""The durable store behind GEMMANET_DATABASE_URL: API keys, node tokens, tasks (with their
token usage), ratings.

SQLAlchemy Core on a sync engine (SQLite by default, PostgreSQL by changing the URL); the
async methods the server calls run in worker threads. Secrets are stored as SHA-256 digests.

store.py       ``Store``: API keys, node tokens, finished tasks and their ratings
keys/          API keys and node tokens: their secrets, lifecycle, lifetimes, the
               authentication cache and when each key was last used
translate.py   driver failures mapped to the store's errors
engine.py      GEMMANET_DATABASE_URL as a configured engine with the tables in place
embedded_lock.py  one process per database without Redis: a file lock or an advisory lock
schema.py      the tables, in SQLAlchemy Core, portable across SQLite and PostgreSQL
migrations.py  columns added to existing tables after a database was first created
records.py     the plain records the store hands out and takes in
usage.py       token usage summed from the tasks table, per key and model, over a window
errors.py      its errors (defined in ``coordinator.errors``: one hierarchy)
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

from .errors import (
    AlreadyRated,
    KeyRevoked,
    NodeNotEnrolled,
    StoreError,
    StoreUnavailable,
    TaskForbidden,
    TaskNotFound,
    UnknownKey,
)
from .keys.expiry import online_on, parse_duration
from .records import ApiKey, KeyInfo, NodeRecord, TaskRecord, UsageRow

if TYPE_CHECKING:
    from .engine import normalize_url
    from .store import Store, check_key_name, check_node_id
    from .usage import check_usage_window

#: the names whose modules import SQLAlchemy (~0.15-0.25 s), loaded when first asked for: the
#: records and errors are plain, and a process that only passes them around (the simulator,
#: whose instances record tasks into an in-memory stand-in) need not load the engine
_LAZY = {
    "normalize_url": ".engine",
    "Store": ".store",
    "check_key_name": ".store",
    "check_node_id": ".store",
    "check_usage_window": ".usage",
}

__all__ = [
    "AlreadyRated",
    "ApiKey",
    "KeyInfo",
    "KeyRevoked",
    "NodeNotEnrolled",
    "NodeRecord",
    "Store",
    "StoreError",
    "StoreUnavailable",
    "TaskForbidden",
    "TaskNotFound",
    "TaskRecord",
    "UnknownKey",
    "UsageRow",
    "check_key_name",
    "check_node_id",
    "check_usage_window",
    "normalize_url",
    "online_on",
    "parse_duration",
]


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(module, __name__), name)
    globals()[name] = value  # asked once: later lookups are plain attribute reads
    return value
