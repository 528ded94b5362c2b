"""``GET /api/v1/usage``: the tokens the tasks of a key used, per model, over a time window.

The answer is summed from the task records in the store, which every instance writes in
batches (``runtime/task_recorder.py``, every 50 ms by default, off the request path): a task
that just ended counts once its batch is written, so the newest tasks may be missing for that
interval (longer while the database is slow or away, when the records wait in memory).
"""

from __future__ import annotations

import time

import msgspec
from quart import Quart, Response, request
from quart_schema import document_querystring, document_response, security_scheme

from coordinator.api.responses import json_response
from coordinator.api.routes import _BEARER, _errors, authenticate, instance
from coordinator.api.usage.schemas import ALL_KEYS, UsageQuery, UsageResponse
from coordinator.errors import Forbidden, InvalidFields
from coordinator.store import ApiKey, check_usage_window

#: the window when ``since`` is not given: the last 24 hours before ``until``
DEFAULT_WINDOW_S = 86_400.0


def parse_query(args: dict[str, list[str]]) -> UsageQuery:
    """The query string (each name to all its values) as a UsageQuery; 422 when a value is not
    a number, a name is unknown (a typo would silently widen the window) or given twice."""
    repeated = sorted(name for name, values in args.items() if len(values) > 1)
    if repeated:
        raise InvalidFields(f"invalid query: {', '.join(repeated)} given more than once")
    flat = {name: values[0] for name, values in args.items()}
    try:
        # strict=False: query values are strings, "1.5" is the number 1.5.
        return msgspec.convert(flat, UsageQuery, strict=False)
    except msgspec.ValidationError as exc:
        raise InvalidFields(f"invalid query: {exc}") from None


def window(query: UsageQuery, now: float) -> tuple[float, float]:
    """[since, until) in Unix seconds: the last 24 hours up to now unless the query says."""
    until = now if query.until is msgspec.UNSET else query.until
    since = until - DEFAULT_WINDOW_S if query.since is msgspec.UNSET else query.since
    try:
        check_usage_window(since, until)
    except ValueError as exc:
        raise InvalidFields(f"invalid query: {exc}") from None
    return since, until


def scope(api_key: ApiKey, query: UsageQuery) -> str | None:
    """The key to report (None: every key). Only an operator key sees other keys' usage."""
    if query.key_id is msgspec.UNSET or query.key_id == api_key.key_id:
        return api_key.key_id
    if not api_key.admin:
        raise Forbidden("only an operator key may see the usage of another key")
    return None if query.key_id == ALL_KEYS else query.key_id


def register_usage_routes(app: Quart) -> None:
    @app.get("/api/v1/usage")
    @security_scheme(_BEARER)
    @document_querystring(UsageQuery)
    @document_response(UsageResponse)
    @_errors(401, 403, 422, 503)
    async def usage() -> Response:
        """Tokens used by a key's tasks, per model, over a time window.

        The tasks created in [`since`, `until`) (Unix seconds; default: the last 24 hours up
        to now), of the caller's key; an operator key may ask for another `key_id` or for `*`
        (every key), any other key gets 403.

        Task records are written in batches (every 50 ms by default, on every instance): a
        task that just ended may be missing from the answer until its batch is written.
        """
        api_key = await authenticate()
        query = parse_query(request.args.to_dict(flat=False))
        since, until = window(query, time.time())
        key_id = scope(api_key, query)
        rows = await instance().store.usage(since, until, key_id)
        return json_response(UsageResponse.of(since, until, rows, key_id=key_id))
