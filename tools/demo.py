"""``gemmanet demo``: one coordinator, a demo API key and one local echo node, ready to curl.

Used by the README's quick start; it runs until Ctrl-C and then stops both processes."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
import urllib.request

from coordinator.settings import Settings
from coordinator.store import Store

DEMO_NODE = "demo-node"
DEMO_MODEL = "echo"


def _get_json(url: str) -> dict[str, object]:
    with urllib.request.urlopen(url, timeout=2) as response:
        return json.loads(response.read())  # type: ignore[no-any-return]


def _wait_for(predicate, what: str, timeout_s: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"timed out waiting for {what}")


def run_demo(*, host: str, port: int) -> int:
    settings = Settings.from_env()
    store = Store.open(settings.database_url)
    try:
        _, api_key = store.create_api_key_sync("demo")
        token = store.enroll_node_sync(DEMO_NODE)
    finally:
        store.close()
    base = f"http://{host}:{port}"
    cli = [sys.executable, "-m", "coordinator.cli"]
    server = subprocess.Popen([*cli, "serve", "--host", host, "--port", str(port)])
    node = None
    try:
        _wait_for(lambda: _get_json(f"{base}/healthz").get("ok") is True, "the coordinator")
        node = subprocess.Popen(
            [
                *cli,
                "node",
                "--coordinator",
                base,
                "--node-id",
                DEMO_NODE,
                "--token",
                token,
                "--model",
                DEMO_MODEL,
                "--backend",
                "echo",
            ]
        )
        _wait_for(
            lambda: int(_get_json(f"{base}/api/v1/status")["online_nodes"]) >= 1,  # type: ignore[call-overload]
            "the demo node",
        )
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
        for proc in (node, server):
            if proc is not None and proc.poll() is None:
                proc.terminate()
        for proc in (node, server):
            if proc is not None:
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
