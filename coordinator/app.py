"""The Quart-Trio application factory: ``hypercorn --worker-class trio 'coordinator.app:create_app()'``."""

from __future__ import annotations

import logging

import trio
from quart_schema import QuartSchema
from quart_trio import QuartTrio

from coordinator import __version__
from coordinator.api.admin.routes import register_admin_routes
from coordinator.api.errors import install_error_handlers
from coordinator.api.health.metrics import install_metrics, serve_metrics
from coordinator.api.health.routes import register_system_health
from coordinator.api.node_websocket import ServeNode, serve_node_sockets_first
from coordinator.api.ollama.routes import register_ollama_routes
from coordinator.api.openai.routes import register_openai_routes
from coordinator.api.openapi import StructOpenAPIProvider
from coordinator.api.routes import register_routes
from coordinator.api.usage.routes import register_usage_routes
from coordinator.coordination.bus.memory_hub import MemoryBusHub
from coordinator.coordination.factory import coordination_for, create_bus
from coordinator.errors import StartupRefused
from coordinator.runtime.cluster.single_instance_lock import (
    hold_single_instance_lock,
    refuse_mixed_modes,
)
from coordinator.runtime.instance import Instance
from coordinator.runtime.lifecycle import LifecycleWatch
from coordinator.server import hypercorn_patches
from coordinator.settings import Settings
from coordinator.store import Store
from coordinator.store.embedded_lock import lock_embedded_store, watch_embedded_lock

log = logging.getLogger("gemmanet.app")

#: how long a graceful stop may spend leaving the cluster (the registry, leases, queue entries)
LEAVE_BOUND_S = 3.0


async def run_instance(
    settings: Settings,
    *,
    stop: trio.Event | None = None,
    task_status: trio.TaskStatus[Instance] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Everything one instance runs besides its HTTP server, until ``stop`` is set (a graceful
    stop: it leaves the presence registry and releases the single-instance lock while its Redis
    connections still run) or it is cancelled (what it held in Redis expires with its TTL)."""
    store = await trio.to_thread.run_sync(Store.open, settings.database_url)
    embedded_lock = None
    try:
        if not settings.redis_url:  # one process per embedded store (store/embedded_lock.py)
            embedded_lock = await trio.to_thread.run_sync(lock_embedded_store, store.engine)
        coordination = coordination_for(settings, clock=trio.current_time)
        # The coordination is entered before the nursery, so cancelling the nursery at a
        # graceful stop leaves its connections open for the lock's release.
        async with coordination, trio.open_nursery() as nursery:
            # Embedded (no Redis): the in-process bus; a single instance has no peers on it.
            hub = None if settings.redis_url else MemoryBusHub(trio.current_time)
            if embedded_lock is not None:
                nursery.start_soon(watch_embedded_lock, embedded_lock)
            bus = create_bus(settings.bus, coordination, memory_hub=hub)
            instance = Instance(settings, store, coordination, bus)
            if settings.redis_url and not settings.multi_instance:
                await nursery.start(
                    lambda task_status: hold_single_instance_lock(
                        coordination.key_value,
                        settings.instance_id,
                        ttl_s=settings.lock_ttl_s,
                        task_status=task_status,
                    )
                )
            await nursery.start(instance.run)
            # Revocations (keys and nodes) and the last-used / last-seen writes.
            watch = LifecycleWatch(settings.instance_id, store, instance.nodes, instance.apply)
            await nursery.start(watch.run)
            if settings.metrics_port is not None:
                await nursery.start(serve_metrics, instance.metrics, settings)
            if settings.monitor:
                # A monitor candidate in this instance (docs/direct-hosts.md).
                from coordinator.monitor.loop import run_monitor

                await nursery.start(
                    run_monitor,
                    coordination.monitor,
                    coordination.telemetry,
                    settings,
                    settings.instance_id,
                )
            if settings.redis_url:
                try:
                    await refuse_mixed_modes(
                        coordination.key_value, coordination.presence, settings
                    )
                except StartupRefused:
                    await instance.leave()
                    raise
            log.info(
                "instance %s serving (coordination: %s%s; database: %s)",
                settings.instance_id,
                coordination.kind,
                ", multi-instance" if settings.multi_instance else "",
                store.safe_url,
            )
            task_status.started(instance)
            if stop is None:
                await trio.sleep_forever()
            await stop.wait()
            # Leaving (at most 3 s) and the lock's release (RELEASE_BOUND_S, 2.5 s) fit in the
            # 6 s that ``gemmanet serve`` gives a graceful stop.
            with trio.move_on_after(min(settings.lock_ttl_s / 2, LEAVE_BOUND_S)):
                await instance.leave()
            # Ends the lock holder too, whose ``finally`` deletes the lock.
            nursery.cancel_scope.cancel()
    finally:
        if embedded_lock is not None:
            embedded_lock.release()
        store.close()


def create_app(settings: Settings | None = None) -> QuartTrio:
    settings = settings or Settings.from_env()
    hypercorn_patches.apply()
    app = QuartTrio("gemmanet")
    app.config.update(
        MAX_CONTENT_LENGTH=settings.max_body_bytes,
        # Tasks bound their own lifetime; Quart's 60 s response timeout would cut streams.
        RESPONSE_TIMEOUT=None,
        GEMMANET_SETTINGS=settings,
    )
    QuartSchema(
        app,
        info={"title": "GemmaNet coordinator", "version": __version__},
        security_schemes={"bearer": {"type": "http", "scheme": "bearer"}},
        swagger_ui_path=None,
        redoc_ui_path=None,
        scalar_ui_path=None,
        conversion_preference="msgspec",
        openapi_provider_class=StructOpenAPIProvider,
    )
    install_error_handlers(app)
    register_routes(app)
    register_usage_routes(app)
    register_admin_routes(app)
    register_openai_routes(app)
    register_ollama_routes(app)
    register_system_health(app)
    install_metrics(app, settings)

    def serve_node() -> ServeNode:
        instance: Instance = app.config["GEMMANET_INSTANCE"]
        return instance.serve_node

    # /ws/node below Quart (api/node_websocket.py): Quart's documented middleware hook.
    app.asgi_app = serve_node_sockets_first(app.asgi_app, serve_node)  # type: ignore[method-assign,assignment]

    @app.before_serving
    async def start_instance() -> None:
        # `gemmanet serve` starts the instance itself; a bare `hypercorn ...create_app()` does not.
        if app.config.get("GEMMANET_INSTANCE") is None:
            stop, stopped = trio.Event(), trio.Event()

            async def instance_then_signal(task_status: trio.TaskStatus[Instance]) -> None:
                try:
                    await run_instance(settings, stop=stop, task_status=task_status)
                finally:
                    stopped.set()

            app.config["GEMMANET_INSTANCE"] = await app.nursery.start(instance_then_signal)
            app.config["GEMMANET_STOP"] = (stop, stopped)

    @app.after_serving
    async def stop_instance() -> None:
        if "GEMMANET_STOP" in app.config:
            stop, stopped = app.config["GEMMANET_STOP"]
            stop.set()
            with trio.move_on_after(5):
                await stopped.wait()

    return app
