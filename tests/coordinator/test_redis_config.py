"""How the Redis backend is configured: password file, key prefix, TLS, lifecycle."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from coordinator.coordination import (
    CoordinationUnavailable,
    MemoryCoordination,
    create_coordination,
)
from coordinator.coordination.redis.coordination import RedisCoordination, redact_url
from coordinator.errors import SettingsError
from tests.fixtures.redis_server import RedisServer

pytestmark = pytest.mark.redis

ServerFactory = Callable[..., RedisServer]


async def test_password_from_file(redis_server_factory: ServerFactory, tmp_path: Path) -> None:
    secret = "s3cret-pass-word"
    server = redis_server_factory(password=secret)
    password_file = tmp_path / "redis-password"
    password_file.write_text(secret + "\n")  # a trailing newline, as editors leave it

    coord = RedisCoordination.from_url_and_password_file(server.url, str(password_file), "pw")
    async with coord:
        await coord.key_value.set("k", b"v")
        assert await coord.key_value.get("k") == b"v"
        assert secret not in repr(coord)

    async with RedisCoordination(server.url, key_prefix="pw") as anonymous:
        with pytest.raises(CoordinationUnavailable) as refused:
            await anonymous.key_value.get("k")
        assert secret not in str(refused.value)

    wrong_file = tmp_path / "wrong"
    wrong_file.write_text("not-it")
    wrong = RedisCoordination.from_url_and_password_file(server.url, str(wrong_file), "pw")
    async with wrong:
        with pytest.raises(CoordinationUnavailable):
            await wrong.ping()


def test_unreadable_password_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="GEMMANET_REDIS_PASSWORD_FILE"):
        RedisCoordination.from_url_and_password_file(
            "redis://127.0.0.1:1/0", str(tmp_path / "absent"), "gn"
        )


def test_no_password_file_means_no_password() -> None:
    coord = RedisCoordination.from_url_and_password_file("redis://127.0.0.1:1/0", None, "gn")
    assert coord.link.key_prefix == "gn"


def test_urls_are_redacted_in_messages() -> None:
    assert (
        redact_url("redis://:hunter2@redis.example:6380/1") == "redis://:***@redis.example:6380/1"
    )
    assert redact_url("rediss://user:pw@h/0") == "rediss://user:***@h/0"
    assert redact_url("redis://h:6379/0") == "redis://h:6379/0"
    assert "hunter2" not in repr(RedisCoordination("redis://:hunter2@127.0.0.1:1/0"))


async def test_every_key_and_channel_carries_the_prefix(
    redis_server_session: RedisServer, redis_key_prefix: str
) -> None:
    server = redis_server_session
    prefix = redis_key_prefix
    async with RedisCoordination(server.url, key_prefix=prefix) as c:
        await c.key_value.set("node:1", b"v")
        await c.key_value.swap("swapped", b"v")
        await c.key_value.compare_and_set("cas", None, b"v")
        await c.key_value.incr("counter")
        await c.rate_limits.rate_limit("rate", limit=5, period_s=2)
        raw_keys = server.raw_command("KEYS", f"{prefix}:*")
        for key in ("node:1", "swapped", "cas", "counter", "rate"):
            assert f"{prefix}:{key}".encode() in raw_keys
        assert b"\r\nnode:1\r\n" not in server.raw_command("KEYS", "*")

        async with c.pubsub.subscribe("inst:7"):
            channels = server.raw_command("PUBSUB", "CHANNELS", f"{prefix}:*")
            assert f"{prefix}:inst:7".encode() in channels


async def test_ttls_and_rate_limit_expiry_are_set_on_the_server(
    redis_server_session: RedisServer, redis_key_prefix: str
) -> None:
    server = redis_server_session
    prefix = redis_key_prefix
    async with RedisCoordination(server.url, key_prefix=prefix) as c:
        await c.key_value.set("k", b"v", ttl_s=12.5)
        await c.rate_limits.rate_limit("rate", limit=5, period_s=2)
        await c.key_value.incr("counter", ttl_s=3)
    ttl = int(server.raw_command("PTTL", f"{prefix}:k")[1:].strip())
    assert 12_000 < ttl <= 12_500
    # The sliding-window log cleans itself up one period after the last allowed call.
    ttl = int(server.raw_command("PTTL", f"{prefix}:rate")[1:].strip())
    assert 1_000 < ttl <= 2_000
    ttl = int(server.raw_command("PTTL", f"{prefix}:counter")[1:].strip())
    assert 2_000 < ttl <= 3_000


async def test_tls_via_rediss_url(redis_server_factory: ServerFactory) -> None:
    server = redis_server_factory(tls=True)
    assert server.url.startswith("rediss://")
    async with RedisCoordination(server.url, key_prefix="tls") as c:
        await c.key_value.set("k", b"over tls")
        assert await c.key_value.get("k") == b"over tls"
        assert (await c.rate_limits.rate_limit("r", limit=1, period_s=1)).allowed
        async with c.pubsub.subscribe("ch") as sub:
            assert await c.pubsub.publish("ch", b"secret") == 1
            with trio.fail_after(2):
                async for message in sub:
                    assert message == b"secret"
                    break


async def test_tls_with_an_untrusted_certificate_is_unavailable(
    redis_server_factory: ServerFactory,
) -> None:
    server = redis_server_factory(tls=True)
    url = server.url.split("?")[0] + "?ssl_cert_reqs=required"
    async with RedisCoordination(url, key_prefix="tls") as c:
        with pytest.raises(CoordinationUnavailable):
            await c.ping()


async def test_using_it_without_entering_is_a_programming_error() -> None:
    coord = RedisCoordination("redis://127.0.0.1:1/0")
    with pytest.raises(RuntimeError, match="async with"):
        await coord.key_value.get("k")


async def test_run_in_a_nursery(redis_server_session: RedisServer, redis_key_prefix: str) -> None:
    coord = RedisCoordination(redis_server_session.url, key_prefix=redis_key_prefix)
    async with trio.open_nursery() as nursery:
        started = await nursery.start(coord.run)
        assert started is coord
        await coord.key_value.set("k", b"v")
        assert await coord.key_value.get("k") == b"v"
        await coord.aclose()  # ends run(), so the nursery can close
    with pytest.raises(CoordinationUnavailable):
        await coord.key_value.get("k")


async def test_settings_pick_the_backend(
    redis_server_factory: ServerFactory, tmp_path: Path
) -> None:
    assert isinstance(create_coordination(None), MemoryCoordination)
    assert isinstance(create_coordination(""), MemoryCoordination)
    server = redis_server_factory(password="pw")
    password_file = tmp_path / "pw"
    password_file.write_text("pw")
    coord = create_coordination(server.url, password_file=str(password_file), key_prefix="cfg")
    assert isinstance(coord, RedisCoordination)
    async with coord:
        await coord.key_value.set("k", b"v")
    assert b"cfg:k" in server.raw_command("KEYS", "*")
