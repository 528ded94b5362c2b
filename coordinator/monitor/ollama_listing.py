"""An Ollama host that has models and generates nothing: it answers what a residency monitor
polls, ``GET /api/tags`` (the models it has) and ``GET /api/ps`` (those loaded in memory,
``size`` in bytes), plus ``GET /api/version`` and ``GET /``, in Ollama's wire formats, and 404
to anything else.

``gemmanet prove-takeover`` serves one in its own process as the host its monitors poll, so a
product command needs none of the test doubles of tools/fakes/. The fake Ollama there answers
its listings with ``tags_answer`` and ``ps_answer``, so the two cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import partial
from typing import Any

import msgspec
import trio
from hypercorn.config import Config
from hypercorn.trio import serve

__all__ = ["OllamaListingHost", "ps_answer", "tags_answer"]

_DETAILS = {
    "parent_model": "",
    "format": "gguf",
    "family": "fake",
    "families": ["fake"],
    "parameter_size": "0B",
    "quantization_level": "Q4_0",
}


def _tag(name: str, size: int = 0) -> dict[str, Any]:
    """One entry of ``/api/tags``: Ollama's List local models answer."""
    return {
        "name": name,
        "model": name,
        "modified_at": "2024-01-01T00:00:00Z",
        "size": size,
        "digest": "0" * 64,
        "details": dict(_DETAILS),
    }


def _running(name: str, size: int) -> dict[str, Any]:
    """One entry of ``/api/ps``: Ollama's List running models answer."""
    return {
        "name": name,
        "model": name,
        "size": size,
        "digest": "0" * 64,
        "details": dict(_DETAILS),
        "expires_at": "2099-01-01T00:00:00Z",
        "size_vram": size,
        "context_length": 4096,
    }


def tags_answer(models: Iterable[str], resident: Mapping[str, int]) -> dict[str, Any]:
    """``GET /api/tags``: every model the host has (the loaded ones too)."""
    names = sorted(set(models) | set(resident))
    return {"models": [_tag(name, resident.get(name, 0)) for name in names]}


def ps_answer(resident: Mapping[str, int]) -> dict[str, Any]:
    """``GET /api/ps``: the loaded models, ``resident`` (model -> bytes in memory)."""
    return {"models": [_running(name, size) for name, size in sorted(resident.items())]}


class OllamaListingHost:
    """The host as a tiny ASGI app; ``resident`` (model -> bytes) may change while it runs."""

    def __init__(self, *, models: Iterable[str] = (), resident: Mapping[str, int]) -> None:
        self.models = set(models)
        self.resident: dict[str, int] = dict(resident)

    def answer(self, method: str, path: str) -> tuple[int, str, bytes]:
        """Status, content type and body of the answer to ``method path``."""
        json = "application/json"
        if (method, path) == ("GET", "/"):
            return 200, "text/plain; charset=utf-8", b"Ollama is running"
        if (method, path) == ("GET", "/api/version"):
            return 200, json, msgspec.json.encode({"version": "0.0.0-listing"})
        if (method, path) == ("GET", "/api/tags"):
            return 200, json, msgspec.json.encode(tags_answer(self.models, self.resident))
        if (method, path) == ("GET", "/api/ps"):
            return 200, json, msgspec.json.encode(ps_answer(self.resident))
        return 404, "text/plain", b"404 page not found"

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
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
        status, content_type, body = self.answer(scope["method"], scope["path"])
        headers = [(b"content-type", content_type.encode()), (b"cache-control", b"no-cache")]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    async def run(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Serve until cancelled; ``task_status.started(url)`` once listening (port 0: free)."""
        config = Config()
        config.bind = [f"{host}:{port}"]
        config.loglevel = "WARNING"
        config.accesslog = None
        config.graceful_timeout = 0.5
        async with trio.open_nursery() as nursery:
            binds: list[str] = await nursery.start(partial(serve, self, config, mode="asgi"))
            task_status.started(binds[0])
