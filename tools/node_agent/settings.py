"""Validated settings of one node agent, parsed from command-line strings.

Parsing lives here (not in argparse ``type=`` hooks) so every bad value produces the same
one-line error whichever parser the flags were registered on.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

BACKENDS = ("echo", "ollama", "openai")
DEFAULT_OLLAMA_URL = "http://127.0.0.1:11434"
# llama.cpp's server default; vLLM's 8000 would collide with the coordinator's default port.
DEFAULT_OPENAI_URL = "http://127.0.0.1:8080"
DEFAULT_MAX_PARALLEL = 4
DEFAULT_DRAIN_S = 10.0
DEFAULT_BACKEND_CHECK_S = 5.0
DEFAULT_RECONNECT_MAX_S = 5.0
#: at most this many --coordinator flags
MAX_COORDINATORS = 64

# Limits of what a Hello may carry (protocol/constraints.py; the coordinator refuses a hello
# outside them with close 4002, so they are checked here, where a typo can still be named).
MAX_IDENTIFIER_LENGTH = 128
_IDENTIFIER_RE = re.compile(r"\A[A-Za-z0-9._:-]+\Z")
MAX_MODELS = 64
MAX_MODEL_NAME_LENGTH = 200
MAX_PARALLEL = 1024
MAX_TOKEN_LENGTH = 512
MAX_VRAM_GB = 1_000_000.0

_NUMBER = r"(\d+(?:\.\d*)?|\.\d+)"
_LATENCY_RE = re.compile(rf"^\s*{_NUMBER}\s*(?:-\s*{_NUMBER}\s*)?$")


class UsageError(ValueError):
    """A flag value is unusable; the message names the flag and fits on one line."""


@dataclass(frozen=True)
class Latency:
    """Artificial latency of the echo backend: fixed when ``min_ms == max_ms``."""

    min_ms: float = 0.0
    max_ms: float = 0.0

    def sample_s(self, rng: random.Random) -> float:
        if self.max_ms <= self.min_ms:
            return self.min_ms / 1000.0
        return rng.uniform(self.min_ms, self.max_ms) / 1000.0


def parse_latency(text: str) -> Latency:
    """``"N"`` or ``"MIN-MAX"`` (milliseconds, non-negative, MIN <= MAX)."""
    match = _LATENCY_RE.match(str(text))
    if match is None:
        raise UsageError(f"--latency-ms must be N or MIN-MAX milliseconds, got {text!r}")
    low = float(match.group(1))
    high = float(match.group(2)) if match.group(2) is not None else low
    if high < low:
        raise UsageError(f"--latency-ms range is empty: {text!r} (MIN must be <= MAX)")
    return Latency(low, high)


def coordinator_ws_url(base_url: str) -> str:
    """``http://h:p[/prefix]`` -> ``ws://h:p[/prefix]/ws/node`` (``https`` -> ``wss``)."""
    parts = urlsplit(str(base_url).strip())
    scheme = {"http": "ws", "https": "wss", "ws": "ws", "wss": "wss"}.get(parts.scheme.lower())
    if scheme is None or not parts.hostname:
        raise UsageError(
            f"--coordinator must be an http(s):// base URL like http://127.0.0.1:8000, "
            f"got {base_url!r}"
        )
    if parts.query or parts.fragment:
        raise UsageError(f"--coordinator must not carry a query or fragment, got {base_url!r}")
    try:
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        raise UsageError(f"--coordinator has an invalid port: {base_url!r}") from None
    path = parts.path.rstrip("/")
    if not path.endswith("/ws/node"):
        path += "/ws/node"
    return urlunsplit((scheme, parts.netloc, path, "", ""))


def _positive_int(flag: str, value: object) -> int:
    try:
        number = int(str(value).strip())
    except ValueError:
        raise UsageError(f"{flag} must be a positive integer, got {value!r}") from None
    if number < 1:
        raise UsageError(f"{flag} must be a positive integer, got {value!r}")
    return number


def _non_negative(flag: str, value: object, *, positive: bool = False) -> float:
    try:
        number = float(str(value).strip())
    except ValueError:
        number = math.nan
    if not math.isfinite(number) or number < 0 or (positive and number == 0):
        kind = "a positive number" if positive else "a non-negative number"
        raise UsageError(f"{flag} must be {kind}, got {value!r}")
    return number


