"""A fake Ollama server: ``POST /api/chat`` and ``POST /api/generate`` (NDJSON stream or one
JSON object), ``GET /api/tags`` (the models it has), ``GET /api/ps`` (the models loaded in
memory, ``size`` in bytes, as Ollama's docs give it), ``GET /api/version``, ``GET /``.

A chat answers with the content of the last user message, a generate with the prompt, word by
word, honouring ``options.num_predict`` and ``options.stop``; the final record counts words as
tokens (``prompt_eval_count``: of every message, ``eval_count``: of the answer). Every request
body is checked against the ``ollama`` library's request types (``_ollama_types``): a body they
refuse gets 400 and lands in ``refused``. ``resident`` (model -> bytes) is what ``/api/ps``
reports; a test may change it.

Run it alone with ``python -m tools.fakes.ollama --port P``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import trio

# The listings are the product's own Ollama host's (gemmanet prove-takeover serves it), so the
# fake and that host cannot disagree on Ollama's /api/tags and /api/ps formats.
from coordinator.monitor.ollama_listing import ps_answer, tags_answer
from tools.fakes._server import (
    FakeModelServer,
    Request,
    Response,
    answer_of,
    serve_main,
    word_count,
    words,
)

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

    def prepare(self) -> None:
        from tools.fakes import _ollama_types  # noqa: F401 - loads the library's types

    async def handle(self, request: Request) -> Response:
        route = (request.method, request.path)
        if route == ("GET", "/"):
            return Response(200, "Ollama is running", content_type="text/plain; charset=utf-8")
        if route == ("GET", "/api/version"):
            return Response(200, {"version": "0.0.0-fake"})
        if route == ("GET", "/api/tags"):
            return Response(200, tags_answer(self.models or (), self.resident))
        if route == ("GET", "/api/ps"):
            self.ps_requests += 1
            return Response(200, ps_answer(self.resident))
        if route in (("POST", "/api/generate"), ("POST", "/api/chat")):
            return self._generation(request)
        if request.path in ("/api/generate", "/api/chat"):
            return Response(405, {"error": "method not allowed"})
        return Response(404, "404 page not found", content_type="text/plain")

    def _generation(self, request: Request) -> Response:
        from tools.fakes import _ollama_types as types
        from tools.fakes._checks import Problem

        try:
            body = request.json()
            if not isinstance(body, dict):
                raise TypeError("body is not an object")
        except (ValueError, TypeError) as exc:
            return Response(400, {"error": f"invalid request body: {exc}"})
        self.record(request, body)
        chat = request.path == "/api/chat"
        try:
            parsed = types.check_chat(body) if chat else types.check_generate(body)
        except Problem as problem:
            self.refuse(problem.message)
            return Response(400, {"error": f"invalid request: {problem.message}"})
        model = parsed.model
        if not self.serves(model):
            return Response(404, {"error": f"model '{model}' not found, try pulling it first"})
        if self.fail == "http":
            return Response(500, {"error": "fake ollama: injected failure"})
        if isinstance(parsed, types.StrictChat):
            contents = [m.content or "" for m in parsed.messages or ()]
            users = [m.content or "" for m in parsed.messages or () if m.role == "user"]
            asked = users[-1] if users else ""
        else:
            asked = parsed.prompt or ""
            contents = [asked]
        options = parsed.options
        answer, reason = answer_of(
            asked,
            max_tokens=options.num_predict if options else None,
            stop=options.stop if options else None,
        )
        reply = _Reply(
            model=model,
            chat=chat,
            answer=answer,
            reason=reason,
            prompt_tokens=word_count(*contents),
        )
        if parsed.stream is False:
            if self.fail in ("midstream", "truncate"):
                return Response(500, {"error": "fake ollama: injected failure"})
            self.completed += 1
            return Response(200, reply.record(answer, final=True))
        return Response(200, content_type=_NDJSON, stream=self._stream(reply))

    async def _stream(self, reply: _Reply) -> AsyncIterator[bytes]:
        for index, piece in enumerate(words(reply.answer)):
            if index and self.chunk_delay_s > 0:
                await trio.sleep(self.chunk_delay_s)
            yield _line(reply.record(piece))
            if self.fail == "midstream":
                yield _line({"error": "fake ollama: injected failure mid-stream"})
                return
            if self.fail == "truncate":
                return
        yield _line(reply.record("", final=True))


@dataclass(frozen=True)
class _Reply:
    model: str
    chat: bool
    answer: str
    reason: str
    prompt_tokens: int

    def record(self, text: str, *, final: bool = False) -> dict[str, Any]:
        from tools.fakes import _ollama_types as types

        stats = self._final() if final else {}
        if self.chat:
            return types.chat_record(self.model, _now(), text, done=final, **stats)
        if final:
            stats["context"] = list(range(1, min(self.prompt_tokens, 8) + 1))
        return types.generate_record(self.model, _now(), text, done=final, **stats)

    def _final(self) -> dict[str, Any]:
        """The statistics Ollama puts in its final ``done`` record (durations in nanoseconds)."""
        generated = word_count(self.answer)
        return {
            "done_reason": self.reason,
            "total_duration": 1_000_000 + 1_000 * generated,
            "load_duration": 500_000,
            "prompt_eval_count": self.prompt_tokens,
            "prompt_eval_duration": 100_000,
            "eval_count": generated,
            "eval_duration": 1_000 * generated,
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
