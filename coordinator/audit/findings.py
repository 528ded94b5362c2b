"""The audit's verdict, pure: from the settings and what was read from the store, the report
``gemmanet audit --json`` prints (its shape is documented in docs/interface.md) and the exit
code. No I/O here; ``observe.py`` does the reading.

Readiness (exit 0) needs every one of: Redis answered; something to place on (a direct host
in the operator file or a connected agent node); and every listed host and connected node
ready. With direct hosts, a monitor must hold the lease and the monitor timing fit the
staleness window (and the lease outlive a tick), and every host have facts that are fresh —
written under the current epoch and no older than ``GEMMANET_RESIDENCY_STALE_S`` on the
store's clock — and say it answered the monitor's last poll. An agent-only cluster needs no
monitor. Agent nodes are judged in ``nodes.py``. Each failure is a *reason* with a stable
code. Catalog gaps, agent nodes that are not connected or have no memory budget, a host over
its memory budget and a failed direct probe are *warnings*: reported, but the scheduler can
start with them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from coordinator.audit.gate import gate_warnings, placement_document
from coordinator.audit.nodes import ConnectedNode, Finding, NodeObservations, judge_nodes
from coordinator.coordination.leases import NodeFacts
from coordinator.coordination.monitor_types import HostFacts, MonitorStatus, PlacementSwitch
from coordinator.monitor.timing import monitor_bound_s, monitor_bound_sum, monitor_timing_problems
from coordinator.settings import Settings
from coordinator.url_credentials import hide_credentials

__all__ = [
    "EXIT_NOT_READY",
    "EXIT_READY",
    "EXIT_REDIS_UNREACHABLE",
    "EXIT_USAGE",
    "AuditReport",
    "ConnectedNode",
    "Finding",
    "Observed",
    "judge",
]

EXIT_READY = 0
#: one or more reasons: the scheduler must not be turned on
EXIT_NOT_READY = 1
#: a bad setting or option (one line on stderr, no report)
EXIT_USAGE = 2
#: Redis did not answer: nothing but the settings could be judged
EXIT_REDIS_UNREACHABLE = 3


@dataclass(frozen=True)
class Observed:
    """What the audit read. With ``redis_error`` set nothing else from the store is known."""

    redis_error: str | None = None
    monitor: MonitorStatus | None = None
    facts: dict[str, HostFacts] = field(default_factory=dict)
    #: agent nodes of the instances in the registry (live or silent), by node id
    connected: dict[str, ConnectedNode] = field(default_factory=dict)
    #: the node facts in the store of those nodes (what the capacity leases are judged against)
    node_facts: dict[str, NodeFacts] = field(default_factory=dict)
    #: host id -> the audit's own poll record (``poller.poll_host``); None: ``--probe`` not asked
    probes: dict[str, dict[str, Any]] | None = None
    #: the placement switch of direct hosts (None: never set)
    switch: PlacementSwitch | None = None


@dataclass(frozen=True)
class AuditReport:
    document: dict[str, Any]
    reasons: list[Finding]
    warnings: list[Finding]
    exit_code: int


def _host_reasons(
    host_id: str, facts: HostFacts | None, epoch: int, window: float
) -> list[Finding]:
    if facts is None:
        return [
            Finding("no_facts", f"host {host_id}: no facts: the monitor never polled it", host_id)
        ]
    if facts.age_s > window:
        message = f"host {host_id}: facts are {facts.age_s:.1f} s old, the window is {window:g} s"
        return [Finding("stale_facts", message, host_id)]
    if facts.epoch != epoch:
        message = (
            f"host {host_id}: facts were written under epoch {facts.epoch}, the current epoch "
            f"is {epoch} (a deposed monitor's)"
        )
        return [Finding("stale_facts", message, host_id)]
    if not facts.reachable:
        error = facts.record.get("error") or "no reason given"
        message = f"host {host_id}: did not answer the monitor's last poll ({error})"
        return [Finding("host_unreachable", message, host_id)]
    return []


def _hosts(
    settings: Settings, observed: Observed, reasons: list[Finding], warnings: list[Finding]
) -> list[dict[str, Any]]:
    known = observed.redis_error is None
    epoch = observed.monitor.epoch if observed.monitor else 0
    window = settings.residency_stale_s
    rows = []
    for host_id, spec in sorted(settings.capacity.hosts.items()):
        facts = observed.facts.get(host_id)
        problems = _host_reasons(host_id, facts, epoch, window) if known else []
        reasons += problems
        resident = facts.resident if facts else {}
        if spec.memory_gb is not None and sum(resident.values()) > spec.memory_gb + 1e-9:
            total = sum(resident.values())
            message = (
                f"host {host_id}: resident models take {total:g} GB, its budget is "
                f"{spec.memory_gb:g} GB"
            )
            warnings.append(Finding("over_memory_budget", message, host_id))
        probe = None if observed.probes is None else observed.probes.get(host_id)
        if probe is not None and not probe.get("reachable"):
            message = f"host {host_id}: the audit's own probe failed ({probe.get('error')})"
            warnings.append(Finding("probe_failed", message, host_id))
        rows.append(
            {
                "host_id": host_id,
                "kind": spec.kind,
                "url": spec.url,
                "memory_gb": spec.memory_gb,
                "max_parallel": spec.max_parallel,
                "weight": spec.weight,
                "has_facts": facts is not None,
                "reachable": facts.reachable if facts else None,
                "error": facts.record.get("error") if facts else None,
                "age_s": round(facts.age_s, 3) if facts else None,
                "epoch": facts.epoch if facts else None,
                "fresh": known
                and facts is not None
                and facts.age_s <= window
                and facts.epoch == epoch,
                "resident": resident,
                "models": list(facts.record.get("models") or []) if facts else [],
                "probe": None
                if probe is None
                else {"reachable": bool(probe.get("reachable")), "error": probe.get("error")},
                "ready": known and not problems,
                "verdict": (problems[0].code if problems else "ready") if known else "unknown",
            }
        )
    return rows


def _catalog(
    settings: Settings,
    observed: Observed,
    hosts: list[dict[str, Any]],
    nodes: list[dict[str, Any]],
    warnings: list[Finding],
) -> dict[str, Any] | None:
    catalog = sorted(settings.capacity.models)
    if observed.redis_error is not None:
        return None
    servers: dict[str, set[str]] = {}
    for row in hosts:
        if row["ready"]:  # only a host placement could use serves anything
            for model in set(row["models"]) | set(row["resident"]):
                servers.setdefault(model, set()).add(row["host_id"])
    for node in nodes:
        if node["ready"]:
            for model in node["models"]:
                servers.setdefault(model, set()).add(node["node_id"])
    unserved = [model for model in catalog if not servers.get(model)]
    for model in unserved:
        message = (
            f"model {model}: in the catalog, but no ready host and no connected node serves it"
        )
        warnings.append(Finding("catalog_unserved", message, model))
    unlisted: dict[str, list[str]] = {}
    for row in hosts:
        for model in row["resident"]:
            if model not in settings.capacity.models:
                unlisted.setdefault(model, []).append(row["host_id"])
    for node in nodes:
        for model in node["uncatalogued"]:
            unlisted.setdefault(model, []).append(node["node_id"])
    for model, where in sorted(unlisted.items()):
        message = (
            f"model {model}: on {', '.join(where)} but not in the catalog (its memory is not "
            "charged against the budget: placed on the parallel budget alone)"
        )
        warnings.append(Finding("catalog_unlisted", message, model))
    return {
        "models": catalog,
        "served_by": {model: sorted(servers.get(model, ())) for model in catalog},
        "unserved": unserved,
        "unlisted": dict(sorted(unlisted.items())),
    }


def judge(settings: Settings, observed: Observed) -> AuditReport:
    """The report and exit code for what was observed (module docstring: the rules)."""
    reasons: list[Finding] = []
    warnings: list[Finding] = []
    if observed.redis_error is not None:
        message = f"Redis is unreachable: {observed.redis_error}"
        reasons.append(Finding("redis_unreachable", message))
    monitor = observed.monitor
    # The monitor polls the direct hosts; agent nodes report through their instances.
    hosted = bool(settings.capacity.hosts)
    if hosted and observed.redis_error is None and (monitor is None or monitor.holder is None):
        message = "no monitor holds the lease: start `gemmanet monitor` (or GEMMANET_MONITOR=1)"
        reasons.append(Finding("no_monitor", message))
    timing_problems = monitor_timing_problems(settings)
    if hosted:
        reasons += [Finding(code, message) for code, message in timing_problems]
    if not hosted and observed.redis_error is None and not observed.connected:
        message = (
            "no direct host in the operator file (GEMMANET_CAPACITY_FILE [hosts]) and no agent "
            "node connected: nothing to place on"
        )
        reasons.append(Finding("no_hosts", message))
    hosts = _hosts(settings, observed, reasons, warnings)
    known = None if observed.redis_error is not None else observed
    seen = NodeObservations(known.connected, known.node_facts) if known else None
    nodes = judge_nodes(settings, seen, reasons, warnings)
    catalog = _catalog(settings, observed, hosts, nodes, warnings)
    warnings += gate_warnings(settings)
    if observed.redis_error is not None:
        exit_code = EXIT_REDIS_UNREACHABLE
    else:
        exit_code = EXIT_NOT_READY if reasons else EXIT_READY
    document = {
        "ready": exit_code == EXIT_READY,
        "exit_code": exit_code,
        "redis": {
            # A URL with credentials is refused before the audit runs; hidden all the same.
            "url": hide_credentials(settings.redis_url or "") or None,
            "key_prefix": settings.key_prefix,
            "reachable": observed.redis_error is None,
            "error": observed.redis_error,
        },
        "monitor": None
        if monitor is None
        else {
            "holder": monitor.holder,
            "lease_epoch": monitor.lease_epoch,
            "epoch": monitor.epoch,
            "fenced_rejects": monitor.fenced_rejects,
        },
        "timing": {
            "poll_s": settings.monitor_poll_s,
            "election_ttl_s": settings.monitor_ttl_s,
            "standby_retry_s": settings.monitor_retry_s,
            "poll_timeout_s": settings.monitor_poll_timeout_s,
            "bound_s": monitor_bound_s(settings),
            "stale_window_s": settings.residency_stale_s,
            "sum": monitor_bound_sum(settings),
            "ok": not timing_problems,
        },
        "host_placement": placement_document(
            settings, observed.switch, known=observed.redis_error is None
        ),
        "hosts": hosts,
        "nodes": nodes,
        "catalog": catalog,
        "reasons": [finding.to_json() for finding in reasons],
        "warnings": [finding.to_json() for finding in warnings],
    }
    return AuditReport(document, reasons, warnings, exit_code)
