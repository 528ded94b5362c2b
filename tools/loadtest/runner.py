"""Runs the phases (1, 2, 3 instances), writes report.json and the plots, prints the summary."""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import trio

from tools.bench._harness import (
    BenchError,
    Coordinator,
    Harness,
    Proc,
    cores,
    install_signal_handlers,
    is_interrupt,
    now_text,
    wait_until,
)
from tools.loadtest import analysis, plots, speed, verdicts
from tools.loadtest import profile as prof
from tools.loadtest.journal import JournalReader
from tools.loadtest.load import Load
from tools.loadtest.profile import MODEL, Profile
from tools.loadtest.progress import quiet_libraries, say, show_progress
from tools.loadtest.sampler import Sampler

SETTLE_S = 10.0
_INHERITED = (
    "GEMMANET_REDIS_URL",
    "GEMMANET_REDIS_PASSWORD_FILE",
    "GEMMANET_MULTI_INSTANCE",
    "GEMMANET_BUS",
    "GEMMANET_KEY_PREFIX",
    "GEMMANET_INSTANCE_ID",
)


def closing_line(report: dict[str, Any]) -> str:
    verdict = "all criteria hold" if report["passed"] else "NOT all criteria hold"
    if report["plots"]:
        plotted = "plots " + ", ".join(report["plots"])
    else:
        plotted = "no plots drawn (" + report.get("plots_error", "nothing to plot") + ")"
    return f"  {verdict}; report {report['out']}/report.json; {plotted}"


def _machine() -> dict[str, Any]:
    mem_gb = math.nan
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_gb = int(line.split()[1]) / 2**20
    except OSError:
        pass
    return {"cores": cores(), "memory_gb": mem_gb, "python": sys.version.split()[0]}


