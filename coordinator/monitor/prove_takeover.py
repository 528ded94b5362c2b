"""``gemmanet prove-takeover --repeat N --handover-gate strict``: prove, against the configured
Redis, that a paused primary monitor is replaced inside the staleness window and that its
writes, once it resumes with its old fencing token, are all rejected.

It serves, in this process, an Ollama host that only lists models (``ollama_listing``: the
real ``/api/ps`` and ``/api/tags`` wire formats), writes a one-host operator file, and runs N
times (``takeover_run``) under a key prefix of its own
(``<GEMMANET_KEY_PREFIX>:prove-takeover:<random>:<run>``), so it never touches a production
monitor's lease or facts; the run's keys are deleted at the end. The children get
this process's environment, so GEMMANET_MONITOR_* timings (and the test-only
GEMMANET_MONITOR_UNFENCED) apply to them.

Gate ``strict``: every run has zero owner loss before the stop, zero successful writes from the
deposed owner, at least one attempted (or the run proved nothing), and a handover no longer
than GEMMANET_RESIDENCY_STALE_S. Exit code 0 only when the gate passes.

``--against-deployed`` runs the same gate once on the monitors that really run, under the
configured prefix (``deployed_takeover.py``).
"""

from __future__ import annotations

import os
import secrets
import sys
import tempfile
from functools import partial

import trio

from coordinator.coordination.base import CoordinationUnavailable
from coordinator.coordination.factory import create_coordination
from coordinator.coordination.keys import (
    MONITOR_EPOCH,
    MONITOR_FACTS,
    MONITOR_FACTS_AT,
    MONITOR_FENCED_REJECTS,
    MONITOR_LEASE,
    monitor_accepted_key,
)
from coordinator.coordination.memory.coordination import MemoryCoordination
from coordinator.coordination.redis.coordination import RedisCoordination
from coordinator.errors import SettingsError, StartupRefused
from coordinator.monitor.deployed_takeover import DeployedTakeover
from coordinator.monitor.ollama_listing import OllamaListingHost
from coordinator.monitor.takeover_run import RunResult, TakeoverRun
from coordinator.monitor.timing import check_monitor_bound, monitor_bound_sum
from coordinator.settings import Settings

__all__ = ["describe_run", "run_prove_takeover"]

HOST_ID = "prove-takeover-ollama"


def describe_run(number: int, total: int, result: RunResult, window_s: float) -> str:
    handover = "none" if result.handover_s is None else f"{result.handover_s:.3f} s"
    verdict = "ok" if result.passes(window_s) else "FAIL"
    line = (
        f"run {number}/{total}: handover {handover} (window {window_s:g} s); "
        f"owner loss before stop {result.owner_loss}; deposed owner writes: "
        f"{result.deposed_attempts} attempted, {result.deposed_rejected} rejected "
        f"(fenced_rejects +{result.fenced_rejects_counted}), "
        f"{result.deposed_succeeded} SUCCEEDED; {verdict}"
    )
    if result.problems:
        line += " (" + "; ".join(result.problems) + ")"
    return line


async def _cleanup(settings: Settings, prefix: str, epochs: int) -> None:
    coordination = _coordination(settings, prefix)
    async with coordination:
        key_value = coordination.key_value
        for key in (
            MONITOR_LEASE,
            MONITOR_EPOCH,
            MONITOR_FENCED_REJECTS,
            MONITOR_FACTS,
            MONITOR_FACTS_AT,
        ):
            await key_value.delete(key)
        for epoch in range(1, epochs + 1):
            await key_value.delete(monitor_accepted_key(epoch))


async def _prove(settings: Settings, repeat: int, workdir: str) -> list[RunResult]:
    probe = _coordination(settings, "probe")
    async with probe:
        await probe.ping()  # one line now rather than N failed runs

    host = OllamaListingHost(models=["gemma3:4b"], resident={"gemma3:4b": 3_300_000_000})
    results: list[RunResult] = []
    base = f"{settings.key_prefix}:prove-takeover:{secrets.token_hex(3)}"
    async with trio.open_nursery() as nursery:
        url = await nursery.start(partial(host.run, port=0))
        capacity_file = os.path.join(workdir, "hosts.toml")
        with open(capacity_file, "w", encoding="utf-8") as handle:  # noqa: ASYNC230 - tiny
            handle.write(f'[hosts."{HOST_ID}"]\nurl = "{url}"\nkind = "ollama"\n')
        for number in range(1, repeat + 1):
            prefix = f"{base}:{number}"
            env = dict(os.environ)
            env |= {"GEMMANET_KEY_PREFIX": prefix, "GEMMANET_CAPACITY_FILE": capacity_file}
            env.pop("GEMMANET_MONITOR", None)
            coordination = _coordination(settings, prefix)
            async with coordination:
                run = TakeoverRun(
                    coordination.monitor,
                    HOST_ID,
                    env,
                    workdir,
                    number=number,
                    poll_s=settings.monitor_poll_s,
                    ttl_s=settings.monitor_ttl_s,
                    window_s=settings.residency_stale_s,
                )
                result = await run.execute()
                epochs = (await coordination.monitor.monitor_status()).epoch
            with trio.CancelScope(shield=True):
                await _cleanup(settings, prefix, epochs)
            results.append(result)
            print(describe_run(number, repeat, result, settings.residency_stale_s), flush=True)
        nursery.cancel_scope.cancel()
    return results


