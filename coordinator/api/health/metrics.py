"""``GET /metrics`` (Prometheus text format) and the per-route request counters behind it.

Without ``GEMMANET_METRICS_PORT`` the endpoint is a route of the API app (no API key: it
holds counts, never keys, ids of tasks or prompts). With it, the API port answers 404 there
and a tiny ASGI app, bound on that port by a second Hypercorn server in the same process,
serves it, so the metrics need not face whoever reaches the API.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import trio
from hypercorn.config import Config
from hypercorn.trio import serve as hypercorn_serve
from quart import Quart, Response, current_app, g, request
from quart_schema import hide

from coordinator.errors import StartupRefused
from coordinator.runtime.instance import Instance
from coordinator.runtime.metrics import CONTENT_TYPE, Metrics
from coordinator.settings import Settings

log = logging.getLogger("gemmanet.metrics")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


def _metrics() -> Metrics | None:
    instance: Instance | None = current_app.config.get("GEMMANET_INSTANCE")
    return instance.metrics if instance is not None else None


def install_metrics(app: Quart, settings: Settings) -> None:
    """Count every HTTP request by route and status; serve /metrics unless it has its own port."""

    @app.before_request
    async def note_start() -> None:
        g.gemmanet_started = time.perf_counter()

    @app.after_request
    async def count_request(response: Response) -> Response:
        metrics = _metrics()
        if metrics is not None:
            # The URL rule, not the path: "/api/v1/tasks/<task_id>/rating" stays one series.
            rule = request.url_rule.rule if request.url_rule is not None else "unmatched"
            metrics.http_requests_of(rule, str(response.status_code)).inc()
            started = getattr(g, "gemmanet_started", None)
            if started is not None:
                took = time.perf_counter() - started
                metrics.http_duration_of(rule).observe(took)
        return response

    if settings.metrics_port is not None:
        return

    @app.get("/metrics")
    @hide
    async def metrics_endpoint() -> Response:
        """Prometheus text format (not part of the JSON API, so not in /openapi.json)."""
        metrics = _metrics()
        body = metrics.exposition() if metrics is not None else b""
        return Response(body, 200, content_type=CONTENT_TYPE)


def metrics_asgi_app(metrics: Metrics) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    """The whole app of the metrics port: ``GET /metrics``; anything else is a JSON 404."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        if scope["path"] == "/metrics" and scope["method"] in ("GET", "HEAD"):
            status, content_type, body = 200, CONTENT_TYPE, metrics.exposition()
        else:
            status, content_type = 404, "application/json"
            body = (
                b'{"error": {"code": "not_found", "message": "this port serves only GET /metrics"}}'
            )
        headers = [(b"content-type", content_type.encode()), (b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send(
            {"type": "http.response.body", "body": body if scope["method"] != "HEAD" else b""}
        )

    return app


async def serve_metrics(
    metrics: Metrics,
    settings: Settings,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the metrics port until cancelled; a port that cannot be bound refuses the start."""
    config = Config()
    config.bind = [f"{settings.metrics_host}:{settings.metrics_port}"]
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")
    config.graceful_timeout = 1.0

    async def run(task_status: trio.TaskStatus[list[str]]) -> None:
        try:
            await hypercorn_serve(
                metrics_asgi_app(metrics),  # type: ignore[arg-type]
                config,
                task_status=task_status,
            )
        except* OSError as group:  # Hypercorn binds inside its own nurseries
            exc: BaseException = group
            while isinstance(exc, BaseExceptionGroup):
                exc = exc.exceptions[0]
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise StartupRefused(
                f"cannot serve metrics on {config.bind[0]} (GEMMANET_METRICS_PORT): {reason}"
            ) from None

    async with trio.open_nursery() as nursery:
        await nursery.start(run)
        log.info("metrics on http://%s/metrics", config.bind[0])
        task_status.started()
