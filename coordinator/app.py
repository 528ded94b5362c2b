"""The Quart-Trio application factory: ``hypercorn --worker-class trio 'coordinator.app:create_app()'``."""

from __future__ import annotations

import logging
from typing import cast

import trio
from quart import websocket
from quart.wrappers import Websocket
from quart_schema import QuartSchema
from quart_trio import QuartTrio
from werkzeug.local import LocalProxy

from coordinator import __version__
from coordinator.api.errors import install_error_handlers
from coordinator.api.openapi import StructOpenAPIProvider
from coordinator.api.routes import register_routes
from coordinator.coordination.factory import create_bus, create_coordination
from coordinator.coordination.memory_bus_hub import MemoryBusHub
from coordinator.runtime.instance import Instance
from coordinator.runtime.single_instance_lock import hold_single_instance_lock
from coordinator.settings import Settings
from coordinator.store import Store

log = logging.getLogger("gemmanet.app")


async def run_instance(
    settings: Settings, *, task_status: trio.TaskStatus[Instance] = trio.TASK_STATUS_IGNORED
) -> None:
    """Everything one instance runs besides its HTTP server, for as long as it is cancelled."""
    store = await trio.to_thread.run_sync(Store.open, settings.database_url)
    try:
        coordination = create_coordination(
            settings.redis_url,
            password_file=settings.redis_password_file,
            key_prefix=settings.key_prefix,
            clock=trio.current_time,
        )
        async with coordination, trio.open_nursery() as nursery:
            # Embedded (no Redis): the in-process bus; a single instance has no peers on it.
            hub = None if settings.redis_url else MemoryBusHub(trio.current_time)
            bus = create_bus(settings.bus, coordination, memory_hub=hub)
            instance = Instance(settings, store, coordination, bus)
            if settings.redis_url and not settings.multi_instance:
                await nursery.start(
                    lambda task_status: hold_single_instance_lock(
                        coordination,
                        settings.instance_id,
                        ttl_s=settings.lock_ttl_s,
                        task_status=task_status,
                    )
                )
            await nursery.start(instance.run)
            log.info(
                "instance %s serving (coordination: %s%s)",
                settings.instance_id,
                coordination.kind,
                ", multi-instance" if settings.multi_instance else "",
            )
            task_status.started(instance)
            try:
                await trio.sleep_forever()
            finally:
                await instance.leave()
    finally:
        store.close()


def create_app(settings: Settings | None = None) -> QuartTrio:
    settings = settings or Settings.from_env()
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

    @app.websocket("/ws/node")
    async def node_socket() -> None:
        # The proxy's target itself: the socket is used from tasks outside this handler's context.
        socket = cast("LocalProxy[Websocket]", websocket)._get_current_object()
        instance: Instance = app.config["GEMMANET_INSTANCE"]
        await instance.serve_node(socket)

    @app.before_serving
    async def start_instance() -> None:
        # `gemmanet serve` starts the instance itself; a bare `hypercorn ...create_app()` does not.
        if app.config.get("GEMMANET_INSTANCE") is None:
            app.config["GEMMANET_INSTANCE"] = await app.nursery.start(run_instance, settings)

    return app
