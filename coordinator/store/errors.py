"""The store's error hierarchy. Each error knows the HTTP status and error code it maps to.

StoreError              anything the store cannot do (500 "store_error")
├── StoreUnavailable    the database cannot be reached or is locked too long (503)
├── TaskNotFound        no task with that id (404 "task_not_found")
├── TaskForbidden       the task was requested with another API key (403 "forbidden")
└── AlreadyRated        the task already has a rating (409 "already_rated")
"""

from __future__ import annotations


class StoreError(Exception):
    """The durable store could not do what was asked."""

    http_status: int = 500
    code: str = "store_error"


class StoreUnavailable(StoreError):
    """The database cannot be reached, or stayed locked past the busy timeout."""

    http_status = 503
    code = "store_unavailable"


class TaskNotFound(StoreError):
    """No task with that id was recorded."""

    http_status = 404
    code = "task_not_found"


class TaskForbidden(StoreError):
    """The task exists but was requested with a different API key."""

    http_status = 403
    code = "forbidden"


class AlreadyRated(StoreError):
    """The task already has a rating; a task is rated at most once."""

    http_status = 409
    code = "already_rated"
