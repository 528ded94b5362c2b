"""``gemmanet demo``: one coordinator, a demo API key and one local echo node, ready to curl.

Used by the README's quick start; it runs until Ctrl-C or SIGTERM and then stops both
processes. Its state lives in one directory (``--state-dir``, default
``$XDG_STATE_HOME/gemmanet-demo``, i.e. ``~/.local/state/gemmanet-demo``): the SQLite database
``gemmanet.db``, ``demo-key``, the demo API key, reused on every run while it is valid, and
``demo.lock``, which a running demo holds. A port in use or a state directory another demo
holds is refused in one line before anything is touched; the node's token reaches it in its
environment (``GEMMANET_NODE_TOKEN``), never on a command line."""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

from coordinator.errors import StartupRefused
from coordinator.server.listen import check_port_free
from coordinator.settings import Settings
from coordinator.store import Store
from tools.node_agent.cli import TOKEN_ENV

DEMO_NODE = "demo-node"
DEMO_MODEL = "echo"


def _get_json(url: str) -> dict[str, object]:
    with urllib.request.urlopen(url, timeout=2) as response:
        return json.loads(response.read())  # type: ignore[no-any-return]


def _wait_for(
    predicate: Callable[[], bool],
    what: str,
    server: subprocess.Popen[bytes],
    timeout_s: float = 30.0,
) -> bool:
    """Poll ``predicate`` until it holds (True), or the coordinator has exited (False: it said
    why on stderr, in one line); past ``timeout_s`` a StartupRefused."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            return False
        try:
            if predicate():
                return True
        except (OSError, ValueError, KeyError):  # not up yet, or not answering JSON yet
            pass
        time.sleep(0.2)
    raise StartupRefused(f"timed out after {timeout_s:g} s waiting for {what}")


def default_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME", "").strip()
    return (Path(base) if base else Path.home() / ".local" / "state") / "gemmanet-demo"


def _demo_key(store: Store, key_file: Path) -> str:
    """The demo API key of an earlier run if it still works, else a new one (saved, 0600)."""
    try:
        saved = key_file.read_text().strip()
    except OSError:
        saved = ""
    if saved and store.authenticate_api_key_sync(saved) is not None:
        return saved
    _, api_key = store.create_api_key_sync("demo")
    key_file.touch(mode=0o600)
    key_file.write_text(api_key + "\n")
    return api_key


@contextmanager
def _held(state_dir: Path) -> Iterator[None]:
    """The state directory to this demo alone while it runs: a second ``gemmanet demo`` on it
    would re-enrol the demo node (revoking this one's token) and share its database. An
    advisory lock on ``demo.lock``, released by the kernel however the process ends."""
    fd = os.open(state_dir / "demo.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            raise StartupRefused(
                f"another gemmanet demo (pid {holder}) is running on {state_dir}: stop it "
                "first, or give this one another --state-dir"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)


def _stop_on_sigterm(signum: int, frame: FrameType | None) -> None:
    # SIGTERM takes the same way out as Ctrl-C, so the children are stopped too.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt


def run_demo(*, host: str, port: int, state_dir: Path | None = None) -> int:
    state_dir = state_dir or default_state_dir()
    # Refused before anything is touched: a port in use (another demo, another server) ...
    check_port_free(host, port)
    state_dir.mkdir(parents=True, exist_ok=True)
    # ... or another demo running on the same state directory, on any port.
    with _held(state_dir):
        return _run(host, port, state_dir)


def _run(host: str, port: int, state_dir: Path) -> int:
    database_url = f"sqlite:///{(state_dir / 'gemmanet.db').resolve()}"
    Settings.from_env({**os.environ, "GEMMANET_DATABASE_URL": database_url})
    store = Store.open(database_url)
    try:
        api_key = _demo_key(store, state_dir / "demo-key")
        token = store.enroll_node_sync(DEMO_NODE)
    finally:
        store.close()
    print(f"demo state (database and API key): {state_dir}", flush=True)
    base = f"http://{host}:{port}"
    cli = [sys.executable, "-m", "coordinator.cli"]
    env = {**os.environ, "GEMMANET_DATABASE_URL": database_url}
    previous = signal.signal(signal.SIGTERM, _stop_on_sigterm)
    # "Press Ctrl-C to stop" must hold even when the demo was started with SIGINT ignored (a
    # process started in the background by a non-interactive shell inherits that, and Python
    # then leaves SIGINT ignored): Ctrl-C, or kill -INT, takes the same way out as SIGTERM.
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    server = node = None
    try:
        server = subprocess.Popen([*cli, "serve", "--host", host, "--port", str(port)], env=env)
        if not _wait_for(
            lambda: _get_json(f"{base}/healthz").get("ok") is True, "the coordinator", server
        ):
            return server.returncode or 1
        # The token reaches the node in its environment, not on its command line (ps).
        node = subprocess.Popen(
            [
                *cli,
                "node",
                "--coordinator",
                base,
                "--node-id",
                DEMO_NODE,
                "--model",
                DEMO_MODEL,
                "--backend",
                "echo",
            ],
            env={**env, TOKEN_ENV: token},
        )
        if not _wait_for(
            lambda: int(_get_json(f"{base}/api/v1/status")["online_nodes"]) >= 1,  # type: ignore[call-overload]
            "the demo node",
            server,
        ):
            return server.returncode or 1
        body = json.dumps({"model": DEMO_MODEL, "prompt": "hello from gemmanet"})
        print("\nGemmaNet is running. Try it from another terminal:\n", flush=True)
        print(
            f"curl -s -H {shlex.quote('Authorization: Bearer ' + api_key)} "
            f"-H 'Content-Type: application/json' -d {shlex.quote(body)} {base}/api/v1/request",
            flush=True,
        )
        print("\nPress Ctrl-C to stop.", flush=True)
        server.wait()
        return server.returncode or 0
    except KeyboardInterrupt:
        return 0
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        for proc in (node, server):
            if proc is not None and proc.poll() is None:
                proc.terminate()
        for proc in (node, server):
            if proc is not None:
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)
