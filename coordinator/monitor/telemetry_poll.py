"""The primary monitor's polls of the telemetry agents the operator file names.

A node entry may say where its machine's ``gemmanet telemetry-agent`` answers
(``telemetry_url`` under ``[nodes."ID"]``), and so may a direct host's (under ``[hosts."ID"]``;
it wins over a ``[nodes]`` entry of the same id, which older files used for hosts). While its
candidate is primary, the monitor fetches every such URL once per
``GEMMANET_TELEMETRY_INTERVAL_S`` (all at once, each bounded by the poll timeout) and appends what ``protocol.parse_sample`` accepts to the node's history in the shared
store — the same history agent nodes fill through their heartbeats, read by
``/api/v1/nodes`` and ``/api/v1/nodes/{id}/telemetry``.

This runs beside the fenced fact loop, never inside it: a slow agent cannot delay a fact write
or a lease renewal (the timing bound counts host polls only). Telemetry is read-only: it never
changes a budget, a fact or placement, and an agent that cannot be reached loses a sample,
nothing else. Only the primary polls, so an agent is asked once per interval, not once per
candidate.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import httpx
import trio

from coordinator.coordination.base import CoordinationUnavailable
from coordinator.coordination.roles import TelemetryStore
from coordinator.runtime.nodes.telemetry import HISTORY_LENGTH, history_ttl_s
from coordinator.settings import Settings
from protocol.model_servers import UNENCODED, encoded, whole_body
from protocol.telemetry import encode_sample, parse_sample

__all__ = ["poll_telemetry_agents", "run_telemetry_polls", "telemetry_agents"]

log = logging.getLogger("gemmanet.monitor")

#: an agent's answer is a small JSON object; anything larger is not one
MAX_ANSWER_BYTES = 16 * 1024


async def _fetch(client: httpx.AsyncClient, url: str, timeout_s: float) -> bytes | None:
    """The agent's answer, read to ``MAX_ANSWER_BYTES`` at most (None: no answer, or not one)."""
    try:
        with trio.fail_after(timeout_s):
            async with client.stream("GET", url, headers=UNENCODED) as response:
                if response.status_code != 200 or encoded(response.headers.get("content-encoding")):
                    log.debug("telemetry agent %s answered %d", url, response.status_code)
                    return None
                body = await whole_body(response.aiter_bytes(), MAX_ANSWER_BYTES)
    except (httpx.HTTPError, trio.TooSlowError) as exc:
        log.debug("telemetry agent %s: %s", url, exc)
        return None
    if body is None:
        log.debug("telemetry agent %s answered more than %d bytes", url, MAX_ANSWER_BYTES)
    return body


def telemetry_agents(settings: Settings) -> dict[str, str]:
    """Node or host id -> the URL of its telemetry agent, by id."""
    capacity = settings.capacity
    agents = {node_id: spec.telemetry_url for node_id, spec in capacity.nodes.items()}
    agents |= {h: spec.telemetry_url for h, spec in capacity.hosts.items() if spec.telemetry_url}
    return {id_: url for id_, url in sorted(agents.items()) if url}


async def poll_telemetry_agents(
    client: httpx.AsyncClient, coordination: TelemetryStore, settings: Settings
) -> dict[str, bool]:
    """One round: node (or host) id -> whether a valid sample was stored."""
    agents = telemetry_agents(settings)
    answers: dict[str, bytes | None] = {}

    async def one(node_id: str, url: str) -> None:
        answers[node_id] = await _fetch(client, url, settings.monitor_poll_timeout_s)

    async with trio.open_nursery() as nursery:
        for node_id, url in agents.items():
            nursery.start_soon(one, node_id, url)
    stored: dict[str, bool] = {}
    ttl_s = history_ttl_s(settings.telemetry_interval_s)
    for node_id in agents:
        raw = answers.get(node_id)
        sample = parse_sample(raw) if raw is not None else None
        stored[node_id] = False
        if sample is None:
            continue
        try:
            await coordination.append_telemetry(
                node_id, encode_sample(sample), keep=HISTORY_LENGTH, ttl_s=ttl_s
            )
            stored[node_id] = True
        except CoordinationUnavailable as exc:
            log.warning("could not store the telemetry of node %s: %s", node_id, exc)
    return stored


async def run_telemetry_polls(
    coordination: TelemetryStore,
    settings: Settings,
    client: httpx.AsyncClient,
    is_primary: Callable[[], bool],
) -> None:
    """Forever: a round every telemetry interval while ``is_primary()``."""
    if not telemetry_agents(settings):
        return
    while True:
        if is_primary():
            await poll_telemetry_agents(client, coordination, settings)
        await trio.sleep(settings.telemetry_interval_s)
