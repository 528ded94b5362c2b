"""Separate Redis identities (docs/redis.md "Redis identities and TLS"): each instance connects as its
own ACL user, with exactly the rights ``gemmanet redis-acl`` prints.

Two real coordinator processes, each with its own user made over a raw admin connection, run
the cross-instance flow on both buses; a missing command would show up as a failed request or
in the server's ``ACL LOG``. Deleting A's user then cuts A off alone."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import httpx
import pytest
import trio

from coordinator.coordination.redis.acl import instance_acl_rules, parse_version
from tests.fixtures.processes import Coordinator, Processes, wait_until
from tests.fixtures.redis_server import RedisServer

pytestmark = [pytest.mark.e2e, pytest.mark.redis]

ADMIN_PASSWORD = "admin-only-secret"


def make_user(server: RedisServer, tmp_path: Path, user: str, prefix: str) -> Path:
    """ACL SETUSER with the generated rules, over the admin's raw connection; the password
    goes to a file, as GEMMANET_REDIS_PASSWORD_FILE wants it."""
    password = f"pw-{user}-{os.urandom(6).hex()}"
    info = server.raw_command("INFO", "server").decode()
    version = parse_version(info.split("redis_version:")[1].split()[0])
    reply = server.raw_command(
        "ACL", "SETUSER", user, *instance_acl_rules(prefix, version), "on", ">" + password
    )
    assert reply == b"+OK\r\n", reply
    path = tmp_path / f"{user}.password"
    path.write_text(password + "\n")
    return path


def as_user(server: RedisServer, user: str, password_file: Path, *command: str) -> bytes:
    """One command as ``user`` over a raw socket (never through the code under test)."""
    from tests.fixtures.redis_server import _resp_command

    payload = _resp_command("AUTH", user, password_file.read_text().strip())
    payload += _resp_command(*command)
    with socket.create_connection(("127.0.0.1", server.port), timeout=2) as sock:
        sock.sendall(payload)
        sock.shutdown(socket.SHUT_WR)
        reply = b"".join(iter(lambda: sock.recv(65536), b""))
    assert reply.startswith(b"+OK\r\n"), reply  # the AUTH
    return reply.removeprefix(b"+OK\r\n")


def acl_log(server: RedisServer) -> bytes:
    return server.raw_command("ACL", "LOG")


async def post(coord: Coordinator, key: str, **body: object) -> httpx.Response:
    async with httpx.AsyncClient(base_url=coord.url, timeout=60) as client:
        return await client.post(
            "/api/v1/request", json=body, headers={"Authorization": f"Bearer {key}"}
        )


def start_two(
    procs: Processes, server: RedisServer, tmp_path: Path, bus: str, prefix: str
) -> tuple[Coordinator, Coordinator, dict[str, Path]]:
    files = {user: make_user(server, tmp_path, user, prefix) for user in ("inst-a", "inst-b")}
    procs.share_redis(server, prefix, GEMMANET_BUS=bus)
    plain = server.url.removeprefix("redis://")

    def instance(user: str, instance_id: str) -> Coordinator:
        return procs.coordinator(
            GEMMANET_INSTANCE_ID=instance_id,
            GEMMANET_REDIS_URL=f"redis://{user}@{plain}",
            GEMMANET_REDIS_PASSWORD_FILE=str(files[user]),
        )

    a = instance("inst-a", "A")
    b = instance("inst-b", "B")
    wait_until(lambda: a.status()["instances"] == 2 and b.status()["instances"] == 2, "2 instances")
    return a, b, files


@pytest.mark.parametrize("bus", ["pubsub", "streams"])
async def test_own_users_suffice_for_the_cluster_and_are_revocable_one_by_one(
    procs: Processes, redis_server_factory, tmp_path: Path, bus: str
) -> None:
    server = redis_server_factory(password=ADMIN_PASSWORD)
    a, b, _ = start_two(procs, server, tmp_path, bus, f"acl{os.getpid()}")
    # One request at a time on A's node: a burst waits in the admission queue (leases).
    procs.node(a, "on-a", models=("echo",), extra=("--max-parallel", "1", "--latency-ms", "150"))
    procs.node(a, "slow-a", models=("slow",), extra=("--latency-ms", "8000"))
    procs.node(b, "on-b", models=("echo-b",))
    wait_until(lambda: b.has_node("slow-a") and a.has_node("on-b"), "both see both nodes")
    key = procs.create_key("client")

    single = b.request(key, model="echo", prompt="across the bus")
    assert single.status_code == 200 and single.json()["node_id"] == "on-a", single.text
    prompt = "several words stream across instances"
    streamed = b.request(key, model="echo", prompt=prompt, stream=True)
    events = [json.loads(x[6:]) for x in streamed.text.split("\n\n") if x.strip()]
    assert events[-1]["done"] is True and events[-1]["output"] == prompt, streamed.text
    burst: list[httpx.Response] = []
    async with trio.open_nursery() as nursery:
        for i in range(4):
            coord = a if i % 2 else b

            async def one(coord: Coordinator = coord, i: int = i) -> None:
                burst.append(await post(coord, key, model="echo", prompt=f"q{i}"))

            nursery.start_soon(one)
    assert [r.status_code for r in burst] == [200] * 4, [r.text for r in burst]
    assert a.request(key, model="echo-b", prompt="to B's node").status_code == 200
    # Nothing was refused along the way, even where the code would shrug a refusal off.
    assert acl_log(server) == b"*0\r\n", acl_log(server)

    # Revoke A alone, with a request of B's client in flight on A's node.
    in_flight: list[httpx.Response] = []
    async with trio.open_nursery() as nursery:

        async def long_one() -> None:
            in_flight.append(await post(b, key, model="slow", prompt="cut"))

        nursery.start_soon(long_one)
        await trio.sleep(1.0)
        assert server.raw_command("ACL", "DELUSER", "inst-a") == b":1\r\n"
        revoked_at = time.monotonic()
    [cut] = in_flight
    # It fails explicitly and promptly (A is gone for B once its beat expires, ~2.5 s; the
    # node would answer only 7 s from now), not hangs...
    assert time.monotonic() - revoked_at < 5.0, time.monotonic() - revoked_at
    assert cut.status_code in (502, 503), cut.text
    assert cut.json()["error"]["code"], cut.text
    # ...A answers 503 from now on, and B goes on serving its own node.
    wait_until(lambda: a.request(key, model="echo-b", prompt="x").status_code == 503, "A refuses")
    for _ in range(3):
        served = b.request(key, model="echo-b", prompt="still here")
        assert served.status_code == 200 and served.json()["node_id"] == "on-b", served.text
    wait_until(lambda: b.status()["instances"] == 1, "B counts one instance", timeout_s=5)


def test_an_instance_user_has_its_own_keys_and_commands_only(
    redis_server_factory, tmp_path: Path
) -> None:
    server = redis_server_factory(password=ADMIN_PASSWORD)
    password = make_user(server, tmp_path, "inst-a", "mine")
    assert as_user(server, "inst-a", password, "SET", "mine:k", "v") == b"+OK\r\n"
    for command in [
        ("GET", "other:k"),
        ("SET", "theirs", "v"),
        ("PUBLISH", "other:ch", "x"),
        ("FLUSHALL",),
        ("CONFIG", "GET", "maxmemory"),
        ("KEYS", "*"),
        ("ACL", "LIST"),
        ("CLIENT", "KILL", "USER", "default"),
        ("SHUTDOWN",),
        ("EVAL", "return redis.call('GET', 'other:k')", "0"),
    ]:
        reply = as_user(server, "inst-a", password, *command)
        # A script's own key access is refused with ERR "... can't access ..." in Redis 7.0.
        assert reply.startswith(b"-NOPERM") or b"can't access" in reply, (command, reply)


def test_serve_refuses_a_wrong_password_or_missing_rights_in_one_line(
    procs: Processes, redis_server_factory, tmp_path: Path
) -> None:
    server = redis_server_factory(password=ADMIN_PASSWORD)
    password = make_user(server, tmp_path, "inst-a", "p")
    wrong = tmp_path / "wrong.password"
    wrong.write_text("not-the-password")
    # The same user without PING: its first command at start is refused.
    server.raw_command(
        "ACL",
        "SETUSER",
        "no-ping",
        "on",
        ">" + password.read_text().strip(),
        "~p:*",
        "+@all",
        "-ping",
    )
    plain = server.url.removeprefix("redis://")
    for user, secret, expected in [
        ("inst-a", wrong, "WRONGPASS"),
        ("no-ping", password, "NOPERM"),
    ]:
        env = {
            **procs.env,
            "GEMMANET_REDIS_URL": f"redis://{user}@{plain}",
            "GEMMANET_REDIS_PASSWORD_FILE": str(secret),
            "GEMMANET_KEY_PREFIX": "p",
            "GEMMANET_MULTI_INSTANCE": "1",
        }
        done = procs.cli("serve", "--port", "0", env=env)
        assert done.returncode != 0
        assert "Traceback" not in done.stderr, done.stderr
        [refusal] = [line for line in done.stderr.splitlines() if line.startswith("gemmanet:")]
        assert expected in refusal and "cannot reach Redis at start" in refusal, refusal
        assert secret.read_text().strip() not in done.stderr