def _diag(coord: Coordinator) -> dict[str, Any]:
    try:
        status = coord.http.get("/api/v1/status", timeout=5).json()
    except (httpx.HTTPError, ValueError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {"in_flight": status.get("in_flight"), **(status.get("diagnostics") or {})}


def _settle(coords: dict[str, Coordinator], alive: list[str]) -> dict[str, Any]:
    """After the load: wait (up to SETTLE_S) for the surviving instances to hold no task; what
    is still held then is a leak (tracker or forwarding table)."""
    deadline = time.monotonic() + SETTLE_S
    started = time.monotonic()
    while True:
        diags = {name: _diag(coords[name]) for name in alive}
        held = sum(
            (d.get("local_in_flight") or 0) + (d.get("forwarded_in_flight") or 0)
            for d in diags.values()
        )
        if held == 0 or time.monotonic() >= deadline:
            return {"waited_s": time.monotonic() - started, "held_after": held, "instances": diags}
        time.sleep(0.25)


def _copy_logs(harness: Harness, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for proc in harness.procs:
        try:
            shutil.copyfile(proc.log_path, dest / proc.log_path.name)
        except OSError:
            pass


def run_phase(
    profile: Profile, instances: int, args: argparse.Namespace, out: Path
) -> dict[str, Any]:
    env: dict[str, str] = {
        "GEMMANET_RATE_LIMIT": "100000000/minute",
        "GEMMANET_TASK_TIMEOUT_S": f"{profile.task_timeout_s:g}",
    }
    if args.database_url:
        env["GEMMANET_DATABASE_URL"] = args.database_url
    with Harness(keep=args.keep, **env) as harness:
        try:
            return _phase(harness, profile, instances, args, out)
        finally:
            # Stopped first, so that their logs are complete (Harness.close finds them gone);
            # Redis last, or the coordinators log its loss while they shut down.
            procs = [p for p in reversed(harness.procs) if p.name != "redis"]
            for proc in procs:
                if proc.popen.poll() is None:
                    proc.popen.terminate()
            for proc in procs + [p for p in harness.procs if p.name == "redis"]:
                harness.stop(proc, timeout_s=3.0)
            _copy_logs(harness, out / "logs" / f"{instances}-instances")


def _phase(
    harness: Harness, profile: Profile, instances: int, args: argparse.Namespace, out: Path
) -> dict[str, Any]:
    for name in _INHERITED:
        harness.env.pop(name, None)
    if args.keep:
        say(f"logs and journals in {harness.dir}")
    if instances > 1:
        redis_url = harness.redis()
        harness.env.update(
            GEMMANET_REDIS_URL=redis_url,
            GEMMANET_MULTI_INSTANCE="1",
            GEMMANET_KEY_PREFIX=f"lt{os.getpid()}x{instances}",
        )
    keys = harness.create_keys(profile.clients + profile.streams, prefix=f"lt{instances}")
    request_keys, stream_keys = keys[: profile.clients], keys[profile.clients :]
    node_ids = [f"lt-node-{i:04d}" for i in range(profile.nodes)]
    tokens = harness.enroll_many(node_ids)
    names = [f"I{i}" for i in range(instances)]
    coords = {name: harness.coordinator(name, GEMMANET_INSTANCE_ID=name) for name in names}
    if instances > 1:
        wait_until(
            lambda: all(c.status()["instances"] == instances for c in coords.values()),
            f"{instances} instances to see each other",
        )
    urls = [coords[name].url for name in names]
    # Before the node helpers start: the quietest moment of the phase (see speed.py).
    first = coords[names[0]]
    machine_speed = speed.measure(first.url, first.proc.popen.pid, names[0], profile.speed_s)
    say(
        f"machine speed: {machine_speed['healthz_cpu_ms']:.2f} ms coordinator CPU per /healthz "
        f"({machine_speed['requests']} in {machine_speed['seconds']:.1f} s on {names[0]})"
    )

    # Node i starts on instance i % instances; the helpers take every h-th node.
    helpers: list[Proc] = []
    journals: list[Path] = []
    count = min(profile.helper_processes, profile.nodes)
    for h in range(count):
        journal_path = harness.dir / f"journal-{h}.tsv"
        journals.append(journal_path)
        spec = {
            "urls": urls,
            "nodes": [
                {"node_id": nid, "token": tokens[nid], "url_index": i % instances}
                for i, nid in enumerate(node_ids)
                if i % count == h
            ],
            "models": [MODEL],
            "latency_ms": profile.latency_ms,
            "chunk_delay_ms": profile.chunk_delay_ms,
            "max_parallel": profile.max_parallel,
            "journal": str(journal_path),
            "seed": args.seed * 1000 + instances * 10 + h,
            "failover": True,
            "stagger_s": min(0.02, 2.0 / max(1, profile.nodes)),
        }
        spec_path = harness.dir / f"nodes-{h}.json"
        fd = os.open(spec_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as stream:
            json.dump(spec, stream)
        helpers.append(
            harness.spawn(
                f"nodes-{h}", [sys.executable, "-m", "tools.loadtest.nodes", str(spec_path)]
            )
        )
    expected = {
        name: sum(1 for i in range(profile.nodes) if i % instances == n)
        for n, name in enumerate(names)
    }

    def all_online() -> bool:
        for proc in helpers:
            proc.check_alive()
        return all(
            (c.status().get("diagnostics") or {}).get("local_nodes") == expected[name]
            for name, c in coords.items()
        )

    wait_until(all_online, f"{profile.nodes} nodes online", timeout_s=30 + profile.nodes / 5)
    say(f"{instances} instance(s) up with {profile.nodes} nodes; load starts")

    pids = {name: coords[name].proc.popen.pid for name in names}
    for proc in helpers:
        pids[proc.name] = proc.popen.pid
    for proc in harness.procs:
        if proc.name == "redis":
            pids["redis"] = proc.popen.pid
    pids["loadgen"] = os.getpid()
    reader = JournalReader(journals)
    load = Load(
        profile,
        urls,
        request_keys,
        stream_keys,
        reader,
        [coords[name].proc.popen.pid for name in names],
        kill=profile.kills(instances),
    )

    def on_kill(victim: int, _t: float) -> None:
        say(f"killed instance {names[victim]} (kill -9)")

    async def load_with_progress() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(show_progress, load, instances)
            await load.run(on_kill)
            nursery.cancel_scope.cancel()

    with Sampler(pids) as sampler:
        trio.run(load_with_progress)
        alive = [name for i, name in enumerate(names) if i != load.killed]
        settled = _settle(coords, alive)
    say(f"{instances} instance(s): load done, {len(load.records)} requests")
    for proc in helpers:
        harness.stop(proc)
    reader.poll()
    log_dir = out / "logs" / f"{instances}-instances"
    extra = {
        "after_load": settled,
        "log_lines_with_error": harness.logs_with("ERROR"),
        "log_lines_with_warning": harness.logs_with("WARNING"),
        "logs": str(log_dir),
        "nodes_per_instance_at_start": expected,
        "machine_speed": machine_speed,
    }
    report = analysis.phase_report(profile, instances, load, reader, sampler, names, extra)
    report["cpu_peak"] = speed.cpu_peak(report)
    report["series"] = report.pop("series")  # the long series stay last in report.json
    return report


def _fmt(value: Any, spec: str = ".1f") -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return format(value, spec)
    return str(value)


def print_summary(report: dict[str, Any]) -> None:
    p = report["profile"]
    print(
        f"GemmaNet load test ({p['name']} profile), {report['machine']['cores']} cores, "
        f"{report['date']}"
    )
    print(
        f"  {p['nodes']} nodes (echo {p['latency_ms']} ms, max_parallel {p['max_parallel']}), "
        f"ramp to {p['concurrency']} concurrent, then {p['rate']:g} req/s for "
        f"{p['duration_s']:g} s, {p['streams']} streams of ~{p['stream_s']:g} s alongside"
        + (
            f"; kill -9 of one instance, then {p['fault_s']:g} s more"
            if p["any_kill"]
            else "; no kill"
        )
    )
    print()
    print(
        f"  {'phase':<12}{'sent':>8}{'ok':>8}{'err':>6}{'lost':>6}{'p50 ms':>9}{'p95 ms':>9}"
        f"{'p99 ms':>9}{'remote':>8}  cpu max5s % / rss growth % per instance"
    )
    for ph in report["phases"]:
        label = f"{ph['instances']} inst"
        if "error" in ph:
            print(f"  {label:<12}did not run: {ph['error'].splitlines()[0]}")
            continue
        t = ph["totals"]
        lat = ph["requests"]["steady"]["latency_ms"]
        share = ph["cross_instance"]["remote_share"]
        key = f"cpu_max_{prof.CPU_WINDOW_SAMPLES}s_pct"
        res = "  ".join(
            f"{n} {_fmt(ph['resources_steady'][n][key], '.0f')}/"
            f"{_fmt(ph['resources_steady'][n]['rss_growth_pct'], '+.1f')}"
            for n in ph["coordinators"]
            if n in ph["resources_steady"]
        )
        print(
            f"  {label:<12}{t['sent']:>8}{t['ok']:>8}{sum(t['errors'].values()):>6}"
            f"{sum(t['lost'].values()):>6}{_fmt(lat['p50_ms']):>9}{_fmt(lat['p95_ms']):>9}"
            f"{_fmt(lat['p99_ms']):>9}{_fmt(None if share is None else 100 * share, '.0f'):>7}%"
            f"  {res}"
        )
        if "cpu_peak" in ph:
            print(f"  {'':<12}{speed.phase_line(ph)}")
        if t["errors"] or t["lost"]:
            print(f"  {'':<12}errors {t['errors'] or '-'}  lost {t['lost'] or '-'}")
        kill = ph.get("kill") or {}
        if kill:
            inflight = kill["in_flight_on_its_nodes"]
            print(
                f"  {'':<12}kill -9 I{kill['instance']} at {kill['at_s']:.1f} s: "
                f"{inflight['count']} in-flight tasks on its nodes answered within "
                f"{_fmt(inflight['time_to_answer']['max_s'], '.2f')} s {inflight['outcomes']}; "
                f"{kill['requested_on_it']['count']} requests sent to it dropped; "
                f"others {kill['others']['ok']}/{kill['others']['count']} ok"
                + (
                    f" ({kill['others']['placed_on_killed_after_kill']} failed: placed on its "
                    "nodes after the kill)"
                    if kill["others"].get("placed_on_killed_after_kill")
                    else ""
                )
                + "; "
                f"{kill['nodes_moved']['count']}/{kill['nodes_moved']['of']} nodes moved "
                f"(max {_fmt(kill['nodes_moved']['max_s'], '.1f')} s)"
            )
    print()
    for c in report["criteria"]:
        verdict = {True: "PASS", False: "FAIL", None: "n/a "}[c["pass"]]
        measured = json.dumps(c["measured"], separators=(",", ":"))
        if c["pass"] is None:
            measured = "not judged: " + c["not_judged"]
        if len(measured) > 160:
            measured = measured[:157] + "..."
        print(f"  {verdict}  {c['id']:<24} {c['threshold']:<22} {measured}  [{c['source']}]")
    print()
    print("  aims (ours; reported beside the criteria, the exit code does not depend on them):")
    for aim in report.get("aims", []):
        verdict = {True: "MET ", False: "MISS", None: "n/a "}[aim["met"]]
        m = aim["measured"]
        figures = speed.peak_and_speed(
            {"pct": m["cpu_peak_pct"], "share_of_bound": m["share_of_bound"]},
            {"healthz_cpu_ms": m["machine_speed_healthz_cpu_ms"]},
        )
        print(f"  {verdict}  {aim['id']:<24} {aim['threshold']:<22} {figures}  [{aim['source']}]")
    print()
    print(closing_line(report))


def run(args: argparse.Namespace) -> int:
    base = prof.select(args.quick, args.smoke)
    profile = prof.override(
        base,
        duration_s=args.duration,
        nodes=args.nodes,
        rate=args.rate,
        concurrency=args.concurrency,
        streams=args.streams,
        fault_s=args.fault_s,
        phases=tuple(args.instances) if args.instances else None,
        node_procs=args.node_procs,
    )
    problem = prof.check(profile)
    if problem is not None:
        print(f"gemmanet loadtest: error: {problem}", file=sys.stderr)
        return 2
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(f"gemmanet loadtest: error: cannot create {out}: {exc}", file=sys.stderr)
        return 2
    quiet_libraries()
    install_signal_handlers()
    started = time.monotonic()
    phases: list[dict[str, Any]] = []
    try:
        for instances in profile.phases:
            say(f"phase: {instances} instance(s)")
            try:
                phases.append(run_phase(profile, instances, args, out))
            except BenchError as exc:
                say(f"phase with {instances} instance(s) failed: {exc}")
                phases.append({"instances": instances, "error": str(exc)})
    except BaseException as exc:
        if not is_interrupt(exc):
            raise
        print("gemmanet loadtest: interrupted; processes stopped", file=sys.stderr)
        return 130
    report: dict[str, Any] = {
        "loadtest": "seed 000 §4.1",
        "date": now_text(),
        "machine": _machine(),
        "profile": profile.as_dict(),
        "seconds": time.monotonic() - started,
        "out": str(out),
        "phases": phases,
    }
    report["criteria"] = verdicts.criteria(profile, phases)
    report["passed"] = all(c["pass"] is not False for c in report["criteria"])
    report["aims"] = verdicts.aims(phases)
    try:
        report["plots"] = [p.name for p in plots.write_plots(report, out)]
    except ImportError as exc:
        report["plots"] = []
        report["plots_error"] = f"matplotlib is needed: pip install -e '.[loadtest]' ({exc})"
        print(f"gemmanet loadtest: no plots drawn: {report['plots_error']}", file=sys.stderr)
    (out / "report.json").write_text(
        json.dumps(analysis.clean_json(report), indent=1, sort_keys=False, allow_nan=False) + "\n"
    )
    print_summary(report)
    return 0 if report["passed"] else 1
