"""The store's errors, defined in ``coordinator.errors`` (one hierarchy for the whole
coordinator) and re-exported here for the store's callers.

StoreError              anything the store cannot do (500 "store_error")
├── StoreUnavailable    the database cannot be reached or is locked too long (503)
├── TaskNotFound        no task with that id (404 "task_not_found")
├── TaskForbidden       the task was requested with another API key (403 "forbidden")
├── AlreadyRated        the task already has a rating (409 "already_rated")
├── UnknownKey          no API key with that id (404 "unknown_key")
├── NodeNotEnrolled     no node enrolled with that id (404 "unknown_node")
└── KeyRevoked          the key is revoked and cannot be rotated (409 "key_revoked")
"""

from __future__ import annotations

from coordinator.errors import (
    AlreadyRated,
    KeyRevoked,
    NodeNotEnrolled,
    StoreError,
    StoreUnavailable,
    TaskForbidden,
    TaskNotFound,
    UnknownKey,
)

__all__ = [
    "AlreadyRated",
    "KeyRevoked",
    "NodeNotEnrolled",
    "StoreError",
    "StoreUnavailable",
    "TaskForbidden",
    "TaskNotFound",
    "UnknownKey",
]
