"""Running the app on Hypercorn's trio worker (``gemmanet serve``)."""

from __future__ import annotations

import signal

import trio
from hypercorn.config import Config
from hypercorn.trio import serve as hypercorn_serve

from coordinator.app import create_app
from coordinator.settings import Settings
from protocol import MAX_ENVELOPE_BYTES


def hypercorn_config(host: str, port: int) -> Config:
    config = Config()
    config.bind = [f"{host}:{port}"]
    config.websocket_max_message_size = MAX_ENVELOPE_BYTES + 1024
    config.graceful_timeout = 5.0
    config.accesslog = None
    config.errorlog = "-"
    return config


def serve(settings: Settings, *, host: str, port: int) -> int:
    app = create_app(settings)
    config = hypercorn_config(host, port)

    async def main() -> None:
        shutdown = trio.Event()

        async def watch_signals() -> None:
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for _ in signals:
                    shutdown.set()
                    return

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch_signals)
            await hypercorn_serve(app, config, shutdown_trigger=shutdown.wait)
            nursery.cancel_scope.cancel()

    trio.run(main)
    return 0
