"""A fake OpenAI-compatible server: ``POST /v1/chat/completions`` (SSE ``chat.completion.chunk``
stream or one ``chat.completion`` object) and ``GET /v1/models``. Answers with the last user
message, word by word. With ``api_key`` set it demands ``Authorization: Bearer <key>``.

Run it alone with ``python -m tools.fakes.openai --port P [--api-key K]``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from collections.abc import AsyncIterator, Iterable
from typing import Any

import trio

from tools.fakes._server import FakeModelServer, Request, Response, serve_main, words

__all__ = ["FakeOpenAI", "main"]

_FINGERPRINT = "fp_fake0000"


def _error(message: str, kind: str, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


class FakeOpenAI(FakeModelServer):
    kind = "openai"

    def __init__(
        self,
        *,
        models: Iterable[str] | None = None,
        chunk_delay_s: float = 0.0,
        fail: str | None = None,
        api_key: str | None = None,
    ) -> None:
        super().__init__(models=models, chunk_delay_s=chunk_delay_s, fail=fail)
        self.api_key = api_key
        self._ids = itertools.count(1)

    async def handle(self, request: Request) -> Response:
        route = (request.method, request.path)
        if route == ("GET", "/v1/models"):
            names = sorted(self.models) if self.models is not None else []
            return Response(200, {"object": "list", "data": [_model(name) for name in names]})
        if route == ("POST", "/v1/chat/completions"):
            return self._chat(request)
        return Response(
            404,
            _error(
                f"Unknown request URL: {request.method} {request.path}",
                "invalid_request_error",
                "unknown_url",
            ),
        )

    def _authorized(self, request: Request) -> bool:
        return self.api_key is None or request.headers.get("authorization") == (
            f"Bearer {self.api_key}"
        )

    def _chat(self, request: Request) -> Response:
        try:
            body = request.json()
            if not isinstance(body, dict):
                raise TypeError("body is not an object")
        except (ValueError, TypeError):
            return Response(
                400,
                _error(
                    "We could not parse the JSON body of your request.", "invalid_request_error"
                ),
            )
        self.requests.append(body)
        self.authorizations.append(request.headers.get("authorization"))
        if not self._authorized(request):
            return Response(
                401,
                _error("Incorrect API key provided.", "invalid_request_error", "invalid_api_key"),
            )
        model = body.get("model")
        if not isinstance(model, str) or not model:
            return Response(
                400, _error("you must provide a model parameter", "invalid_request_error")
            )
        if not self.serves(model):
            return Response(
                404,
                _error(
                    f"The model `{model}` does not exist or you do not have access to it.",
                    "invalid_request_error",
                    "model_not_found",
                ),
            )
        prompt = _last_user_text(body.get("messages"))
        if prompt is None:
            return Response(
                400, _error("messages must contain a user message", "invalid_request_error")
            )
        if self.fail == "http":
            return Response(500, _error("fake openai: injected failure", "server_error"))
        completion_id = f"chatcmpl-fake{next(self._ids):06d}"
        created = int(time.time())
        pieces = words(prompt)
        if not body.get("stream", False):
            if self.fail in ("midstream", "truncate"):
                return Response(500, _error("fake openai: injected failure", "server_error"))
            self.completed += 1
            return Response(
                200,
                {
                    "id": completion_id,
                    "object": "chat.completion",
                    "created": created,
                    "model": model,
                    "system_fingerprint": _FINGERPRINT,
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": prompt, "refusal": None},
                            "logprobs": None,
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": _usage(prompt, pieces),
                },
            )
        stream = self._stream(completion_id, created, model, pieces)
        return Response(200, content_type="text/event-stream; charset=utf-8", stream=stream)

    async def _stream(
        self, completion_id: str, created: int, model: str, pieces: list[str]
    ) -> AsyncIterator[bytes]:
        def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
            return _event(
                {
                    "id": completion_id,
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": model,
                    "system_fingerprint": _FINGERPRINT,
                    "choices": [
                        {
                            "index": 0,
                            "delta": delta,
                            "logprobs": None,
                            "finish_reason": finish_reason,
                        }
                    ],
                }
            )

        yield chunk({"role": "assistant", "content": ""})
        for index, piece in enumerate(pieces):
            if index and self.chunk_delay_s > 0:
                await trio.sleep(self.chunk_delay_s)
            yield chunk({"content": piece})
            if self.fail == "midstream":
                yield _event(_error("fake openai: injected failure mid-stream", "server_error"))
                return
            if self.fail == "truncate":
                return
        yield chunk({}, "stop")
        yield b"data: [DONE]\n\n"


def _last_user_text(messages: Any) -> str | None:
    if not isinstance(messages, list):
        return None
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):  # content parts: [{"type": "text", "text": ...}]
                return "".join(
                    part.get("text", "")
                    for part in content
                    if isinstance(part, dict) and part.get("type") == "text"
                )
    return None


def _usage(prompt: str, pieces: list[str]) -> dict[str, int]:
    prompt_tokens = max(1, len(prompt) // 4)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": len(pieces),
        "total_tokens": prompt_tokens + len(pieces),
    }


def _model(name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": 1700000000, "owned_by": "fake"}


def _event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def main(argv: list[str] | None = None) -> int:
    def extra(parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--api-key", default=None, help="demand Authorization: Bearer KEY (default: no auth)"
        )

    def factory(args: argparse.Namespace) -> FakeModelServer:
        return FakeOpenAI(
            models=args.models,
            chunk_delay_s=args.chunk_delay_ms / 1000.0,
            fail=args.fail,
            api_key=args.api_key,
        )

    return serve_main(factory, argv, prog="python -m tools.fakes.openai", extra=extra)


if __name__ == "__main__":
    sys.exit(main())
