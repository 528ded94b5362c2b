"""What both benchmarks share: their processes (coordinators, echo node agents, a private
redis-server), percentiles and the report header.

Processes run in their own sessions (a Ctrl-C in the terminal reaches only the benchmark, which
then stops them itself), log into a temporary directory, and are stopped — SIGTERM, then SIGKILL
— when the ``Harness`` is left, however it is left. SIGTERM to the benchmark is turned into
KeyboardInterrupt so it cleans up too.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Self

import httpx

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "coordinator.cli"]
LOOPBACK = "127.0.0.1"


class BenchError(RuntimeError):
    """The benchmark could not set itself up (a process died or never became ready)."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def now_text() -> str:
    return _dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")


def header_line() -> str:
    return f"figures measured on {cores()} cores, {now_text()}"


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (q in 0..100); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summary_ms(latencies_s: Sequence[float]) -> dict[str, float]:
    return {
        "p50_ms": percentile(latencies_s, 50) * 1000,
        "p95_ms": percentile(latencies_s, 95) * 1000,
        "p99_ms": percentile(latencies_s, 99) * 1000,
        "max_ms": (max(latencies_s) * 1000) if latencies_s else math.nan,
    }


def error_label(response: httpx.Response) -> str:
    try:
        code = response.json()["error"]["code"]
    except Exception:  # noqa: BLE001 - any body that is not our error shape
        code = "?"
    return f"{response.status_code} {code}"


def write_json(path: str | None, report: dict[str, Any]) -> None:
    if path:
        Path(path).write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")


def _raise_keyboard_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def is_interrupt(exc: BaseException) -> bool:
    """Ctrl-C / SIGTERM, also when trio delivered it inside one of its tasks (wrapped)."""
    if isinstance(exc, KeyboardInterrupt):
        return True
    return isinstance(exc, BaseExceptionGroup) and exc.subgroup(KeyboardInterrupt) is not None


def exit_code_for(benchmark: str, exc: BaseException) -> int:
    """What a benchmark that ``exc`` ended exits with: 1 with the reason of a BenchError, 130
    for an interrupt (its processes are stopped by the harness); anything else is a bug and is
    raised again."""
    if isinstance(exc, BenchError):
        print(f"{benchmark} benchmark failed: {exc}", file=sys.stderr)
        return 1
    if is_interrupt(exc):
        print("interrupted; processes stopped", file=sys.stderr)
        return 130
    raise exc


