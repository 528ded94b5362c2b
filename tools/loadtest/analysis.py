"""Figures of one phase, from the request records, the node journal and the /proc samples (the
pass/fail criteria over all phases are ``verdicts.py``)."""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from tools.bench._harness import percentile, summary_ms
from tools.loadtest import profile as prof
from tools.loadtest.journal import JournalReader
from tools.loadtest.load import Load, Rec
from tools.loadtest.profile import Profile
from tools.loadtest.sampler import Sampler, Series

#: the longest the steady phase's resources wait for the ramp's last answer (a lost request of
#: the ramp must not keep seconds of the steady phase out of the figures)
RAMP_DRAIN_MAX_S = 5.0


def clean_json(value: Any) -> Any:
    """JSON has no NaN: None instead, recursively; floats rounded to what matters."""
    if isinstance(value, float):
        return None if math.isnan(value) or math.isinf(value) else round(value, 3)
    if isinstance(value, dict):
        return {str(k): clean_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean_json(v) for v in value]
    return value


def segment(rec: Rec, load: Load) -> str:
    """ramp | steady | prekill (after the steady phase, before the kill) | fault (after it)."""
    if rec.kind == "ramp" or rec.sched < load.hold_end:
        return "ramp"
    if rec.sched < load.steady_end:
        return "steady"
    if math.isnan(load.kill_t) or rec.sched < load.kill_t:
        return "prekill"
    return "fault"


def latency_s(rec: Rec) -> float:
    """From the scheduled send time (open loop) to the answer."""
    return rec.done - rec.sched


def _ms(values: Sequence[float]) -> dict[str, float]:
    data = summary_ms(values)
    data["count"] = len(values)
    return data


def _outcomes(recs: Iterable[Rec]) -> dict[str, Any]:
    recs = list(recs)
    errors = Counter(r.label for r in recs if r.outcome == "error")
    lost = Counter(r.label for r in recs if r.outcome == "lost")
    return {
        "sent": len(recs),
        "ok": sum(1 for r in recs if r.outcome == "ok"),
        "errors": dict(errors),
        "lost": dict(lost),
    }


def _rolling_max(values: Sequence[float], window: int) -> float:
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return math.nan
    if len(values) <= window:
        return statistics.fmean(values)
    sums = [statistics.fmean(values[i : i + window]) for i in range(len(values) - window + 1)]
    return max(sums)


def steady_state_from(load: Load) -> float:
    """When the steady phase's resources start to count: at the end of the hold, or once the
    last request of the ramp (in flight at the hold's end, 200 of them at full scale) has been
    answered, at most ``RAMP_DRAIN_MAX_S`` later. Until then the instance still answers the
    closed loop, at about 2.5 times the steady rate."""
    done = [r.done for r in load.records if r.kind == "ramp" and not math.isnan(r.done)]
    drained = max(done, default=load.hold_end)
    return min(max(load.hold_end, drained), load.hold_end + RAMP_DRAIN_MAX_S)


def in_window(t: Sequence[float], start: float, end: float) -> list[int]:
    """The samples whose whole interval lies in [start, end]: a sample at ``t[i]`` covers
    ``t[i-1]`` to ``t[i]`` (the first one, an interval of unknown start, never counts). The
    one-second sample taken just after the hold's end is mostly hold (the closed loop of the
    ramp at full concurrency); counted, it raised the single-instance CPU peak of two archived
    runs by 4 points (docs/loadtest/2026-12-01-night: 66.3 % for 62.1 %)."""
    return [i for i in range(1, len(t)) if t[i - 1] >= start and t[i] <= end]


