"""A fake OpenAI-compatible server: ``POST /v1/chat/completions`` (SSE ``chat.completion.chunk``
stream or one ``chat.completion`` object), ``POST /v1/completions`` (SSE or one
``text_completion``) and ``GET /v1/models``. With ``api_key`` set it demands ``Authorization:
Bearer <key>`` on every route, the model list included (as OpenAI does).

A chat answers with the content of the last user message, a completion with the prompt, word by
word, honouring ``max_tokens`` and ``stop``; with ``stream_options.include_usage`` the stream
ends with the usage chunk (no choices), words counted as tokens. Every request body is checked
against the ``openai`` SDK's request types (``_openai_types``): a body they refuse gets 400 and
lands in ``refused``.

Run it alone with ``python -m tools.fakes.openai --port P [--api-key K]``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import trio

from tools.fakes._server import (
    FakeModelServer,
    Request,
    Response,
    answer_of,
    serve_main,
    word_count,
    words,
)

if TYPE_CHECKING:
    from tools.fakes._checks import Problem

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
        lists_models: bool = True,
    ) -> None:
        super().__init__(models=models, chunk_delay_s=chunk_delay_s, fail=fail)
        self.api_key = api_key
        #: False: ``GET /v1/models`` is an unknown URL (404), as on servers that serve only
        #: the completion routes
        self.lists_models = lists_models
        self._ids = itertools.count(1)

    def prepare(self) -> None:
        from tools.fakes import _openai_types  # noqa: F401 - loads the SDK's types

    async def handle(self, request: Request) -> Response:
        route = (request.method, request.path)
        if route == ("GET", "/v1/models") and self.lists_models:
            if not self._authorized(request):
                return _unauthorized()
            names = sorted(self.models) if self.models is not None else []
            return Response(200, {"object": "list", "data": [_model(name) for name in names]})
        if route in (("POST", "/v1/chat/completions"), ("POST", "/v1/completions")):
            return self._generation(request)
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

    def _generation(self, request: Request) -> Response:
        from tools.fakes import _openai_types as types
        from tools.fakes._checks import Problem

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
        self.record(request, body)
        if not self._authorized(request):
            return _unauthorized()
        chat = request.path == "/v1/chat/completions"
        try:
            params = types.check_chat(body) if chat else types.check_completion(body)
        except Problem as problem:
            self.refuse(problem.message)
            return Response(400, _refusal(problem))
        model = params["model"]
        if not self.serves(model):
            return Response(
                404,
                _error(
                    f"The model `{model}` does not exist or you do not have access to it.",
                    "invalid_request_error",
                    "model_not_found",
                ),
            )
        if self.fail == "http":
            return Response(500, _error("fake openai: injected failure", "server_error"))
        question = _question(params, chat)
        if question is None:
            return Response(
                400, _error("this fake takes one prompt string", "invalid_request_error")
            )
        asked, contents = question
        stop = params.get("stop")
        answer, reason = answer_of(
            asked,
            max_tokens=params.get("max_tokens"),
            stop=[stop] if isinstance(stop, str) else stop,
        )
        prefix = "chatcmpl" if chat else "cmpl"
        head = {
            "id": f"{prefix}-fake{next(self._ids):06d}",
            "created": int(time.time()),
            "model": model,
            "system_fingerprint": _FINGERPRINT,
        }
        counted = types.usage(word_count(*contents), word_count(answer))
        if params.get("stream") is not True:
            if self.fail in ("midstream", "truncate"):
                return Response(500, _error("fake openai: injected failure", "server_error"))
            self.completed += 1
            whole = types.chat_completion_body if chat else types.completion_body
            return Response(200, whole(head, answer, reason, counted))
        with_usage = bool((params.get("stream_options") or {}).get("include_usage"))
        reply = _Reply(head, chat, answer, reason, counted if with_usage else None)
        return Response(
            200, content_type="text/event-stream; charset=utf-8", stream=self._stream(reply)
        )

    async def _stream(self, reply: _Reply) -> AsyncIterator[bytes]:
        if reply.chat:
            yield _event(reply.chunk({"role": "assistant", "content": ""}))
        for index, piece in enumerate(words(reply.answer)):
            if index and self.chunk_delay_s > 0:
                await trio.sleep(self.chunk_delay_s)
            yield _event(reply.chunk({"content": piece} if reply.chat else piece))
            if self.fail == "midstream":
                yield _event(_error("fake openai: injected failure mid-stream", "server_error"))
                return
            if self.fail == "truncate":
                return
        yield _event(reply.chunk({} if reply.chat else "", reply.reason))
        if reply.usage is not None:
            yield _event(reply.last())
        yield b"data: [DONE]\n\n"


@dataclass(frozen=True)
class _Reply:
    head: dict[str, Any]
    chat: bool
    answer: str
    reason: str
    #: None: the client did not ask for the usage chunk
    usage: dict[str, Any] | None

    def chunk(self, delta: dict[str, Any] | str, reason: str | None = None) -> dict[str, Any]:
        from tools.fakes import _openai_types as types

        with_usage = self.usage is not None
        if isinstance(delta, dict):
            return types.chat_chunk(self.head, delta, reason, with_usage=with_usage)
        return types.completion_chunk(self.head, delta, reason, with_usage=with_usage)

    def last(self) -> dict[str, Any]:
        from tools.fakes import _openai_types as types

        assert self.usage is not None
        return types.usage_chunk(self.head, self.usage, chat=self.chat)


def _question(params: dict[str, Any], chat: bool) -> tuple[str, list[str]] | None:
    """What to answer (the last user message, or the prompt) and every text the prompt's
    tokens are counted in; None for a prompt of token ids or of several strings."""
    if chat:
        messages = params["messages"]
        users = [_text(m.get("content")) for m in messages if m["role"] == "user"]
        return (users[-1] if users else ""), [_text(m.get("content")) for m in messages]
    prompt = params["prompt"]
    return (prompt, [prompt]) if isinstance(prompt, str) else None


def _text(content: Any) -> str:
    """A message's text: a string, or its text parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: [{"type": "text", "text": ...}]
        return "".join(
            part.get("text", "")
            for part in content
            if isinstance(part, dict) and part.get("type") == "text"
        )
    return ""


def _refusal(problem: Problem) -> dict[str, Any]:
    """A 400 as OpenAI words it."""
    if problem.kind == "extra_forbidden":
        message = f"Unrecognized request argument supplied: {problem.loc}"
    elif problem.kind == "missing":
        message = f"Missing required parameter: '{problem.loc}'."
    else:
        message = f"Invalid value for '{problem.loc}': {problem.detail}"
    error = _error(message, "invalid_request_error")
    error["error"]["param"] = problem.loc or None
    return error


def _unauthorized() -> Response:
    error = _error("Incorrect API key provided.", "invalid_request_error", "invalid_api_key")
    return Response(401, error)


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
