"""The host telemetry sample: one reading of a machine's CPU, memory and GPUs.

The same shape travels in three places: ``gemmanet telemetry-agent`` serves it as JSON, a node
agent sends it in the ``telemetry`` field of its heartbeat, and the coordinator keeps a short
history of it per node. Every field except ``at`` is ``null`` where the machine has no such
thing (no GPU, no GTT on NVML). Sizes are in GB of 10^9 bytes, like ``vram_gb``; busy figures
are fractions 0..1.

A node is not trusted: ``parse_sample`` is how the coordinator reads a sample it did not make.
It refuses anything but an object of bounded finite numbers, within a small size, and never
raises, so a bad sample is dropped while the heartbeat carrying it still counts.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

from protocol.constraints import MAX_VRAM_GB

__all__ = ["MAX_SAMPLE_BYTES", "TelemetrySample", "encode_sample", "parse_sample"]

# A sample is nine numbers; anything much bigger is not one, and is refused before parsing.
MAX_SAMPLE_BYTES = 2048
# Unix seconds up to the year 5138: finite, so no inf or 1e308 reaches the history.
MAX_AT = 1e11

Fraction = Annotated[float, Meta(ge=0.0, le=1.0)]
# The same bound as a node's announced VRAM: a petabyte of anything is a lie.
Gigabytes = Annotated[float, Meta(ge=0.0, le=MAX_VRAM_GB)]
UnixSeconds = Annotated[float, Meta(ge=0.0, le=MAX_AT)]


class TelemetrySample(msgspec.Struct, frozen=True, kw_only=True):
    """One reading; ``None`` where the machine has no such thing."""

    at: UnixSeconds
    cpu_busy: Fraction | None = None
    memory_used_gb: Gigabytes | None = None
    memory_total_gb: Gigabytes | None = None
    gpu_busy: Fraction | None = None
    vram_used_gb: Gigabytes | None = None
    vram_total_gb: Gigabytes | None = None
    gtt_used_gb: Gigabytes | None = None
    gtt_total_gb: Gigabytes | None = None


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(TelemetrySample)


def encode_sample(sample: TelemetrySample) -> bytes:
    """The sample as JSON bytes, every field present (``null`` where unknown)."""
    return _encoder.encode(sample)


def parse_sample(data: bytes | bytearray | memoryview | msgspec.Raw) -> TelemetrySample | None:
    """The sample in ``data``, or None when it is not one (too big, not JSON, wrong types,
    out of range). Unknown fields are ignored, and never kept: only the known ones are
    re-encoded by ``encode_sample``."""
    raw = bytes(data)
    if len(raw) > MAX_SAMPLE_BYTES:
        return None
    try:
        return _decoder.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return None
