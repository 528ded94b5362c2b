"""The prompt a node gets for an OpenAI chat request. Pure and deterministic.

Nodes take one prompt string (protocol v1's ``Assign``), not a list of messages, so the
messages are written out as a transcript and the model is asked to continue it:

    <role>: <content>          one per message, in order, joined with "\\n"
    assistant:                 last line, no trailing space

A message's content is a string as is; a list of parts is the texts of its ``text`` parts
joined with "\\n"; null is the empty string. Any other part type (``image_url``, …) is refused
with 400 ``unsupported_content`` naming the message and part. Nothing is trimmed or escaped, so
a content holding "\\nuser: …" reads like another turn: the transcript is a convention, not a
boundary (documented in docs/interface.md).
"""

from __future__ import annotations

from coordinator.api.openai_schemas import ChatMessage, ContentPart
from coordinator.errors import UnsupportedContent

PART_SEPARATOR = "\n"
MESSAGE_SEPARATOR = "\n"
ANSWER_CUE = "assistant:"


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


def build_prompt(messages: list[ChatMessage]) -> str:
    lines = [
        f"{message.role}: {content_text(message.content, message_index=i)}"
        for i, message in enumerate(messages)
    ]
    return MESSAGE_SEPARATOR.join([*lines, ANSWER_CUE])
