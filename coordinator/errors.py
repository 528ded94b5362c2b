"""Every error the coordinator raises, in one hierarchy. Each knows its HTTP status, its JSON
error code and, where a node socket closes because of it, its close code.

    GemmaNetError                   500 internal_error
    ├── SettingsError               500 invalid_settings     a configuration that cannot run
    ├── StartupRefused              503 startup_refused      this instance must not start
    ├── MalformedJson               400 malformed_json
    ├── UnsupportedContent          400 unsupported_content  a chat message part that is not text
    ├── UnsupportedParameter        400 unsupported_parameter  a parameter no node can honour
    ├── Unauthorized                401 unauthorized         (WWW-Authenticate)
    ├── Forbidden                   403 forbidden
    │   └── TaskForbidden*              forbidden            a task of another API key
    ├── NotFound                    404 not_found
    │   ├── TaskNotFound*               task_not_found
    │   ├── UnknownKey*                 unknown_key          no API key with that id
    │   ├── NodeNotEnrolled*            unknown_node         no node enrolled with that id
    │   └── UnknownNode                 unknown_node         no such node (telemetry)
    ├── Conflict                    409 conflict
    │   ├── AlreadyRated*               already_rated
    │   └── KeyRevoked*                 key_revoked          rotating a revoked key
    ├── PayloadTooLarge             413 payload_too_large
    ├── InvalidFields               422 invalid_request
    ├── RateLimited                 429 rate_limited         (Retry-After)
    ├── TooManyActive               429 too_many_active      (Retry-After)
    ├── NodeDisconnected            502 node_disconnected
    ├── NodeFailed                  502 node_error
    ├── Unavailable                 503 unavailable          (Retry-After)
    │   ├── NoNodeForModel              no_node_for_model
    │   ├── AllNodesBusy                all_nodes_busy
    │   ├── ModelNeverFits              model_never_fits     no serving node's budget holds it
    │   ├── CoordinationUnavailable     coordination_unavailable, close 1013: the backend
    │   │   │                           cannot be reached (raised by the backends)
    │   │   └── CoordinationTimeout         it did not answer in time: slow, not known down
    │   ├── CoordinationDown            coordination_unavailable: a request failed for it
    │   ├── StoreUnavailable*           store_unavailable
    │   ├── InstanceDraining            instance_draining: this instance stops; retry elsewhere
    │   └── InstanceShuttingDown        instance_shutting_down: its drain window ran out
    ├── TaskTimedOut                504 task_timeout
    └── StoreError                  500 store_error          the durable store failed
        (* also a StoreError: ``except StoreError`` catches every store failure)

Every HTTP error leaves the process as ``{"error": {"code": ..., "message": ...}}``. The
coordination backends re-export ``CoordinationUnavailable`` (``coordinator.coordination``), the
store its errors (``coordinator.store``); they are defined here so that the tree has one root.
"""

from __future__ import annotations

from typing import ClassVar

from protocol import CloseCode, TaskErrorCode

__all__ = [
    "COORDINATION_DOWN_MESSAGE",
    "AllNodesBusy",
    "AlreadyRated",
    "Conflict",
    "CoordinationDown",
    "CoordinationTimeout",
    "CoordinationUnavailable",
    "Forbidden",
    "GemmaNetError",
    "InstanceDraining",
    "InstanceShuttingDown",
    "InvalidFields",
    "KeyRevoked",
    "MalformedJson",
    "ModelNeverFits",
    "NoNodeForModel",
    "NodeDisconnected",
    "NodeFailed",
    "NodeNotEnrolled",
    "NotFound",
    "PayloadTooLarge",
    "RateLimited",
    "SettingsError",
    "StartupRefused",
    "StoreError",
    "StoreUnavailable",
    "TaskForbidden",
    "TaskNotFound",
    "TaskTimedOut",
    "TooManyActive",
    "Unauthorized",
    "Unavailable",
    "UnknownKey",
    "UnknownNode",
    "UnsupportedContent",
    "UnsupportedParameter",
]


class GemmaNetError(Exception):
    """The root: anything the coordinator raises on purpose."""

    status: ClassVar[int] = 500
    code: str = "internal_error"
    # The close code of a node socket that ends because of this error (None: not a socket error).
    close_code: ClassVar[int | None] = None

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code

    def headers(self) -> dict[str, str]:
        return {}

    @property
    def client_message(self) -> str:
        """What a client is told: what happened, never where the internals live."""
        return self.message


class SettingsError(GemmaNetError):
    """A configuration that cannot run; the CLI prints it as one line and exits non-zero."""

    code = "invalid_settings"


class StartupRefused(GemmaNetError):
    """This instance must not start (the single-instance lock is held elsewhere, Redis or the
    database cannot be reached at start). ``gemmanet serve`` prints it as one line."""

    status, code = 503, "startup_refused"


class MalformedJson(GemmaNetError):
    status, code = 400, "malformed_json"


class UnsupportedContent(GemmaNetError):
    """A chat message (OpenAI-compatible API) holds a part the prompt cannot carry (an image)."""

    status, code = 400, "unsupported_content"


class UnsupportedParameter(GemmaNetError):
    """A request parameter no node can honour (``n`` > 1, ``tools``, ``logprobs``): refused
    rather than silently dropped. ``param`` names it (OpenAI's error ``param``)."""

    status, code = 400, "unsupported_parameter"

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