def resource_figures(series: Series, start: float, end: float) -> dict[str, float]:
    idx = in_window(series.t, start, end)
    cpu = [series.cpu_pct[i] for i in idx if not math.isnan(series.cpu_pct[i])]
    rss = [series.rss_mb[i] for i in idx]
    data: dict[str, float] = {
        "samples": len(idx),
        "cpu_mean_pct": statistics.fmean(cpu) if cpu else math.nan,
        "cpu_p95_pct": percentile(cpu, 95),
        "cpu_max_pct": max(cpu) if cpu else math.nan,
        f"cpu_max_{prof.CPU_WINDOW_SAMPLES}s_pct": _rolling_max(cpu, prof.CPU_WINDOW_SAMPLES),
        "rss_start_mb": math.nan,
        "rss_end_mb": math.nan,
        "rss_max_mb": max(rss) if rss else math.nan,
        "rss_growth_pct": math.nan,
    }
    if rss:
        edge = max(3, len(rss) // 10)
        first = statistics.median(rss[:edge])
        last = statistics.median(rss[-edge:])
        data["rss_start_mb"] = first
        data["rss_end_mb"] = last
        data["rss_growth_pct"] = 100.0 * (last - first) / first if first > 0 else math.nan
    return data


def _per_second(recs: list[Rec], t0: float, end: float) -> dict[str, list[float]]:
    """Latency percentiles and error counts per one-second bin of the answer time."""
    bins: dict[int, list[float]] = {}
    errs: Counter[int] = Counter()
    for r in recs:
        if math.isnan(r.done):
            continue
        b = int(r.done - t0)
        if r.outcome == "ok":
            bins.setdefault(b, []).append(latency_s(r) * 1000)
        else:
            errs[b] += 1
    last = int(max(end - t0, 0)) + 1
    out: dict[str, list[float]] = {"t": [], "p50": [], "p95": [], "p99": [], "ok": [], "errors": []}
    for b in range(last):
        values = bins.get(b, [])
        out["t"].append(b + 0.5)
        out["p50"].append(percentile(values, 50))
        out["p95"].append(percentile(values, 95))
        out["p99"].append(percentile(values, 99))
        out["ok"].append(len(values))
        out["errors"].append(errs.get(b, 0))
    return out


def _detail(rec: Rec, kill_t: float, journal: JournalReader) -> dict[str, Any]:
    """One request around the kill, for the report: times relative to the kill."""
    where = journal.assigned.get(rec.tag)
    return {
        "tag": rec.tag,
        "kind": rec.kind,
        "sent_to": f"I{rec.inst}",
        "sent_s": rec.sent - kill_t,
        "answered_s": rec.done - kill_t,
        "label": rec.label,
        "node": None if where is None else where.node_id,
        "node_on": None if where is None else f"I{where.instance}",
        "node_started_s": None if where is None else where.started - kill_t,
        "message": rec.message or None,
    }


def kill_figures(load: Load, journal: JournalReader) -> dict[str, Any]:
    """What the kill did: the in-flight tasks of the killed instance (how fast and how they
    failed), the requests on the surviving instances, and how fast the nodes moved over."""
    if load.killed is None:
        return {}
    k, kill_t = load.killed, load.kill_t
    limit = prof.KILL_FAIL_WITHIN_S
    on_killed: list[Rec] = []  # tasks the killed instance was serving for another instance
    requested_on_killed: list[Rec] = []  # the client's connection was to the killed instance
    others: list[Rec] = []
    for rec in load.records:
        in_flight = rec.sent < kill_t and not (rec.done < kill_t)
        if not in_flight and not rec.sent >= kill_t:
            continue  # answered before the kill
        if rec.inst == k:
            # Sent to the killed instance (the client side chose it before the kill, even if
            # the bytes left just after): its connection drops.
            requested_on_killed.append(rec)
            continue
        if not in_flight:
            others.append(rec)
            continue
        where = journal.assigned.get(rec.tag)
        if where is not None and where.instance == k:
            on_killed.append(rec)
        elif where is None and rec.outcome != "ok" and rec.status == 502:
            # dispatched to the killed instance but not yet started on its node
            on_killed.append(rec)
        else:
            others.append(rec)

    def fails_fast(rec: Rec) -> bool:
        answered = rec.done - kill_t
        if not answered <= limit:
            return False
        if rec.outcome == "ok":
            return True  # its answer got out just before the kill
        return rec.status == 502 or rec.label.startswith("connection lost: instance killed")

    def times(recs: list[Rec]) -> dict[str, float]:
        values = [max(0.0, r.done - kill_t) for r in recs if not math.isnan(r.done)]
        return {
            "max_s": max(values) if values else math.nan,
            "p50_s": percentile(values, 50),
        }

    slow = [r for r in on_killed + requested_on_killed if not fails_fast(r)]
    affected = [r for r in others if r.outcome != "ok"]
    # Nodes that were on the killed instance: when did each reconnect elsewhere?
    before = {}
    for node_id, inst, t in journal.connects:
        if t < kill_t:
            before[node_id] = inst
    moved: dict[str, float] = {}
    for node_id, inst, t in journal.connects:
        if t >= kill_t and before.get(node_id) == k and inst != k and node_id not in moved:
            moved[node_id] = t - kill_t
    stranded = sorted(n for n, inst in before.items() if inst == k and n not in moved)
    return {
        "instance": k,
        "at_s": kill_t - load.t0,
        **load.kill_info,
        "in_flight_on_its_nodes": {
            "count": len(on_killed),
            "streams": sum(1 for r in on_killed if r.kind == "stream"),
            "outcomes": dict(Counter(r.label for r in on_killed)),
            "time_to_answer": times(on_killed),
            "times_s": sorted(round(max(0.0, r.done - kill_t), 3) for r in on_killed),
        },
        "requested_on_it": {
            "count": len(requested_on_killed),
            "outcomes": dict(Counter(r.label for r in requested_on_killed)),
            "time_to_answer": times(requested_on_killed),
        },
        "not_failed_fast": [_detail(r, kill_t, journal) for r in slow[:20]],
        "not_failed_fast_count": len(slow),
        "others": {
            "count": len(others),
            "ok": len(others) - len(affected),
            "affected": dict(Counter(r.label for r in affected)),
            # Sent to a survivor after the kill, placed on a node of the killed instance (whose
            # death the survivor had not noticed yet), never started, then failed with 502.
            "placed_on_killed_after_kill": sum(
                1
                for r in affected
                if r.status == 502
                and r.tag not in journal.assigned
                and f"instance I{k} " in r.message
            ),
            "affected_details": [_detail(r, kill_t, journal) for r in affected[:20]],
        },
        "nodes_moved": {
            "count": len(moved),
            "of": sum(1 for inst in before.values() if inst == k),
            "p50_s": percentile(list(moved.values()), 50),
            "max_s": max(moved.values()) if moved else math.nan,
            "stranded": stranded[:20],
        },
    }


def phase_report(
    profile: Profile,
    instances: int,
    load: Load,
    journal: JournalReader,
    sampler: Sampler,
    coordinator_names: list[str],
    extra: dict[str, Any],
) -> dict[str, Any]:
    recs = load.records
    plain = [r for r in recs if r.kind != "stream"]
    streams = [r for r in recs if r.kind == "stream"]
    by_seg: dict[str, list[Rec]] = {}
    for r in plain:
        by_seg.setdefault(segment(r, load), []).append(r)

    requests: dict[str, Any] = {}
    for seg in ("ramp", "steady", "prekill", "fault"):
        group = by_seg.get(seg, [])
        if not group and seg in ("prekill", "fault"):
            continue
        ok = [r for r in group if r.outcome == "ok"]
        requests[seg] = {
            **_outcomes(group),
            "latency_ms": _ms([latency_s(r) for r in ok]),
        }
    steady = by_seg.get("steady", [])
    steady_ok = [r for r in steady if r.outcome == "ok"]
    sent_in_window = sum(1 for r in steady if load.hold_end <= r.sent <= load.steady_end)
    requests["steady"]["sent_rate_per_s"] = sent_in_window / profile.duration_s
    lag = [r.sent - r.sched for r in steady]
    requests["steady"]["send_lag_ms"] = {
        "p50": percentile(lag, 50) * 1000,
        "p99": percentile(lag, 99) * 1000,
        "max": (max(lag) * 1000) if lag else math.nan,
    }

    # Where the steady requests ran: on a node of the instance that took the request (local)
    # or of another one (remote, one bus hop each way); and the coordinator's own share of the
    # latency (minus the echo backend's sleep, which is random and dominates the spread).
    local: list[float] = []
    remote: list[float] = []
    over_local: list[float] = []
    over_remote: list[float] = []
    for r in steady_ok:
        where = journal.assigned.get(r.tag)
        if where is None:
            continue
        delay = journal.delays.get(r.tag)
        is_remote = where.instance != r.inst
        (remote if is_remote else local).append(latency_s(r))
        if delay is not None:
            (over_remote if is_remote else over_local).append(latency_s(r) - delay)
    placed = len(local) + len(remote)
    cross = {
        "remote_share": len(remote) / placed if placed else math.nan,
        "latency_local_ms": _ms(local),
        "latency_remote_ms": _ms(remote),
        "overhead_all_ms": _ms(over_local + over_remote),
        "overhead_local_ms": _ms(over_local),
        "overhead_remote_ms": _ms(over_remote),
    }

    stream_ok = [r for r in streams if r.outcome == "ok"]
    stream_window = max(1e-9, load.steady_end - load.hold_end)
    busy = 0.0
    for r in streams:
        end = r.done if not math.isnan(r.done) else load.ended
        busy += max(0.0, min(end, load.steady_end) - max(r.sent, load.hold_end))
    stream_fig = {
        **_outcomes(streams),
        "ttfb_ms": _ms([r.first - r.sent for r in stream_ok if not math.isnan(r.first)]),
        "duration_ms": _ms([r.done - r.sent for r in stream_ok]),
        "mean_concurrent_in_steady": busy / stream_window,
        "chunks": sum(r.chunks for r in streams),
    }

    resources: dict[str, Any] = {}
    counted_from = steady_state_from(load)
    for name, series in sampler.series.items():
        resources[name] = resource_figures(series, counted_from, load.steady_end)
    box = [sampler.box.cpu_pct[i] for i in in_window(sampler.box.t, counted_from, load.steady_end)]

    t0 = load.t0
    end = load.ended if not math.isnan(load.ended) else load.stop_at
    plot_series = {
        "latency": _per_second(plain, t0, end),
        "resources": {
            name: {
                "t": [t - t0 for t in s.t],
                "cpu_pct": s.cpu_pct,
                "rss_mb": s.rss_mb,
            }
            for name, s in sampler.series.items()
        },
        "box_cpu_pct": {"t": [t - t0 for t in sampler.box.t], "cpu_pct": sampler.box.cpu_pct},
        "marks": {
            "hold_end": load.hold_end - t0,
            "steady_end": load.steady_end - t0,
            "kill": (load.kill_t - t0) if not math.isnan(load.kill_t) else None,
            "stop": (load.stop_at - t0) if math.isfinite(load.stop_at) else None,
        },
    }
    report = {
        "instances": instances,
        "coordinators": coordinator_names,
        "timeline_s": {
            "ramp": profile.ramp_s,
            "hold": profile.hold_s,
            "steady_from": load.hold_end - t0,
            "steady_to": load.steady_end - t0,
            # the resources (CPU, RSS) count from here: the ramp's requests all answered
            "resources_from": counted_from - t0,
            "kill_at": (load.kill_t - t0) if not math.isnan(load.kill_t) else None,
            "stop_at": (load.stop_at - t0) if math.isfinite(load.stop_at) else None,
            "ended_at": end - t0,
        },
        "requests": requests,
        "streams": stream_fig,
        "concurrency": {
            "ramp_target": profile.concurrency,
            "ramp_reached": load.max_ramp_in_flight,
            "max_in_flight_all": load.max_in_flight,
        },
        "cross_instance": cross,
        "resources_steady": resources,
        "box_cpu_steady_pct_of_one_core": {
            "mean": statistics.fmean(box) if box else math.nan,
            "max": max(box) if box else math.nan,
        },
        "kill": kill_figures(load, journal),
        "totals": _outcomes(recs),
        # Everything answered before the kill (all of it without one): the errors here are
        # not the kill's doing.
        "before_kill": _outcomes(
            r for r in recs if math.isnan(load.kill_t) or (r.sent < load.kill_t > r.done)
        ),
        "error_messages": load.messages,
        "journal_duplicates": journal.duplicates,
        **extra,
        "series": plot_series,
    }
    return clean_json(report)  # type: ignore[no-any-return]
