"""rediss:// verified against a private CA (GEMMANET_REDIS_CA_FILE), host name included, and
mutual TLS with a client certificate: real redis-server processes with fixture-made certificates."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterable, AsyncIterator, Callable
from pathlib import Path

import pytest
import trio

from coordinator.coordination import CoordinationUnavailable, create_coordination
from coordinator.errors import SettingsError
from coordinator.settings import Settings
from tests.fixtures.cli import run_cli
from tests.fixtures.private_ca import make_ca
from tests.fixtures.redis_server import RedisServer

pytestmark = pytest.mark.redis

ServerFactory = Callable[..., RedisServer]
ROOT = Path(__file__).resolve().parents[2]


def bare(url: str, host: str = "127.0.0.1") -> str:
    """The fixture URL without coredis's ssl_* query parameters, on ``host``."""
    return url.split("?")[0].replace("127.0.0.1", host)


async def roundtrip(url: str, ca_file: str, **tls: str) -> bytes | None:
    async with create_coordination(url, key_prefix="ca", ca_file=ca_file, **tls) as c:
        # Pub/sub first: its lean client (redis/lean/connection.py) opens its own TLS connections and
        # must verify (or refuse) them exactly as coredis does for everything else.
        async with c.pubsub.subscribe("ch") as inbox:
            assert await c.pubsub.publish("ch", b"over tls") == 1
            with trio.fail_after(2):
                assert [m async for m in _first(inbox)] == [b"over tls"]
        await c.key_value.set("k", b"verified")
        return await c.key_value.get("k")


async def _first(inbox: AsyncIterable[bytes]) -> AsyncIterator[bytes]:
    async for message in inbox:
        yield message
        return


async def test_the_private_ca_verifies_the_server_and_its_host_name(
    redis_server_factory: ServerFactory, tmp_path: Path
) -> None:
    server = redis_server_factory(tls=True)
    assert server.tls_files is not None
    ca = str(server.tls_files.ca)
    assert await roundtrip(bare(server.url), ca) == b"verified"

    stranger = make_ca(tmp_path, "stranger")
    with pytest.raises(CoordinationUnavailable, match="certificate verify failed"):
        await roundtrip(bare(server.url), str(stranger.cert))
    # The certificate names 127.0.0.1 only: the right CA, the wrong name.
    with pytest.raises(CoordinationUnavailable, match="mismatch"):
        await roundtrip(bare(server.url, "localhost"), ca)


async def test_mutual_tls_with_a_client_certificate(redis_server_factory: ServerFactory) -> None:
    server = redis_server_factory("--tls-auth-clients", "yes", tls=True)
    assert server.tls_files is not None
    files = server.tls_files
    with pytest.raises(CoordinationUnavailable):
        await roundtrip(bare(server.url), str(files.ca))
    client = {"cert_file": str(files.client.cert), "key_file": str(files.client.key)}
    assert await roundtrip(bare(server.url), str(files.ca), **client) == b"verified"


def test_tls_settings_are_checked_in_one_line(tmp_path: Path) -> None:
    ca = make_ca(tmp_path, "any")
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("hello\n")
    tls_url = "rediss://127.0.0.1:1/0"
    cases = {
        "needs a rediss://": {"GEMMANET_REDIS_URL": "redis://h:1/0"},
        "go together": {"GEMMANET_REDIS_URL": tls_url, "GEMMANET_REDIS_CERT_FILE": str(ca.cert)},
        "cannot read the file": {
            "GEMMANET_REDIS_URL": tls_url,
            "GEMMANET_REDIS_CA_FILE": str(tmp_path / "absent.pem"),
        },
    }
    for message, env in cases.items():
        env.setdefault("GEMMANET_REDIS_CA_FILE", str(ca.cert))
        with pytest.raises(SettingsError, match=message):
            Settings.from_env(env)
    with pytest.raises(SettingsError, match="not a readable PEM CA certificate"):
        create_coordination(tls_url, ca_file=str(not_pem))


def test_serve_refuses_a_server_signed_by_another_ca_in_one_line(
    redis_server_factory: ServerFactory, tmp_path: Path
) -> None:
    server = redis_server_factory(tls=True)
    stranger = make_ca(tmp_path, "stranger")
    env = {
        **os.environ,
        "GEMMANET_DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite'}",
        "GEMMANET_REDIS_URL": bare(server.url),
        "GEMMANET_REDIS_CA_FILE": str(stranger.cert),
        "GEMMANET_MULTI_INSTANCE": "1",
    }
    done = run_cli("serve", "--port", "0", env=env, timeout=30)
    assert done.returncode != 0
    assert "Traceback" not in done.stderr, done.stderr
    [refusal] = [line for line in done.stderr.splitlines() if line.startswith("gemmanet:")]
    assert "certificate verify failed" in refusal, done.stderr


def test_a_monitor_process_verifies_redis_against_the_private_ca(
    redis_server_factory: ServerFactory, tmp_path: Path
) -> None:
    """``gemmanet monitor`` takes the same TLS settings as ``serve``: with the private CA it is
    elected (without them it would check the server against the system CAs and give up)."""
    server = redis_server_factory(tls=True)
    env = {
        **os.environ,
        "GEMMANET_REDIS_URL": bare(server.url),
        "GEMMANET_REDIS_CA_FILE": str(server.tls_files.ca),  # type: ignore[union-attr]
        "GEMMANET_KEY_PREFIX": "monitor-tls",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "coordinator.cli", "monitor", "--id", "m1", "--events"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        events = [proc.stdout.readline() for _ in range(2)]  # "candidate", then "elected"
        assert '"elected"' in events[1], (events, proc.poll())
    finally:
        proc.terminate()
        proc.wait(timeout=10)
