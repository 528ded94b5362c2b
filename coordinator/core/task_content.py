"""What a task carries to its node, decided once: whether it fits, and in which shape.

A task carries a raw prompt or a conversation (protocol v2 ``messages``), and sampling options.
The requester checks the size before placing it (``check_content_fits``); the owner writes the
assign for the connection's protocol version (``assign_for``): a v2 node gets the messages and
options as they are, a v1 node the conversation's transcript and no options (it could not read
them). Pure functions.
"""

from __future__ import annotations

import msgspec

from coordinator.errors import PayloadTooLarge
from protocol import (
    MAX_PROMPT_BYTES,
    Assign,
    BusAssign,
    Message,
    Options,
    stamped,
    task_content_bytes,
    transcript,
)

__all__ = ["assign_for", "bus_assign_for", "check_content_fits"]


def check_content_fits(
    prompt: str | None, messages: list[Message] | None = None, options: Options | None = None
) -> None:
    """Refuse, before placing it, a task whose assign a node (or a peer instance's bus) would
    refuse: sent anyway, it would close the node's connection and fail every task on it."""
    size = task_content_bytes(prompt, messages, options)
    if size > MAX_PROMPT_BYTES:
        what = "prompt" if messages is None else "conversation"
        raise PayloadTooLarge(
            f"{what} is {size:,} bytes (UTF-8, JSON-escaped, options included); at most"
            f" {MAX_PROMPT_BYTES:,} bytes fit in a task sent to a node"
        )


def bus_assign_for(assign: Assign, node_id: str, conn_id: str, *, reply_to: str) -> BusAssign:
    """The bus.assign that hands ``assign`` to the owner of ``conn_id`` (versioned by what
    it carries, so an owner of either version reads a prompt-only one)."""
    return stamped(
        BusAssign(
            task_id=assign.task_id,
            node_id=node_id,
            conn_id=conn_id,
            model=assign.model,
            prompt=assign.prompt,
            stream=assign.stream,
            timeout_s=assign.timeout_s,
            reply_to=reply_to,
            messages=assign.messages,
            options=assign.options,
        )
    )


def assign_for(protocol: int, envelope: BusAssign) -> Assign:
    """The assign a node speaking ``protocol`` gets for ``envelope``."""
    if protocol >= 2:
        return stamped(
            Assign(
                task_id=envelope.task_id,
                model=envelope.model,
                prompt=envelope.prompt,
                stream=envelope.stream,
                timeout_s=envelope.timeout_s,
                messages=envelope.messages,
                options=envelope.options,
            )
        )
    # v1: one prompt string. The options are dropped: a v1 node would refuse the envelope.
    prompt = envelope.prompt
    if envelope.messages is not msgspec.UNSET:
        prompt = transcript(envelope.messages)
    return Assign(
        task_id=envelope.task_id,
        model=envelope.model,
        prompt=prompt if prompt is not None else "",
        stream=envelope.stream,
        timeout_s=envelope.timeout_s,
    )