async def _prove_deployed(
    settings: Settings, primary: str, pid: int | None, timeout_s: float
) -> RunResult:
    coordination = _coordination(settings, settings.key_prefix)
    async with coordination:
        await coordination.ping()
        proof = DeployedTakeover(
            coordination.monitor,
            settings,
            primary=primary,
            pid=pid,
            timeout_s=timeout_s,
            say=lambda line: print(f"prove-takeover: {line}", flush=True),
        )
        return await proof.execute()


def _check_deployed(settings: Settings, primary: str | None, pid: int | None) -> str:
    if not primary:
        raise SettingsError("--against-deployed needs --primary ID: the monitor to stop")
    if pid is not None and pid <= 1:
        raise SettingsError(f"--pid {pid}: not a process this command may stop")
    if not settings.capacity.hosts:
        raise SettingsError(
            "--against-deployed needs the monitors' operator file (GEMMANET_CAPACITY_FILE with "
            "[hosts]): the facts it checks are those of its hosts"
        )
    return primary


def run_prove_takeover(
    settings: Settings,
    *,
    repeat: int,
    gate: str,
    against_deployed: bool = False,
    primary: str | None = None,
    pid: int | None = None,
    timeout_s: float = 300.0,
) -> int:
    if gate != "strict":
        raise SettingsError(f"--handover-gate {gate!r}: only 'strict' exists")
    if not 1 <= repeat <= 100:
        raise SettingsError("--repeat must be from 1 to 100")
    if not settings.redis_url:
        raise SettingsError(
            "prove-takeover needs GEMMANET_REDIS_URL: it runs real monitor processes against Redis"
        )
    check_monitor_bound(settings)
    window = settings.residency_stale_s
    if against_deployed:
        name = _check_deployed(settings, primary, pid)
        print(f"prove-takeover: the deployed monitors, window {window:g} s", flush=True)
        try:
            result = trio.run(_prove_deployed, settings, name, pid, timeout_s)
        except* CoordinationUnavailable as group:
            first_error: BaseException = group
            while isinstance(first_error, BaseExceptionGroup):
                first_error = first_error.exceptions[0]
            raise StartupRefused(f"prove-takeover: Redis is unreachable: {first_error}") from None
        print(describe_run(1, 1, result, window), flush=True)
        verdict = "PASS" if result.passes(window) else "FAIL"
        print(f"handover gate strict on the deployed monitors: {verdict}", flush=True)
        return 0 if verdict == "PASS" else 1
    print(
        f"prove-takeover: {repeat} run(s), staleness window {window:g} s, "
        f"timing bound {monitor_bound_sum(settings)}"
        + (" [TEST-ONLY: fencing switched off]" if settings.monitor_unfenced else ""),
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="gemmanet-prove-takeover-") as workdir:
        try:
            results = trio.run(_prove, settings, repeat, workdir)
        except* CoordinationUnavailable as group:
            first: BaseException = group
            while isinstance(first, BaseExceptionGroup):
                first = first.exceptions[0]
            raise StartupRefused(f"prove-takeover: Redis is unreachable: {first}") from None
    failed = [n for n, r in enumerate(results, 1) if not r.passes(window)]
    succeeded = sum(r.deposed_succeeded for r in results)
    loss = sum(r.owner_loss for r in results)
    if failed:
        print(
            f"handover gate strict: FAIL (runs {', '.join(map(str, failed))} of {repeat}; "
            f"deposed writes succeeded {succeeded}, owner loss {loss})",
            flush=True,
        )
        return 1
    print(
        f"handover gate strict: PASS ({repeat}/{repeat} runs; deposed writes succeeded 0, "
        "owner loss 0)",
        flush=True,
    )
    sys.stdout.flush()
    return 0


def _coordination(settings: Settings, key_prefix: str) -> MemoryCoordination | RedisCoordination:
    """A connection to the configured Redis as an instance makes it (password, TLS)."""
    return create_coordination(
        settings.redis_url,
        password_file=settings.redis_password_file,
        key_prefix=key_prefix,
        ca_file=settings.redis_ca_file,
        cert_file=settings.redis_cert_file,
        key_file=settings.redis_key_file,
    )
