"""The pass/fail criteria over all phases of a load test: each with its threshold, what was
measured (from the phase reports of ``analysis.py``) and its verdict; and our aims, reported
beside them the same way but without a say in the verdict."""

from __future__ import annotations

from typing import Any

from tools.loadtest import profile as prof
from tools.loadtest import speed
from tools.loadtest.profile import Profile

WRONG_OUTPUT = ("200 wrong output", "200 wrong stream output")


def _criterion(
    cid: str, text: str, threshold: str, measured: Any, passed: bool, source: str, **more: Any
) -> dict[str, Any]:
    return {
        "id": cid,
        "criterion": text,
        "threshold": threshold,
        "measured": measured,
        "pass": bool(passed),
        "source": source,
        **more,
    }


def criteria(profile: Profile, phases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seed, ours = "seed 000 §4.1", "ours"
    out: list[dict[str, Any]] = []
    ran = [p for p in phases if "error" not in p]
    failed_phases = [p["instances"] for p in phases if "error" in p]

    # 1. zero lost tasks
    lost = {p["instances"]: sum(p["totals"]["lost"].values()) for p in ran}
    total = sum(p["totals"]["sent"] for p in ran)
    out.append(
        _criterion(
            "zero_lost_tasks",
            "every request gets a result or an explicit error",
            "0 lost",
            {"lost_by_phase": lost, "requests": total, "phases_that_did_not_run": failed_phases},
            not failed_phases and bool(ran) and sum(lost.values()) == 0,
            seed,
        )
    )

    # 2-3. cross-instance hop against the baseline
    base = next((p for p in ran if p["instances"] == 1), None)
    multi = [p for p in ran if p["instances"] > 1]
    for q, limit in (("p95", prof.HOP_P95_MS), ("p99", prof.HOP_P99_MS)):
        diffs: dict[int, float | None] = {}
        for p in multi:
            if base is None:
                diffs[p["instances"]] = None
                continue
            a = p["requests"]["steady"]["latency_ms"][f"{q}_ms"]
            b = base["requests"]["steady"]["latency_ms"][f"{q}_ms"]
            diffs[p["instances"]] = None if a is None or b is None else round(a - b, 3)
        values = list(diffs.values())
        ok = bool(values) and all(v is not None and v <= limit for v in values)
        out.append(
            _criterion(
                f"hop_{q}",
                f"the cross-instance hop adds at most {limit:g} ms at {q} (steady-phase latency "
                "of N instances minus the single-instance baseline)",
                f"<= {limit:g} ms",
                {"added_ms_by_instances": diffs},
                ok and len(multi) == len(set(profile.phases) - {1}) and not failed_phases,
                seed,
            )
        )

    # 4. CPU per instance
    key = f"cpu_max_{prof.CPU_WINDOW_SAMPLES}s_pct"
    cpu: dict[str, float | None] = {}
    for p in ran:
        for name in p["coordinators"]:
            cpu[f"{p['instances']}:{name}"] = p["resources_steady"].get(name, {}).get(key)
    out.append(
        _criterion(
            "cpu_per_instance",
            f"coordinator CPU stays below {prof.CPU_LIMIT_PCT:g}% per instance (highest "
            f"{prof.CPU_WINDOW_SAMPLES}-second average of one-second /proc samples over the "
            "steady phase; 100% = one core)",
            f"< {prof.CPU_LIMIT_PCT:g}%",
            {"max_pct_by_phase_instance": cpu},
            bool(cpu) and all(v is not None and v < prof.CPU_LIMIT_PCT for v in cpu.values()),
            seed,
        )
    )

    # 5. memory flat
    growth: dict[str, float | None] = {}
    for p in ran:
        for name in p["coordinators"]:
            growth[f"{p['instances']}:{name}"] = (
                p["resources_steady"].get(name, {}).get("rss_growth_pct")
            )
    out.append(
        _criterion(
            "memory_flat",
            f"coordinator RSS grows less than {prof.MEMORY_GROWTH_LIMIT_PCT:g}% over the steady "
            "phase (median of its last tenth against its first tenth)",
            f"< {prof.MEMORY_GROWTH_LIMIT_PCT:g}%",
            {"growth_pct_by_phase_instance": growth},
            bool(growth)
            and all(v is not None and v < prof.MEMORY_GROWTH_LIMIT_PCT for v in growth.values()),
            seed,
        )
    )

    # 6-7. the kill
    kills = {p["instances"]: p.get("kill") or {} for p in multi}
    fast: dict[int, Any] = {}
    ok_fast = bool(kills) and not failed_phases
    for n, k in kills.items():
        inflight = k.get("in_flight_on_its_nodes", {})
        fast[n] = {
            "tasks": inflight.get("count", 0),
            "max_s": inflight.get("time_to_answer", {}).get("max_s"),
            "outcomes": inflight.get("outcomes", {}),
            "requested_on_killed": k.get("requested_on_it", {}).get("count", 0),
            "not_failed_fast": k.get("not_failed_fast_count"),
        }
        if not k or inflight.get("count", 0) == 0 or k.get("not_failed_fast_count", 1) != 0:
            ok_fast = False
    out.append(
        _criterion(
            "kill_fails_fast",
            "after kill -9 of an instance, its in-flight tasks fail with 502 within "
            f"{prof.KILL_FAIL_WITHIN_S:g} s (and at least one such task was in flight)",
            f"<= {prof.KILL_FAIL_WITHIN_S:g} s, status 502",
            {"by_instances": fast},
            ok_fast and len(multi) > 0,
            seed,
        )
    )
    unaffected: dict[int, Any] = {}
    ok_others = bool(kills) and not failed_phases
    for n, k in kills.items():
        others = k.get("others", {})
        unaffected[n] = others
        if not k or others.get("count", 0) == 0 or others.get("ok") != others.get("count"):
            ok_others = False
    out.append(
        _criterion(
            "kill_others_unaffected",
            "after the kill, requests on the surviving instances whose tasks were not on the "
            "killed instance all succeed",
            "100% ok",
            {"by_instances": unaffected},
            ok_others and len(multi) > 0,
            seed,
        )
    )

    # 8-10. ours
    wrong = sum(
        n for p in ran for label, n in p["totals"]["errors"].items() if label in WRONG_OUTPUT
    )
    out.append(
        _criterion(
            "answers_correct",
            "every 200 carries exactly its prompt (streams: the deltas join to it)",
            "0 wrong",
            {"wrong": wrong},
            wrong == 0 and bool(ran),
            ours,
        )
    )
    rates: dict[int, Any] = {}
    ok_rate = bool(ran)
    for p in ran:
        before = p["before_kill"]
        errors = sum(before["errors"].values())
        rates[p["instances"]] = {"errors": errors, "requests": before["sent"]}
        if before["errors"]:
            rates[p["instances"]]["labels"] = before["errors"]
        if before["sent"] == 0 or errors / before["sent"] > prof.ERROR_RATE_LIMIT:
            ok_rate = False
    out.append(
        _criterion(
            "errors_before_kill",
            "explicit errors (503, 504 …) answered before the kill stay rare (requests and "
            "streams)",
            f"<= {prof.ERROR_RATE_LIMIT:.1%} of requests",
            {"by_instances": rates},
            ok_rate,
            ours,
        )
    )
    achieved: dict[int, Any] = {}
    ok_load = bool(ran)
    floor = prof.LOAD_ACHIEVED_MIN
    for p in ran:
        rate = p["requests"]["steady"].get("sent_rate_per_s") or 0.0
        reached = p["concurrency"]["ramp_reached"]
        streams = p["streams"]["mean_concurrent_in_steady"] or 0.0
        achieved[p["instances"]] = {
            "steady_rate_per_s": rate,
            "ramp_concurrency": reached,
            "mean_streams": streams,
            "send_lag_p99_ms": p["requests"]["steady"]["send_lag_ms"]["p99"],
        }
        if rate < floor * profile.rate or reached < floor * profile.concurrency:
            ok_load = False
        if profile.streams and streams < floor * profile.streams:
            ok_load = False
    out.append(
        _criterion(
            "load_generated",
            "the load generator produced the profile: steady rate, ramp concurrency and "
            "concurrent streams",
            f">= {floor:.0%} of {profile.rate:g} req/s, {profile.concurrency} concurrent, "
            f"{profile.streams} streams",
            {"by_instances": achieved},
            ok_load,
            ours,
        )
    )
    return not_chosen(profile, out)


KILL = ("kill_fails_fast", "kill_others_unaffected")
MULTI_INSTANCE = ("hop_p95", "hop_p99", *KILL)


def not_chosen(profile: Profile, out: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A criterion the chosen profile cannot exercise is not judged (``pass`` None), rather
    than failed: ``--instances 1`` runs no hop and no kill, ``--fault-s 0`` no kill."""
    why: dict[str, str] = {}
    if max(profile.phases) < 2:
        why.update(
            dict.fromkeys(MULTI_INSTANCE, "no phase with more than one instance (--instances)")
        )
    elif not profile.any_kill:
        why.update(dict.fromkeys(KILL, "no kill (--fault-s 0)"))
    for c in out:
        if c["id"] in why:
            c["pass"] = None
            c["not_judged"] = why[c["id"]]
    return out


def aims(phases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Our aims: each like a criterion, with ``met`` (None: not measured) instead of ``pass``.
    An aim is not a criterion: the seed's CPU criterion stays ``< 70%`` and the exit code
    depends on the criteria alone."""
    base = next((p for p in phases if p["instances"] == 1 and "error" not in p), None)
    peak = speed.cpu_peak(base) if base is not None else {}
    machine = (base or {}).get("machine_speed") or {}
    limit = prof.CPU_AIM_SHARE * prof.CPU_LIMIT_PCT
    pct = peak.get("pct")
    return [
        {
            "id": "cpu_peak_single_instance",
            "aim": f"the single-instance CPU peak is at most {prof.CPU_AIM_SHARE:g} x the "
            f"seed's {prof.CPU_LIMIT_PCT:g}% bound, on the machine of the run (its speed: the "
            "coordinator's CPU per GET /healthz, measured before the load)",
            "threshold": f"<= {prof.CPU_AIM_SHARE:g} x {prof.CPU_LIMIT_PCT:g}% = {limit:g}%",
            "measured": {
                "cpu_peak_pct": peak.get("pct"),
                "share_of_bound": peak.get("share_of_bound"),
                "bound_pct": prof.CPU_LIMIT_PCT,
                "machine_speed_healthz_cpu_ms": machine.get("healthz_cpu_ms"),
            },
            "met": None if pct is None else pct <= limit,
            "source": "ours, aim",
        }
    ]
