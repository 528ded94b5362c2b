"""What a task asks of a model and what it reports back, protocol v2.

A task carries either a conversation (``messages``: role and text, in order) or one raw
``prompt``, plus ``Options``: the sampling controls that Ollama's and OpenAI's chat APIs share.
A result carries ``Usage`` (tokens as the model server counted them), a finish reason and
``Timings``. Every field is bounded here, so a peer's garbage is refused when decoded and the
HTTP API can check a client's request against the very same limits before placing it.

A node that speaks only protocol v1 takes one prompt string: ``transcript`` writes a
conversation out as the v1 fallback (``role: content`` lines and a last ``assistant:`` cue).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

__all__ = [
    "ANSWER_CUE",
    "FINISH_REASONS",
    "MAX_MESSAGES",
    "MAX_STOP_LENGTH",
    "MAX_STOP_STRINGS",
    "MAX_TOKENS_LIMIT",
    "ROLES",
    "FinishReason",
    "MaxTokens",
    "Message",
    "Messages",
    "Options",
    "Penalty",
    "Seed",
    "StopList",
    "StopString",
    "Temperature",
    "Timings",
    "TopK",
    "TopP",
    "Usage",
    "transcript",
]

#: The most messages one task carries. Beyond it a client gets 400 before anything is placed.
#: Long agent conversations stay well under it; a thousand turns is a client looping.
MAX_MESSAGES = 512
#: Stop strings of one task, and the length of each (OpenAI takes 4, Ollama any number).
MAX_STOP_STRINGS = 16
MAX_STOP_LENGTH = 200
#: A generation bound above any model's context today; keeps the number an int32 for servers.
MAX_TOKENS_LIMIT = 1_048_576
MAX_TOP_K = 1_000_000
MAX_SEED = 2**63 - 1

#: Roles of a message on the wire. OpenAI's ``function`` role arrives as ``tool``; ``developer``
#: is OpenAI's newer name for ``system`` (sent as ``system`` to servers that lack it).
Role = Literal["system", "developer", "user", "assistant", "tool"]
ROLES: tuple[str, ...] = ("system", "developer", "user", "assistant", "tool")

#: Why the generation ended: ``stop`` (the model's end or a stop string), ``length`` (the
#: token bound), ``content_filter`` (the server withheld the rest).
FinishReason = Literal["stop", "length", "content_filter"]
FINISH_REASONS: tuple[str, ...] = ("stop", "length", "content_filter")

TokenCount = Annotated[int, Meta(ge=0, le=2**53 - 1)]
Seconds = Annotated[float, Meta(ge=0, le=86_400.0)]


class Message(msgspec.Struct, frozen=True, kw_only=True):
    """One turn of a conversation; text only (image parts are refused at the edge)."""

    role: Role
    content: str


Messages = Annotated[list[Message], Meta(min_length=1, max_length=MAX_MESSAGES)]
StopString = Annotated[str, Meta(min_length=1, max_length=MAX_STOP_LENGTH)]


# The option ranges, as types the HTTP APIs decode their requests with too (one set of limits).
MaxTokens = Annotated[int, Meta(ge=1, le=MAX_TOKENS_LIMIT)]
Temperature = Annotated[float, Meta(ge=0.0, le=2.0)]
TopP = Annotated[float, Meta(ge=0.0, le=1.0)]
TopK = Annotated[int, Meta(ge=1, le=MAX_TOP_K)]
StopList = Annotated[list[StopString], Meta(max_length=MAX_STOP_STRINGS)]
Seed = Annotated[int, Meta(ge=-MAX_SEED - 1, le=MAX_SEED)]
Penalty = Annotated[float, Meta(ge=-2.0, le=2.0)]


class Options(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Sampling controls; ``None`` leaves the model server's default. The ranges are those
    both APIs accept (OpenAI's where they differ), so no backend sees a value it refuses."""

    max_tokens: MaxTokens | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    stop: StopList | None = None
    seed: Seed | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    #: "json": the answer is one JSON object. With ``json_schema`` it follows that schema.
    format: Literal["text", "json"] | None = None
    json_schema: dict[str, Any] | None = None

    def is_empty(self) -> bool:
        return self == _NO_OPTIONS


_NO_OPTIONS = Options()


class Usage(msgspec.Struct, frozen=True, kw_only=True):
    """Tokens as the model server counted them (the echo backend counts words)."""

    prompt_tokens: TokenCount
    completion_tokens: TokenCount

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class Timings(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Measured by the node on its own clock: from the assign to the first output
    (``ttft_s``; None when there was no output) and to the end (``total_s``)."""

    total_s: Seconds
    ttft_s: Seconds | None = None


ANSWER_CUE = "assistant:"


def transcript(messages: list[Message]) -> str:
    """The v1 fallback: ``<role>: <content>`` lines joined with "\\n", then ``assistant:``.
    A content holding "\\nuser: …" reads like another turn: a convention, not a boundary."""
    return "\n".join([*(f"{m.role}: {m.content}" for m in messages), ANSWER_CUE])
