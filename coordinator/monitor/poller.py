"""One poll of one direct host, bounded by the poll timeout, as the record the monitor writes.

Ollama: ``GET /api/ps`` (the models loaded in memory, ``size`` in bytes) and ``GET
/api/tags`` (the models it has). OpenAI-compatible: ``GET /v1/models``; an answer is the
health check, and such a server does not say what is loaded, so ``resident`` stays empty.
Each request carries the host's API key (``api_key_file``) when it has one. A host that does
not answer in time, answers with an error, or answers nonsense is
``reachable: false`` with an ``error``: a fact too (placement must not use it). An answer is read
as sent (asked for unencoded) and to ``MAX_BODY_BYTES`` (1 MiB, ``protocol/model_servers/``) at
most, an error answer not at all: a host cannot make its monitor hold more than that.
"""

from __future__ import annotations

from typing import Any

import httpx
import trio

from coordinator.capacity import HostSpec
from protocol.model_servers import MAX_BODY_BYTES, UNENCODED, encoded, load_json, whole_body

__all__ = ["poll_host"]

_GB = 1e9


class _BadAnswer(Exception):
    pass


async def _get_json(client: httpx.AsyncClient, url: str, auth: dict[str, str]) -> Any:
    async with client.stream("GET", url, headers={**UNENCODED, **auth}) as response:
        if response.status_code != 200:
            where = url.rsplit("/", 2)[-2:]
            raise _BadAnswer(f"GET {where} answered HTTP {response.status_code}")
        if encoded(response.headers.get("content-encoding")):
            raise _BadAnswer("the answer came compressed, none was asked for")
        body = await whole_body(response.aiter_bytes())
    if body is None:
        raise _BadAnswer(f"the answer is longer than {MAX_BODY_BYTES:,} bytes")
    try:
        return load_json(body)  # too deep a nesting too, which would crash the monitor
    except ValueError:
        raise _BadAnswer("the answer is not JSON") from None


def _names(answer: Any, list_key: str, name_key: str) -> list[dict[str, Any]]:
    items = answer.get(list_key) if isinstance(answer, dict) else None
    if not isinstance(items, list):
        raise _BadAnswer(f"the answer has no {list_key!r} list")
    return [i for i in items if isinstance(i, dict) and isinstance(i.get(name_key), str)]


async def _ollama(
    client: httpx.AsyncClient, base: str, auth: dict[str, str]
) -> tuple[dict[str, float], list[str]]:
    loaded = _names(await _get_json(client, base + "/api/ps", auth), "models", "name")
    tags = _names(await _get_json(client, base + "/api/tags", auth), "models", "name")
    resident = {}
    for entry in loaded:
        size = entry.get("size")
        if isinstance(size, int | float) and not isinstance(size, bool) and size >= 0:
            resident[entry["name"]] = round(size / _GB, 3)
    return resident, sorted({entry["name"] for entry in tags} | set(resident))


async def _openai(
    client: httpx.AsyncClient, base: str, auth: dict[str, str]
) -> tuple[dict[str, float], list[str]]:
    models = _names(await _get_json(client, base + "/v1/models", auth), "data", "id")
    return {}, sorted({entry["id"] for entry in models})


async def poll_host(
    client: httpx.AsyncClient, host_id: str, spec: HostSpec, timeout_s: float
) -> dict[str, Any]:
    """The host's record (``epoch`` is added by the writer, ``polled_at`` by the store)."""
    record: dict[str, Any] = {"host_id": host_id, "kind": spec.kind, "reachable": False}
    record |= {"resident": {}, "models": []}
    error = f"no answer within the poll timeout ({timeout_s:g} s)"
    with trio.move_on_after(timeout_s):
        try:
            poll = _ollama if spec.kind == "ollama" else _openai
            resident, models = await poll(client, spec.url, spec.auth_headers())
        except httpx.HTTPError as exc:
            error = f"{type(exc).__name__}: {exc}"[:200]
        except _BadAnswer as exc:
            error = str(exc)
        else:
            record |= {"reachable": True, "resident": resident, "models": models}
            return record
    record["error"] = error
    return record
