"""The HTTP API of INTERFACE.md: request schemas, routes, JSON errors, server-sent events,
and ``GET /metrics`` (``metrics_http.py``)."""
