"""OpenAI request bodies translated into a task: the messages, the sampling options, and a
clear 400 for what cannot be honoured. Pure functions.

* Messages keep their roles and order (``function`` arrives as ``tool``). A content is a
  string, a list of ``text`` parts (joined with "\\n"), or null (the empty string); any other
  part (``image_url``, ``input_audio``, …) is 400 ``unsupported_content`` naming the message
  and part.
* Options: ``max_completion_tokens`` (or the older ``max_tokens``), ``temperature``, ``top_p``,
  ``top_k`` (an extension vLLM shares), ``stop`` (a string or a list), ``seed``,
  ``presence_penalty``, ``frequency_penalty``, ``response_format`` (``text``, ``json_object``,
  ``json_schema``). Their ranges are checked when the body is decoded (422).
* Parameters a node cannot honour are refused with 400 ``unsupported_parameter`` naming the
  parameter (``n`` above 1, ``tools``, ``functions``, ``logprobs``, ``top_logprobs``,
  ``logit_bias``, ``audio``, ``prediction``; for completions also ``echo``, ``suffix``,
  ``best_of`` above 1 and a list of several prompts). Anything else unknown is ignored, as
  OpenAI clients send many optional fields (``user``, ``metadata``, ``store``, …).
"""

from __future__ import annotations

from typing import Any

from coordinator.api.openai.schemas import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    ContentPart,
    ResponseFormat,
)
from coordinator.errors import UnsupportedContent, UnsupportedParameter
from protocol import Message, Options

__all__ = ["chat_messages", "completion_prompt", "content_text", "options_of"]

PART_SEPARATOR = "\n"


def content_text(content: str | list[ContentPart] | None, *, message_index: int) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts: list[str] = []
    for part_index, part in enumerate(content):
        where = f"messages[{message_index}].content[{part_index}]"
        if part.type != "text":
            raise UnsupportedContent(
                f"{where} has type {part.type!r}; only 'text' parts can be sent to a node"
            )
        if part.text is None:
            raise UnsupportedContent(f"{where} is a 'text' part without a 'text' string")
        texts.append(part.text)
    return PART_SEPARATOR.join(texts)


def chat_messages(messages: list[ChatMessage]) -> list[Message]:
    return [
        Message(
            role="tool" if m.role == "function" else m.role,
            content=content_text(m.content, message_index=i),
        )
        for i, m in enumerate(messages)
    ]


def completion_prompt(body: CompletionRequest) -> str:
    prompt = body.prompt
    if isinstance(prompt, str):
        return prompt
    if len(prompt) != 1:
        raise UnsupportedParameter(
            "prompt", f"'prompt' is a list of {len(prompt)} prompts; send one per request"
        )
    return prompt[0]


def _refuse(param: str, why: str) -> None:
    raise UnsupportedParameter(param, f"'{param}' {why}; this API cannot honour it")


def _check_common(body: ChatCompletionRequest | CompletionRequest) -> None:
    if body.n is not None and body.n != 1:
        _refuse("n", f"asks for {body.n} choices; a node answers with one")
    if body.logit_bias:
        _refuse("logit_bias", "biases tokens")
    for name in ("audio", "prediction"):
        if getattr(body, name, None) is not None:
            _refuse(name, "is set")


def options_of(body: ChatCompletionRequest | CompletionRequest) -> Options:
    """The task's options; raises UnsupportedParameter for what a node cannot honour."""
    _check_common(body)
    if isinstance(body, ChatCompletionRequest):
        if body.tools or body.functions:
            _refuse("tools" if body.tools else "functions", "asks for tool calls")
        if body.logprobs:
            _refuse("logprobs", "asks for log probabilities")
        if body.top_logprobs is not None:
            _refuse("top_logprobs", "asks for log probabilities")
        max_tokens = body.max_completion_tokens or body.max_tokens
    else:
        if body.logprobs is not None:
            _refuse("logprobs", "asks for log probabilities")
        if body.echo:
            _refuse("echo", "asks for the prompt back")
        if body.suffix:
            _refuse("suffix", "asks for an insertion")
        if body.best_of is not None and body.best_of != 1:
            _refuse("best_of", f"asks for the best of {body.best_of}")
        max_tokens = body.max_tokens
    stop = [body.stop] if isinstance(body.stop, str) else body.stop
    response_format: dict[str, Any] = {}
    if isinstance(body, ChatCompletionRequest) and body.response_format is not None:
        response_format = _format(body.response_format)
    return Options(
        max_tokens=max_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=body.top_k,
        stop=stop or None,
        seed=body.seed,
        presence_penalty=body.presence_penalty,
        frequency_penalty=body.frequency_penalty,
        **response_format,
    )


def _format(response_format: ResponseFormat) -> dict[str, Any]:
    if response_format.type == "text":
        return {}
    if response_format.type == "json_object":
        return {"format": "json"}
    spec = response_format.json_schema
    if spec is None or spec.schema_ is None:
        raise UnsupportedParameter(
            "response_format",
            "'response_format' of type 'json_schema' needs 'json_schema.schema'",
        )
    return {"format": "json", "json_schema": spec.schema_}
