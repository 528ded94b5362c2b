"""The store's errors, defined in ``coordinator.errors`` (one hierarchy for the whole
coordinator) and re-exported here for the store's callers.

StoreError              anything the store cannot do (500 "store_error")
├── StoreUnavailable    the database cannot be reached or is locked too long (503)
├── TaskNotFound        no task with that id (404 "task_not_found")
├── TaskForbidden       the task was requested with another API key (403 "forbidden")
└── AlreadyRated        the task already has a rating (409 "already_rated")
"""

from __future__ import annotations

from coordinator.errors import (
    AlreadyRated,
    StoreError,
    StoreUnavailable,
    TaskForbidden,
    TaskNotFound,
)

__all__ = ["AlreadyRated", "StoreError", "StoreUnavailable", "TaskForbidden", "TaskNotFound"]
