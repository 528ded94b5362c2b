"""What a model server is asked to do and what it says at the end, in one shape for every
caller: the node agent's backends and the coordinator's direct hosts.

A generation is an async iterator of ``str`` output deltas followed by at most one ``Finish``
(the usage and finish reason the server reported). Pure data; the wire formats are in
``ollama_wire`` and ``openai_wire``.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from protocol.conversation import FinishReason, Message, Options, Usage
from protocol.envelopes import Assign, BusAssign

__all__ = ["Finish", "Generation"]


@dataclass(frozen=True, slots=True)
class Generation:
    """One task's content: ``prompt`` or ``messages`` (exactly one), and ``options``."""

    model: str
    prompt: str | None = None
    messages: tuple[Message, ...] | None = None
    options: Options | None = None
    stream: bool = False

    @classmethod
    def of(cls, envelope: Assign | BusAssign) -> Generation:
        messages = envelope.messages
        options = envelope.options
        return cls(
            model=envelope.model,
            prompt=envelope.prompt,
            messages=None if messages is msgspec.UNSET else tuple(messages),
            options=None if options is msgspec.UNSET else options,
            stream=envelope.stream,
        )

    @property
    def input_text(self) -> str:
        """The text the model reads, without roles (what the echo backend counts)."""
        if self.messages is not None:
            return "\n".join(m.content for m in self.messages)
        return self.prompt or ""


@dataclass(frozen=True, slots=True)
class Finish:
    """The last item of a generation: what the model server reported (None: not said)."""

    usage: Usage | None = None
    finish_reason: FinishReason | None = None
