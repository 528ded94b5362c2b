"""The durable store behind GEMMANET_DATABASE_URL: API keys, node tokens, tasks (with their
token usage), ratings.

SQLAlchemy Core on a sync engine (SQLite by default, PostgreSQL by changing the URL); the
async methods the server calls run in worker threads. Secrets are stored as SHA-256 digests.
"""

from __future__ import annotations

from .engine import DEFAULT_DATABASE_URL, normalize_url
from .errors import AlreadyRated, StoreError, StoreUnavailable, TaskForbidden, TaskNotFound
from .records import ApiKey, TaskRecord, UsageRow
from .store import Store, check_key_name, check_node_id
from .usage import check_usage_window

__all__ = [
    "DEFAULT_DATABASE_URL",
    "AlreadyRated",
    "ApiKey",
    "Store",
    "StoreError",
    "StoreUnavailable",
    "TaskForbidden",
    "TaskNotFound",
    "TaskRecord",
    "UsageRow",
    "check_key_name",
    "check_node_id",
    "check_usage_window",
    "normalize_url",
]
