"""The Quart-Trio application factory: ``hypercorn --worker-class trio 'coordinator.app:create_app()'``."""

from __future__ import annotations

import logging

import trio
from quart import websocket
from quart_schema import QuartSchema
from quart_trio import QuartTrio

from coordinator import __version__
from coordinator.api.errors import install_error_handlers
from coordinator.api.routes import register_routes
from coordinator.coordination import Coordination
from coordinator.runtime.instance import Instance
from coordinator.runtime.node_socket import serve_node_socket
from coordinator.settings import Settings
from coordinator.store import Store

log = logging.getLogger("gemmanet.app")


def build_coordination(settings: Settings) -> Coordination:
    """The embedded memory backend, or Redis when GEMMANET_REDIS_URL is set."""
    if settings.redis_url:
        from coordinator.coordination.redis import RedisCoordination

        return RedisCoordination.from_url_and_password_file(
            settings.redis_url, settings.redis_password_file, settings.key_prefix
        )
    from coordinator.coordination.memory import MemoryCoordination

    return MemoryCoordination(clock=trio.current_time)


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
    )
    install_error_handlers(app)
    register_routes(app)

    @app.websocket("/ws/node")
    async def node_socket() -> None:
        await serve_node_socket(app.config["GEMMANET_INSTANCE"], websocket._get_current_object())

    @app.before_serving
    async def start_instance() -> None:
        store = await trio.to_thread.run_sync(Store.open, settings.database_url)
        coordination = build_coordination(settings)
        instance = Instance(settings, store, coordination)
        app.config["GEMMANET_INSTANCE"] = instance
        app.config["GEMMANET_CANCEL"] = cancel = trio.CancelScope()

        async def supervise(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED):
            with cancel:
                await instance.run(task_status=task_status)

        await app.nursery.start(supervise)
        log.info("instance %s serving (coordination: %s)", settings.instance_id, coordination.kind)

    @app.after_serving
    async def stop_instance() -> None:
        instance: Instance = app.config["GEMMANET_INSTANCE"]
        app.config["GEMMANET_CANCEL"].cancel()
        await instance.coordination.aclose()
        instance.store.close()

    return app
