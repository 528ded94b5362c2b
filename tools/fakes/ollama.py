"""A fake Ollama server: ``POST /api/generate`` (NDJSON stream or one JSON object), ``GET
/api/tags`` (the models it has), ``GET /api/ps`` (the models loaded in memory, ``size`` in
bytes, as Ollama's docs give it), ``GET /api/version``, ``GET /``. Answers with the prompt, word
by word. ``resident`` (model -> bytes) is what ``/api/ps`` reports; a test may change it.

Run it alone with ``python -m tools.fakes.ollama --port P``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import AsyncIterator, Mapping
from datetime import UTC, datetime
from typing import Any

import trio

from tools.fakes._server import FakeModelServer, Request, Response, serve_main, words

__all__ = ["FakeOllama", "main"]

_NDJSON = "application/x-ndjson"


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


class FakeOllama(FakeModelServer):
    kind = "ollama"

    def __init__(self, *, resident: Mapping[str, int] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        #: model -> bytes in memory: what ``GET /api/ps`` lists (loaded models)
        self.resident: dict[str, int] = dict(resident or {})
        #: how many times ``/api/ps`` was asked (a monitor's polls)
        self.ps_requests = 0

    async def handle(self, request: Request) -> Response:
        route = (request.method, request.path)
        if route == ("GET", "/"):
            return Response(200, "Ollama is running", content_type="text/plain; charset=utf-8")
        if route == ("GET", "/api/version"):
            return Response(200, {"version": "0.0.0-fake"})
        if route == ("GET", "/api/tags"):
            names = sorted(set(self.models or ()) | set(self.resident))
            return Response(200, {"models": [_tag(n, self.resident.get(n, 0)) for n in names]})
        if route == ("GET", "/api/ps"):
            self.ps_requests += 1
            loaded = sorted(self.resident.items())
            return Response(200, {"models": [_running(n, size) for n, size in loaded]})
        if route == ("POST", "/api/generate"):
            return self._generate(request)
        if request.path == "/api/generate":
            return Response(405, {"error": "method not allowed"})
        return Response(404, "404 page not found", content_type="text/plain")

    def _generate(self, request: Request) -> Response:
        try:
            body = request.json()
            if not isinstance(body, dict):
                raise TypeError("body is not an object")
        except (ValueError, TypeError) as exc:
            return Response(400, {"error": f"invalid request body: {exc}"})
        self.requests.append(body)
        self.authorizations.append(request.headers.get("authorization"))
        model = body.get("model")
        if not isinstance(model, str) or not model:
            return Response(400, {"error": "model is required"})
        if not self.serves(model):
            return Response(404, {"error": f"model '{model}' not found, try pulling it first"})
        if self.fail == "http":
            return Response(500, {"error": "fake ollama: injected failure"})
        prompt = body.get("prompt") or ""
        if not isinstance(prompt, str):
            return Response(400, {"error": "prompt must be a string"})
        pieces = words(prompt)
        if body.get("stream", True) is False:
            if self.fail in ("midstream", "truncate"):
                return Response(500, {"error": "fake ollama: injected failure"})
            record = {"model": model, "created_at": _now(), "response": prompt}
            record.update(_final(len(prompt), len(pieces)))
            self.completed += 1
            return Response(200, record)
        return Response(200, content_type=_NDJSON, stream=self._stream(model, prompt, pieces))

    async def _stream(self, model: str, prompt: str, pieces: list[str]) -> AsyncIterator[bytes]:
        for index, piece in enumerate(pieces):
            if index and self.chunk_delay_s > 0:
                await trio.sleep(self.chunk_delay_s)
            yield _line({"model": model, "created_at": _now(), "response": piece, "done": False})
            if self.fail == "midstream":
                yield _line({"error": "fake ollama: injected failure mid-stream"})
                return
            if self.fail == "truncate":
                return
        record: dict[str, Any] = {"model": model, "created_at": _now(), "response": ""}
        record.update(_final(len(prompt), len(pieces)))
        yield _line(record)


def _final(prompt_chars: int, pieces: int) -> dict[str, Any]:
    """The statistics Ollama puts in its final ``done`` record (durations in nanoseconds)."""
    return {
        "done": True,
        "done_reason": "stop",
        "context": list(range(1, min(pieces, 8) + 1)),
        "total_duration": 1_000_000 + 1_000 * pieces,
        "load_duration": 500_000,
        "prompt_eval_count": max(1, prompt_chars // 4),
        "prompt_eval_duration": 100_000,
        "eval_count": pieces,
        "eval_duration": 1_000 * pieces,
    }


_DETAILS = {
    "parent_model": "",
    "format": "gguf",
    "family": "fake",
    "families": ["fake"],
    "parameter_size": "0B",
    "quantization_level": "Q4_0",
}


def _tag(name: str, size: int = 0) -> dict[str, Any]:
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


def _line(record: dict[str, Any]) -> bytes:
    return json.dumps(record).encode() + b"\n"


def main(argv: list[str] | None = None) -> int:
    def factory(args: argparse.Namespace) -> FakeModelServer:
        resident = {}
        for item in args.resident or ():
            model, _, gb = item.partition("=")
            resident[model] = int(float(gb) * 1e9)
        return FakeOllama(
            models=args.models,
            chunk_delay_s=args.chunk_delay_ms / 1000.0,
            fail=args.fail,
            resident=resident,
        )

    def extra(parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--resident",
            action="append",
            metavar="MODEL=GB",
            help="a model /api/ps reports as loaded, with its size (repeatable)",
        )

    return serve_main(factory, argv, prog="python -m tools.fakes.ollama", extra=extra)


if __name__ == "__main__":
    sys.exit(main())
