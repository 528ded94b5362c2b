"""The audit report for people: a few summary lines, a table of hosts, one of agent nodes (each
row with its verdict), the catalog, then the reasons and warnings. (``--json`` prints the document itself.)"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from coordinator.audit.gate import gate_line

__all__ = ["render_text"]


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    ]


def _budget(memory_gb: float | None, parallel: int | None) -> str:
    memory = "-" if memory_gb is None else f"{memory_gb:g} GB"
    return f"{memory}, {'-' if parallel is None else parallel} parallel"


def _yes_no(value: bool | None) -> str:
    return "?" if value is None else ("yes" if value else "no")


def _facts(host: dict[str, Any]) -> str:
    if not host["has_facts"]:
        return "none"
    return f"{'fresh' if host['fresh'] else 'STALE'} {host['age_s']:.1f} s, epoch {host['epoch']}"


def _node_facts(node: dict[str, Any]) -> str:
    if node["owner_age_s"] is None:
        return "-"
    if not node["has_facts"]:
        return "none"
    state = "fresh" if node["fresh"] else "STALE"
    return f"{state}, owner beat {node['owner_age_s']:.1f} s ago"


def _host_row(host: dict[str, Any]) -> list[str]:
    resident = ", ".join(f"{m} {gb:g} GB" for m, gb in sorted(host["resident"].items())) or "-"
    row = [
        host["host_id"],
        host["kind"],
        _yes_no(host["reachable"]),
        _facts(host),
        _budget(host["memory_gb"], host["max_parallel"]),
        resident,
        host["verdict"],
    ]
    if host["probe"] is not None:
        row.insert(3, "ok" if host["probe"]["reachable"] else "FAILED")
    return row


def render_text(doc: dict[str, Any]) -> str:
    verdict = "READY" if doc["ready"] else "NOT READY"
    lines = [f"gemmanet audit: {verdict} (exit {doc['exit_code']})"]
    redis = doc["redis"]
    state = "reachable" if redis["reachable"] else f"UNREACHABLE ({redis['error']})"
    lines.append(f"redis    {redis['url']} prefix {redis['key_prefix']}: {state}")
    monitor = doc["monitor"]
    if monitor is None:
        lines.append("monitor  unknown")
    elif monitor["holder"] is None:
        lines.append(f"monitor  NONE holds the lease (last epoch {monitor['epoch']})")
    else:
        lines.append(
            f"monitor  {monitor['holder']} holds the lease, epoch {monitor['lease_epoch']} "
            f"(fenced rejects {monitor['fenced_rejects']})"
        )
    timing = doc["timing"]
    relation = "<=" if timing["bound_s"] <= timing["stale_window_s"] else ">"
    lines.append(
        f"timing   {timing['sum']} {relation} GEMMANET_RESIDENCY_STALE_S="
        f"{timing['stale_window_s']:g}: {'ok' if timing['ok'] else 'EXCEEDED'}"
    )
    gate = gate_line(doc)
    if gate is not None:
        lines.append(gate)
    if doc["hosts"]:
        probed = any(host["probe"] is not None for host in doc["hosts"])
        header = ["HOST", "KIND", "REACHABLE", "FACTS", "BUDGET", "RESIDENT", "VERDICT"]
        if probed:
            header.insert(3, "PROBE")
        lines += ["", *_table(header, [_host_row(host) for host in doc["hosts"]])]
    if doc["nodes"]:
        rows = [
            [
                node["node_id"],
                _yes_no(node["connected"])
                + (f" ({node['instance_id']})" if node["instance_id"] else ""),
                _node_facts(node),
                _budget(node["vram_gb"], node["max_parallel"]),
                ", ".join(node["models"]) or "-",
                node["verdict"],
            ]
            for node in doc["nodes"]
        ]
        header = ["NODE", "CONNECTED", "FACTS", "BUDGET", "MODELS", "VERDICT"]
        lines += ["", *_table(header, rows)]
    catalog = doc["catalog"]
    if catalog is not None and catalog["models"]:
        served = "; ".join(
            f"{model} ({', '.join(where) or 'nobody'})"
            for model, where in catalog["served_by"].items()
        )
        lines += ["", f"catalog  {served}"]
    for title, key in (("not ready because:", "reasons"), ("warnings:", "warnings")):
        if doc[key]:
            lines += ["", title, *(f"  {f['code']}: {f['message']}" for f in doc[key])]
    return "\n".join(lines)