@dataclass(frozen=True)
class NodeSettings:
    """Everything ``gemmanet node`` was told, validated."""

    coordinator_url: str
    ws_url: str
    node_id: str
    token: str
    models: tuple[str, ...]
    backend: str
    backend_url: str | None
    latency: Latency
    max_parallel: int
    vram_gb: float | None
    chunk_delay_s: float
    drain_s: float
    seed: int | None
    backend_check_s: float = DEFAULT_BACKEND_CHECK_S
    #: every --coordinator, as WebSocket URLs, in the order given (ws_url is the first)
    ws_urls: tuple[str, ...] = ()
    reconnect_max_s: float = DEFAULT_RECONNECT_MAX_S

    @classmethod
    def parse(
        cls,
        *,
        coordinator: object,
        node_id: object,
        token: object,
        models: object,
        backend: object = "echo",
        backend_url: object = None,
        latency_ms: object = "0",
        max_parallel: object = DEFAULT_MAX_PARALLEL,
        vram_gb: object = None,
        chunk_delay_ms: object = "0",
        drain_s: object = DEFAULT_DRAIN_S,
        seed: object = None,
        backend_check_s: object = DEFAULT_BACKEND_CHECK_S,
        reconnect_max_s: object = DEFAULT_RECONNECT_MAX_S,
    ) -> NodeSettings:
        given = [coordinator] if isinstance(coordinator, str) else list(coordinator or [])  # type: ignore[call-overload]
        if not given or not all(given):
            raise UsageError("--coordinator is required")
        if len(given) > MAX_COORDINATORS:
            raise UsageError(f"at most {MAX_COORDINATORS} --coordinator flags, got {len(given)}")
        ws_urls: list[str] = []
        for base in given:
            ws = coordinator_ws_url(str(base))
            if ws not in ws_urls:
                ws_urls.append(ws)
        ws_url = ws_urls[0]
        cap = _non_negative("--reconnect-max-s", reconnect_max_s, positive=True)
        if not 0.1 <= cap <= 3600:
            raise UsageError(
                f"--reconnect-max-s must be between 0.1 and 3600 seconds, got {reconnect_max_s!r}"
            )
        node = str(node_id or "").strip()
        if not node:
            raise UsageError("--node-id is required")
        if len(node) > MAX_IDENTIFIER_LENGTH or not _IDENTIFIER_RE.search(node):
            raise UsageError(
                f"--node-id must be 1-{MAX_IDENTIFIER_LENGTH} characters of A-Z a-z 0-9 . _ : -, "
                f"got {node_id!r}"
            )
        if not token:
            raise UsageError("--token (or GEMMANET_NODE_TOKEN) is required")
        if len(str(token)) > MAX_TOKEN_LENGTH:
            raise UsageError(f"--token is longer than {MAX_TOKEN_LENGTH} characters")
        names = [models] if isinstance(models, str) else list(models or [])  # type: ignore[call-overload]
        model_list: list[str] = []
        for name in names:
            name = str(name).strip()
            if not name:
                raise UsageError("--model must not be empty")
            if len(name) > MAX_MODEL_NAME_LENGTH:
                raise UsageError(f"--model is longer than {MAX_MODEL_NAME_LENGTH} characters")
            if name not in model_list:
                model_list.append(name)
        if not model_list:
            raise UsageError("at least one --model is required")
        if len(model_list) > MAX_MODELS:
            raise UsageError(f"at most {MAX_MODELS} --model flags, got {len(model_list)}")
        kind = str(backend or "").strip().lower()
        if kind not in BACKENDS:
            raise UsageError(f"--backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
        url: str | None = None
        if backend_url:
            url = str(backend_url).strip().rstrip("/")
            if urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).hostname:
                raise UsageError(f"--backend-url must be an http(s):// URL, got {backend_url!r}")
        elif kind == "ollama":
            url = DEFAULT_OLLAMA_URL
        elif kind == "openai":
            url = DEFAULT_OPENAI_URL
        vram = None if vram_gb is None else _non_negative("--vram-gb", vram_gb, positive=True)
        if vram is not None and vram > MAX_VRAM_GB:
            raise UsageError(f"--vram-gb must be at most {MAX_VRAM_GB:g}, got {vram_gb!r}")
        parallel = _positive_int("--max-parallel", max_parallel)
        if parallel > MAX_PARALLEL:
            raise UsageError(f"--max-parallel must be at most {MAX_PARALLEL}, got {max_parallel!r}")
        check_s = _non_negative("--backend-check-s", backend_check_s, positive=True)
        if not 0.1 <= check_s <= 3600:
            raise UsageError(
                f"--backend-check-s must be between 0.1 and 3600 seconds, got {backend_check_s!r}"
            )
        seed_value: int | None = None
        if seed is not None:
            try:
                seed_value = int(str(seed).strip())
            except ValueError:
                raise UsageError(f"--seed must be an integer, got {seed!r}") from None
        return cls(
            coordinator_url=str(given[0]),
            ws_url=ws_url,
            node_id=node,
            token=str(token),
            models=tuple(model_list),
            backend=kind,
            backend_url=url,
            latency=parse_latency(str(latency_ms if latency_ms is not None else "0")),
            max_parallel=parallel,
            vram_gb=vram,
            chunk_delay_s=_non_negative("--chunk-delay-ms", chunk_delay_ms or 0) / 1000.0,
            drain_s=_non_negative("--drain-s", DEFAULT_DRAIN_S if drain_s is None else drain_s),
            seed=seed_value,
            backend_check_s=check_s,
            ws_urls=tuple(ws_urls),
            reconnect_max_s=cap,
        )
