"""The ACL rules as written down: ``gemmanet redis-acl`` and ``deploy/redis/acl.conf`` give the
same rights, and a real redis-server loads the file (the e2e test proves the rights suffice)."""

from __future__ import annotations

import re
import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from coordinator.cli import main
from coordinator.coordination.redis.acl import instance_acl_rules
from tests.fixtures.redis_server import RedisServer, _resp_command

ServerFactory = Callable[..., RedisServer]
ACL_FILE = Path(__file__).resolve().parents[2] / "deploy" / "redis" / "acl.conf"


def test_cli_prints_the_setuser_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["redis-acl", "--user", "gemmanet-a", "--prefix", "blue"]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith("ACL SETUSER gemmanet-a reset ~blue:* &blue:* -@all +hello ")
    assert line.endswith(" on ><password>") and "+client|setinfo" not in line
    assert main(["redis-acl", "--user", "x", "--redis-version", "7.2"]) == 0
    assert "+client|setinfo" in capsys.readouterr().out
    assert main(["redis-acl", "--user", "c", "--prefix", "blue", "--cluster"]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith("ACL SETUSER c reset ~{blue}:* &{blue}:* -@all +hello ")
    assert "+spublish" in line and "+cluster|slots" in line and "+wait" not in line
    assert main(["redis-acl", "--user", "s", "--sentinel"]) == 0
    line = capsys.readouterr().out.strip()
    assert " ~gn:* " in line and "+role +wait" in line and "+spublish" not in line
    assert main(["redis-acl", "--user", "bad name"]) == 2
    assert "user name" in capsys.readouterr().err


def test_the_acl_file_matches_the_generated_rules_and_loads(
    redis_server_factory: ServerFactory, tmp_path: Path
) -> None:
    text = ACL_FILE.read_text()
    expected = " ".join(instance_acl_rules("gn")[1:])  # without "reset"
    users = re.findall(r"^user (gemmanet-\w) on ><password-\w> (.*)$", text, re.MULTILINE)
    assert [u for u, _ in users] == ["gemmanet-a", "gemmanet-b"]
    assert all(rules == expected for _, rules in users), users
    loaded = tmp_path / "users.acl"
    loaded.write_text(text.replace("<password-a>", "secret-a").replace("<password-", "pw-"))
    server = redis_server_factory("--aclfile", str(loaded))
    payload = _resp_command("AUTH", "gemmanet-a", "secret-a") + _resp_command("SET", "gn:k", "v")
    payload += _resp_command("FLUSHALL")
    with socket.create_connection(("127.0.0.1", server.port), timeout=2) as sock:
        sock.sendall(payload)
        sock.shutdown(socket.SHUT_WR)
        reply = b"".join(iter(lambda: sock.recv(65536), b""))
    assert reply.startswith(b"+OK\r\n+OK\r\n-NOPERM"), reply


def test_every_command_a_lua_script_calls_is_granted() -> None:
    """A script that calls a command the rules leave out fails with NOPERM only when it runs,
    perhaps long after start-up: every ``redis.call('X'`` in the code must be in the list."""
    from coordinator.coordination.redis.acl import INSTANCE_COMMANDS

    root = Path(__file__).resolve().parents[2] / "coordinator"
    called = {
        name.lower()
        for path in root.rglob("*.py")
        for name in re.findall(r"redis\.call\(\s*['\"]([A-Za-z]+)['\"]", path.read_text())
    }
    assert called, "no Lua script found"
    assert called - {c.split("|")[0] for c in INSTANCE_COMMANDS} == set()
