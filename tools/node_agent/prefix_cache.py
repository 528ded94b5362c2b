"""A model server's prefix cache, modelled on the echo backend (for benchmarks).

Ollama and llama.cpp keep the KV cache of their recent conversations: a prompt that begins
like one of them is read only from where it differs. ``PrefixCachedEcho`` answers like the
echo backend, after a delay of ``ms_per_token`` for every prompt token (a word) not in its
cache: an LRU of the ``entries`` most recent prompts, each with the answer the node gave
(the next turn of a chat sends it back). Nothing else changes: a restart forgets the cache.

Set ``GEMMANET_ECHO_PREFIX_CACHE=MS_PER_TOKEN[,ENTRIES]`` (default 4 entries) for a node agent
with ``--backend echo``; ``GEMMANET_ECHO_PREFIX_CACHE_LOG=FILE`` appends one JSON line per task
there, ``{"prompt_tokens": T, "read_tokens": R}`` (what tools/bench/affinity.py adds up).
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Mapping, Sequence

import trio

from protocol import transcript
from protocol.model_servers import Finish, Generation
from tools.node_agent.backends import Backend, EchoBackend, echo_answer
from tools.node_agent.settings import UsageError

__all__ = ["CACHE_LOG_VARIABLE", "CACHE_VARIABLE", "PrefixCache", "PrefixCachedEcho", "from_env"]

CACHE_VARIABLE = "GEMMANET_ECHO_PREFIX_CACHE"
CACHE_LOG_VARIABLE = "GEMMANET_ECHO_PREFIX_CACHE_LOG"
DEFAULT_ENTRIES = 4


def _common(a: Sequence[str], b: Sequence[str]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class PrefixCache:
    """The ``entries`` most recent token sequences, most recent last."""

    def __init__(self, entries: int = DEFAULT_ENTRIES) -> None:
        if entries < 1:
            raise ValueError(f"entries must be at least 1, got {entries!r}")
        self.entries = entries
        self._held: list[tuple[str, ...]] = []

    def read(self, prompt: Sequence[str], answer: Sequence[str]) -> int:
        """How many of ``prompt``'s tokens must be read (those after its longest prefix in
        the cache); the prompt and its answer become the most recent entry (replacing the
        entry it continued, if any)."""
        best, at = 0, None
        for i, held in enumerate(self._held):
            common = _common(held, prompt)
            if common > best:
                best, at = common, i
        if at is not None and best == len(self._held[at]):
            del self._held[at]  # continued: the slot now holds the longer conversation
        self._held.append((*prompt, *answer))
        if len(self._held) > self.entries:
            del self._held[0]
        return len(prompt) - best


class PrefixCachedEcho:
    """The echo backend behind a prefix cache: its first output comes after the cost of the
    prompt tokens not cached."""

    def __init__(
        self, inner: EchoBackend, ms_per_token: float, entries: int, log_path: str | None
    ) -> None:
        self.name = inner.name
        self._inner = inner
        self.ms_per_token = ms_per_token
        self.cache = PrefixCache(entries)
        # Line-buffered: each task's line is in the file when its answer is.
        self._log = open(log_path, "a", buffering=1, encoding="utf-8") if log_path else None  # noqa: SIM115

    async def generate(self, request: Generation) -> AsyncIterator[str | Finish]:
        text = request.prompt if request.messages is None else transcript(list(request.messages))
        prompt = (text or "").split()
        answer, _ = echo_answer(request)
        read = self.cache.read(prompt, answer.split())
        if self._log is not None:
            self._log.write(json.dumps({"prompt_tokens": len(prompt), "read_tokens": read}) + "\n")
        await trio.sleep(read * self.ms_per_token / 1000)
        async for item in self._inner.generate(request):
            yield item

    async def resident(self, models: tuple[str, ...]) -> list[str] | None:
        return await self._inner.resident(models)

    async def check(self) -> list[str] | None:
        return await self._inner.check()

    async def aclose(self) -> None:
        if self._log is not None:
            self._log.close()
        await self._inner.aclose()


def from_env(inner: Backend, env: Mapping[str, str] | None = None) -> Backend:
    """An echo ``inner`` behind a prefix cache when ``GEMMANET_ECHO_PREFIX_CACHE`` is set;
    else ``inner`` itself. A bad value is a UsageError."""
    env = os.environ if env is None else env
    raw = env.get(CACHE_VARIABLE, "").strip()
    if not raw or not isinstance(inner, EchoBackend):
        return inner
    cost, _, entries = raw.partition(",")
    try:
        ms_per_token, count = float(cost), int(entries or DEFAULT_ENTRIES)
    except ValueError:
        ms_per_token, count = -1.0, 0
    if not ms_per_token >= 0 or count < 1:
        raise UsageError(
            f"{CACHE_VARIABLE}={raw!r} must be MS_PER_TOKEN[,ENTRIES] (a cost >= 0, entries >= 1)"
        )
    return PrefixCachedEcho(inner, ms_per_token, count, env.get(CACHE_LOG_VARIABLE) or None)