def install_signal_handlers() -> None:
    """Ctrl-C and SIGTERM both become KeyboardInterrupt (so the children get stopped), even
    when started from a shell that ignores SIGINT in background jobs."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)


def wait_until(predicate: Callable[[], Any], what: str, timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except BenchError:
            raise
        except Exception as exc:  # noqa: BLE001 - keep polling, report the last one
            last = exc
        time.sleep(0.05)
    raise BenchError(f"timed out waiting for {what} (last error: {last!r})")


class Proc:
    def __init__(self, name: str, popen: subprocess.Popen[bytes], log_path: Path) -> None:
        self.name = name
        self.popen = popen
        self.log_path = log_path

    def check_alive(self) -> None:
        if self.popen.poll() is not None:
            raise BenchError(
                f"{self.name} exited with {self.popen.returncode}; log tail:\n{self.log_tail()}"
            )

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"


class Coordinator:
    def __init__(self, proc: Proc, url: str, probe_key: str) -> None:
        self.proc = proc
        self.url = url
        self.probe_key = probe_key
        self.http = httpx.Client(base_url=url, timeout=10)

    def healthy(self) -> bool:
        self.proc.check_alive()
        return bool(self.http.get("/healthz").json() == {"ok": True})

    def status(self) -> dict[str, Any]:
        self.proc.check_alive()
        return self.http.get("/api/v1/status").json()  # type: ignore[no-any-return]

    def nodes(self) -> list[dict[str, Any]]:
        self.proc.check_alive()
        response = self.http.get(
            "/api/v1/nodes", headers={"Authorization": f"Bearer {self.probe_key}"}
        )
        return response.json()["nodes"]  # type: ignore[no-any-return]

    def close(self) -> None:
        self.http.close()


class Harness:
    """Temp directory, SQLite database and every child process of one benchmark run."""

    def __init__(self, *, keep: bool = False, **env: str) -> None:
        self.keep = keep
        self.dir = Path(tempfile.mkdtemp(prefix="gn-bench-"))
        self.env = {
            **os.environ,
            "GEMMANET_DATABASE_URL": f"sqlite:///{self.dir / 'gemmanet.db'}",
            "PYTHONUNBUFFERED": "1",
            **env,
        }
        self.env.pop("GEMMANET_NODE_TOKEN", None)
        self.procs: list[Proc] = []
        self.coordinators: list[Coordinator] = []
        self.probe_key = ""

    def __enter__(self) -> Self:
        self.probe_key = self.create_key("bench-probe")
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- keys ---------------------------------------------------------------------------------

    def create_key(self, name: str) -> str:
        from coordinator.store import Store

        with Store.open(self.env["GEMMANET_DATABASE_URL"]) as store:
            return store.create_api_key_sync(name)[1]

    def create_keys(self, count: int, prefix: str = "bench") -> list[str]:
        from coordinator.store import Store

        with Store.open(self.env["GEMMANET_DATABASE_URL"]) as store:
            return [store.create_api_key_sync(f"{prefix}-{i}")[1] for i in range(count)]

    def enroll(self, node_id: str) -> str:
        from coordinator.store import Store

        with Store.open(self.env["GEMMANET_DATABASE_URL"]) as store:
            return store.enroll_node_sync(node_id)

    def enroll_many(self, node_ids: Iterable[str]) -> dict[str, str]:
        """Node tokens for many identities through one store connection (node id -> token)."""
        from coordinator.store import Store

        with Store.open(self.env["GEMMANET_DATABASE_URL"]) as store:
            return {node_id: store.enroll_node_sync(node_id) for node_id in node_ids}

    # -- processes ----------------------------------------------------------------------------

    def spawn(self, name: str, args: list[str], env: dict[str, str] | None = None) -> Proc:
        log_path = self.dir / f"{len(self.procs):02d}-{name}.log"
        with log_path.open("wb") as log:
            popen = subprocess.Popen(
                args,
                cwd=ROOT,
                env=env or self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        proc = Proc(name, popen, log_path)
        self.procs.append(proc)
        return proc

    def redis(self) -> str:
        """Start a private redis-server (nothing on disk); returns its URL."""
        binary = shutil.which("redis-server")
        if binary is None:
            raise BenchError("redis-server not found on PATH (apt-get install redis-server)")
        last = ""
        for _attempt in range(3):
            port = free_port()
            proc = self.spawn(
                "redis",
                [
                    binary, "--bind", LOOPBACK, "--port", str(port), "--save", "",
                    "--appendonly", "no", "--dir", str(self.dir), "--daemonize", "no",
                    "--protected-mode", "no",
                ],
            )  # fmt: skip
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and proc.popen.poll() is None:
                if _redis_answers(port):
                    return f"redis://{LOOPBACK}:{port}/0"
                time.sleep(0.02)
            last = proc.log_tail()
            self._stop(proc)
        raise BenchError(f"redis-server did not start; log tail:\n{last}")

    def coordinator(self, name: str, **env: str) -> Coordinator:
        port = free_port()
        proc = self.spawn(
            name,
            [*CLI, "serve", "--host", LOOPBACK, "--port", str(port)],
            {**self.env, **env},
        )
        coord = Coordinator(proc, f"http://{LOOPBACK}:{port}", self.probe_key)
        self.coordinators.append(coord)
        wait_until(coord.healthy, f"{name} to answer /healthz (log {proc.log_path})")
        return coord

    def node(
        self,
        coord: Coordinator,
        node_id: str,
        models: Iterable[str],
        *,
        max_parallel: int = 64,
        latency_ms: int = 0,
    ) -> Proc:
        token = self.enroll(node_id)
        args = [*CLI, "node", "--coordinator", coord.url, "--node-id", node_id, "--backend",
                "echo", "--latency-ms", str(latency_ms), "--max-parallel", str(max_parallel)]  # fmt: skip
        for model in models:
            args += ["--model", model]
        # The token travels in the environment, not on the (world-readable) command line.
        proc = self.spawn(f"node-{node_id}", args, {**self.env, "GEMMANET_NODE_TOKEN": token})

        def online() -> bool:
            proc.check_alive()
            return any(n["node_id"] == node_id for n in coord.nodes())

        wait_until(online, f"node {node_id} online (log {proc.log_path})")
        return proc

    def stop(self, proc: Proc, timeout_s: float = 5.0) -> int | None:
        """SIGTERM one process and wait for it (SIGKILL after ``timeout_s``); its exit code."""
        self._stop(proc)
        try:
            return proc.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.popen.kill()
            try:
                return proc.popen.wait(timeout=5)
            except subprocess.TimeoutExpired:
                return None

    def _stop(self, proc: Proc) -> None:
        if proc.popen.poll() is None:
            try:
                proc.popen.send_signal(signal.SIGCONT)
                proc.popen.terminate()
            except ProcessLookupError:
                pass

    def close(self) -> None:
        for coord in self.coordinators:
            coord.close()
        # Nodes first (so they do not spin reconnecting), then coordinators, then Redis.
        for proc in reversed(self.procs):
            self._stop(proc)
        deadline = time.monotonic() + 3.0
        for proc in reversed(self.procs):
            try:
                proc.popen.wait(timeout=max(0.05, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.popen.kill()
                try:
                    proc.popen.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
        if not self.keep:
            shutil.rmtree(self.dir, ignore_errors=True)

    def logs_with(self, needle: str) -> dict[str, int]:
        """How many lines of each coordinator or node log mention ``needle`` (for the report)."""
        found: dict[str, int] = {}
        for proc in self.procs:
            if proc.name == "redis":
                continue
            try:
                text = proc.log_path.read_text(errors="replace")
            except OSError:
                continue
            count = sum(1 for line in text.splitlines() if needle in line)
            if count:
                found[proc.name] = count
        return found


def _redis_answers(port: int) -> bool:
    try:
        with socket.create_connection((LOOPBACK, port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of one process so far (Linux /proc); NaN when unknown."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICKS
    except (OSError, IndexError, ValueError):
        return math.nan


def cpu_split(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of one process so far (Linux /proc); NaNs when unknown."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[11]) / _TICKS, int(fields[12]) / _TICKS
    except (OSError, IndexError, ValueError):
        return math.nan, math.nan


def rss_bytes(pid: int) -> float:
    """Resident set size of one process now (Linux /proc); NaN when unknown (e.g. it exited)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return float(line.split()[1]) * 1024.0  # reported in kB
    except (OSError, IndexError, ValueError):
        pass
    return math.nan


def fmt_ms(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:8.2f}"
