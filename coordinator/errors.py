"""The coordinator's error hierarchy. Each error knows its HTTP status and its JSON code.

    GemmaNetError                 500 internal_error
    ├── MalformedJson             400 malformed_json
    ├── Unauthorized              401 unauthorized
    ├── Forbidden                 403 forbidden
    ├── NotFound                  404 not_found / task_not_found
    ├── Conflict                  409 already_rated
    ├── PayloadTooLarge           413 payload_too_large
    ├── InvalidFields             422 invalid_request
    ├── RateLimited               429 rate_limited           (Retry-After)
    ├── NodeDisconnected          502 node_disconnected
    ├── NodeFailed                502 node_error
    ├── Unavailable               503 (Retry-After)
    │   ├── NoNodeForModel            no_node_for_model
    │   ├── AllNodesBusy              all_nodes_busy
    │   └── CoordinationDown          coordination_unavailable
    └── TaskTimedOut              504 task_timeout

Every HTTP error leaves the process as ``{"error": {"code": ..., "message": ...}}``.
"""

from __future__ import annotations

from typing import Any


class GemmaNetError(Exception):
    status: int = 500
    code: str = "internal_error"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code

    def headers(self) -> dict[str, str]:
        return {}

    def body(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message}}


class MalformedJson(GemmaNetError):
    status, code = 400, "malformed_json"


class Unauthorized(GemmaNetError):
    status, code = 401, "unauthorized"

    def headers(self) -> dict[str, str]:
        return {"WWW-Authenticate": "Bearer"}


class Forbidden(GemmaNetError):
    status, code = 403, "forbidden"


class NotFound(GemmaNetError):
    status, code = 404, "not_found"


class Conflict(GemmaNetError):
    status, code = 409, "conflict"


class PayloadTooLarge(GemmaNetError):
    status, code = 413, "payload_too_large"


class InvalidFields(GemmaNetError):
    status, code = 422, "invalid_request"


class _RetryLater(GemmaNetError):
    def __init__(self, message: str, *, retry_after_s: float = 1.0, code: str | None = None):
        super().__init__(message, code=code)
        self.retry_after_s = retry_after_s

    def headers(self) -> dict[str, str]:
        # Retry-After takes whole seconds; never advertise 0 (clients would spin).
        return {"Retry-After": str(max(1, int(self.retry_after_s + 0.999)))}


class RateLimited(_RetryLater):
    status, code = 429, "rate_limited"


class NodeDisconnected(GemmaNetError):
    status, code = 502, "node_disconnected"


class NodeFailed(GemmaNetError):
    status, code = 502, "node_error"


class Unavailable(_RetryLater):
    status, code = 503, "unavailable"


class NoNodeForModel(Unavailable):
    code = "no_node_for_model"


class AllNodesBusy(Unavailable):
    code = "all_nodes_busy"


class CoordinationDown(Unavailable):
    code = "coordination_unavailable"


class TaskTimedOut(GemmaNetError):
    status, code = 504, "task_timeout"


class SettingsError(Exception):
    """A configuration that cannot run; the CLI prints it as one line and exits non-zero."""


class StartupRefused(Exception):
    """This instance must not start (the single-instance lock is held elsewhere, Redis cannot
    be reached at start, or the settings break a promised bound); one line, non-zero exit."""
