"""The delta events of a stream (coordinator/api/sse.py) are, byte for byte, msgspec's
encoding of the whole event, whatever the text and in any order of lengths (the buffer they
are written through is reused from one chunk to the next)."""

from __future__ import annotations

import pytest

from coordinator.api.openai.schemas import ChunkChoice, ChunkDelta, TextChoice
from coordinator.api.openai.streams import ChatChunks, TextChunks
from coordinator.api.schemas import DeltaEvent
from coordinator.api.sse import DeltaFrames, sse

TEXTS = [
    "a ",
    "",
    'quote " and backslash \\ and slash /',
    "new\nline\ttab\r\x00\x1f\x7f",
    "é ünïcode ✓ 🎉 \u2028\u2029",
    "x" * 70_000,  # grows the buffer
    "b",  # then a short one after the long one
    "\x00gemmanet-delta-text\x00",  # the marker itself, as a text
]


def test_native_deltas_are_the_encoded_events() -> None:
    frames = DeltaFrames(lambda text: DeltaEvent(delta=text))
    for text in TEXTS:
        assert frames(text) == sse(DeltaEvent(delta=text)), text[:40]


@pytest.mark.parametrize("include_usage", [False, True])
@pytest.mark.parametrize("chunks_class", [ChatChunks, TextChunks])
def test_openai_deltas_are_the_encoded_chunks(
    chunks_class: type[ChatChunks | TextChunks], include_usage: bool
) -> None:
    chunks = chunks_class("org/model:1b", 1_700_000_000, include_usage)
    frames = chunks.deltas("t-0123")
    for text in TEXTS:
        assert frames(text) == chunks._chunk("t-0123", _choices(chunks, text), None), text[:40]


def test_a_model_named_like_the_marker_still_gets_right_chunks() -> None:
    chunks = ChatChunks("\x00gemmanet-delta-text\x00", 1, False)
    frames = chunks.deltas("t-1")
    for text in TEXTS:
        assert frames(text) == chunks._chunk("t-1", _choices(chunks, text), None)


def _choices(chunks: ChatChunks | TextChunks, text: str) -> list[ChunkChoice] | list[TextChoice]:
    if isinstance(chunks, ChatChunks):
        return [ChunkChoice(delta=ChunkDelta(content=text))]
    return [TextChoice(text=text)]