class Unauthorized(GemmaNetError):
    status, code = 401, "unauthorized"

    def headers(self) -> dict[str, str]:
        return {"WWW-Authenticate": "Bearer"}


class Forbidden(GemmaNetError):
    status, code = 403, "forbidden"


class NotFound(GemmaNetError):
    status, code = 404, "not_found"


class UnknownNode(NotFound):
    """No such node: it is not online on any instance and has no telemetry history."""

    status, code = 404, "unknown_node"


class Conflict(GemmaNetError):
    status, code = 409, "conflict"


class PayloadTooLarge(GemmaNetError):
    status, code = 413, "payload_too_large"


class InvalidFields(GemmaNetError):
    status, code = 422, "invalid_request"


class _RetryLater(GemmaNetError):
    def __init__(
        self, message: str, *, retry_after_s: float = 1.0, code: str | None = None
    ) -> None:
        super().__init__(message, code=code)
        self.retry_after_s = retry_after_s

    def headers(self) -> dict[str, str]:
        # Retry-After takes whole seconds; never advertise 0 (clients would spin).
        return {"Retry-After": str(max(1, int(self.retry_after_s + 0.999)))}


class RateLimited(_RetryLater):
    status, code = 429, "rate_limited"


class TooManyActive(_RetryLater):
    """The API key has GEMMANET_MAX_ACTIVE_PER_KEY requests running or queued already."""

    status, code = 429, "too_many_active"


class NodeDisconnected(GemmaNetError):
    status, code = 502, TaskErrorCode.NODE_DISCONNECTED.value


class NodeFailed(GemmaNetError):
    status, code = 502, "node_error"


class Unavailable(_RetryLater):
    status, code = 503, "unavailable"


class NoNodeForModel(Unavailable):
    code = "no_node_for_model"


class AllNodesBusy(Unavailable):
    code = TaskErrorCode.ALL_NODES_BUSY.value


class ModelNeverFits(Unavailable):
    """Every node serving the model has a memory budget smaller than one request of it needs
    (``core/placement/fit.py``): refused at once rather than queued. Retry-After is long: only a
    node with a larger budget, or a changed catalog, makes it placeable."""

    code = "model_never_fits"

    def __init__(self, message: str) -> None:
        super().__init__(message, retry_after_s=30.0)


COORDINATION_DOWN_MESSAGE = (
    "the coordination store is unavailable for the moment; retry after the Retry-After delay"
)


class CoordinationUnavailable(Unavailable):
    """The coordination backend cannot be reached or did not answer in time."""

    code = "coordination_unavailable"
    close_code = CloseCode.TRY_AGAIN_LATER

    @property
    def client_message(self) -> str:
        # The message names the backend's address, which is for the log only.
        return COORDINATION_DOWN_MESSAGE


class CoordinationTimeout(CoordinationUnavailable):
    """The backend did not answer in time: it may be slow rather than down, and the operation
    may still be carried out (a timed-out write can land later). Refused or closed connections
    and error replies are plain ``CoordinationUnavailable``. Callers that can wait (admission,
    the rate limit) retry these within a bound (``core/admission/machine.py``). ``silent_for_s``:
    how long the backend had answered no call of this process at all (None: not known)."""

    def __init__(self, message: str, *, silent_for_s: float | None = None) -> None:
        super().__init__(message)
        self.silent_for_s = silent_for_s


class CoordinationDown(Unavailable):
    """A request fails because the coordination backend is unavailable. A sibling of
    CoordinationUnavailable, not a subclass, so an ``except CoordinationUnavailable`` around a
    backend call never swallows a request's failure raised deeper down."""

    code = "coordination_unavailable"


class InstanceDraining(Unavailable):
    """This instance is draining (it got SIGTERM): a new request is refused before any work
    begins, so a load balancer can send it to another instance at once."""

    code = "instance_draining"


class InstanceShuttingDown(Unavailable):
    """The drain window ran out before the request's task ended: the request (a stream: its
    last event) ends with this rather than being cut off."""

    code = "instance_shutting_down"


class TaskTimedOut(GemmaNetError):
    status, code = 504, "task_timeout"


class StoreError(GemmaNetError):
    """The durable store could not do what was asked."""

    code = "store_error"


class StoreUnavailable(StoreError, Unavailable):
    """The database cannot be reached, or stayed locked past the busy timeout."""

    status, code = 503, "store_unavailable"


class TaskNotFound(StoreError, NotFound):
    """No task with that id was recorded."""

    status, code = 404, "task_not_found"


class TaskForbidden(StoreError, Forbidden):
    """The task exists but was requested with a different API key."""

    status, code = 403, "forbidden"


class AlreadyRated(StoreError, Conflict):
    """The task already has a rating; a task is rated at most once."""

    status, code = 409, "already_rated"


class UnknownKey(StoreError, NotFound):
    """No API key has that id (``gemmanet keys revoke|rotate``, the admin API)."""

    status, code = 404, "unknown_key"


class NodeNotEnrolled(StoreError, NotFound):
    """No node was ever enrolled with that id (``gemmanet nodes revoke``, the admin API)."""

    status, code = 404, "unknown_node"


class KeyRevoked(StoreError, Conflict):
    """The key is revoked: it cannot be rotated back to life (create a new one)."""

    status, code = 409, "key_revoked"
