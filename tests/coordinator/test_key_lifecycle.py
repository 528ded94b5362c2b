"""Key and node lifecycle in the store (SQLite and a real PostgreSQL where the fixture says):
listing, expiry, revocation, rotation, the change log, an older database gaining the columns,
and the authentication cache honouring a revocation made by another process within
``TRUST_S`` (the cross-instance proof with real processes is tests/e2e/test_revocation.py)."""

from __future__ import annotations

import hashlib
import math
from functools import partial

import pytest
import sqlalchemy as sa
import trio
from hypothesis import example, given, settings
from hypothesis import strategies as st

from coordinator.store import (
    ApiKey,
    KeyRevoked,
    NodeNotEnrolled,
    Store,
    UnknownKey,
    parse_duration,
)
from coordinator.store.engine import normalize_url
from coordinator.store.keys import tokens
from coordinator.store.keys.auth import TRUST_S, CachedAuth
from coordinator.store.keys.last_used import UseRecorder

T0 = 1_800_000_000.0


def log_rows(store: Store) -> list[tuple[str, str, str]]:
    with store.engine.connect() as conn:
        rows = conn.execute(
            sa.text("SELECT actor, action, subject FROM admin_log ORDER BY event_id")
        )
        return [tuple(row) for row in rows]  # type: ignore[misc]


async def test_list_expire_rotate_revoke_and_the_change_log(database_url: str) -> None:
    wall = [T0]
    with Store.open(database_url, wall_clock=lambda: wall[0]) as store:
        life = store.lifecycle
        record, secret = store.create_api_key_sync("alice", expires_at=T0 + 3600, actor="cli:ops")
        wall[0] = T0 + 1
        ops, _ = store.create_api_key_sync("ops", admin=True, actor="cli:ops")
        [alice, listed_ops] = life.list_keys()
        assert (alice.key_id, alice.name, alice.admin, alice.created_at) == (
            record.key_id,
            "alice",
            False,
            T0,
        )
        assert (alice.expires_at, alice.revoked_at, alice.last_used_at) == (T0 + 3600, None, None)
        assert alice.state(T0) == "active" and alice.state(T0 + 3600) == "expired"
        wall[0] = T0 + 3600  # the uncached lookup (the CLI's, a cache miss) refuses it too
        assert store.authenticate_api_key_sync(secret) is None
        wall[0] = T0 + 1
        assert listed_ops.admin and listed_ops.expires_at is None

        # Rotation: same id, name and expiry; the old secret is refused, the new one works.
        wall[0] = T0 + 10
        rotated, new_secret = life.rotate_key(record.key_id, actor="api:" + ops.key_id)
        assert rotated == alice
        assert store.authenticate_api_key_sync(secret) is None
        assert store.authenticate_api_key_sync(new_secret) == ApiKey(
            record.key_id, "alice", expires_at=T0 + 3600
        )

        # Revocation, idempotent; a revoked key cannot be rotated back to life.
        wall[0] = T0 + 20
        assert life.revoke_key(record.key_id, actor="cli:ops").revoked_at == T0 + 20
        assert store.authenticate_api_key_sync(new_secret) is None
        wall[0] = T0 + 30
        assert life.revoke_key(record.key_id, actor="cli:ops").revoked_at == T0 + 20
        with pytest.raises(KeyRevoked):
            life.rotate_key(record.key_id, actor="cli:ops")
        with pytest.raises(UnknownKey):
            life.revoke_key("key_nope", actor="cli:ops")

        # Nodes: revoked tokens are refused until the node is enrolled again.
        token = store.enroll_node_sync("n1", actor="cli:ops")
        assert life.revoke_node("n1", actor="cli:ops").revoked_at == T0 + 30
        assert store.verify_node_token_sync("n1", token) is False
        assert life.revoked_nodes({"n1", "never-enrolled"}) == {"n1", "never-enrolled"}
        with pytest.raises(NodeNotEnrolled):
            life.revoke_node("n2", actor="cli:ops")
        again = store.enroll_node_sync("n1", actor="cli:ops")
        assert store.verify_node_token_sync("n1", again) and life.revoked_nodes({"n1"}) == set()

        assert log_rows(store) == [
            ("cli:ops", "key.create", record.key_id),
            ("cli:ops", "key.create", ops.key_id),
            (f"api:{ops.key_id}", "key.rotate", record.key_id),
            ("cli:ops", "key.revoke", record.key_id),  # the second revoke changed nothing
            ("cli:ops", "node.enroll", "n1"),
            ("cli:ops", "node.revoke", "n1"),
            ("cli:ops", "node.enroll", "n1"),
        ]
        # Two rotations/revocations of keys and one of a node moved the epoch.
        assert life.read_epoch() == 3
        with store.engine.connect() as conn:
            dump = str(conn.execute(sa.text("SELECT * FROM api_keys")).all())
        for plain in (secret, new_secret):
            assert plain not in dump and plain[3:] not in dump
        assert hashlib.sha256(new_secret.encode()).hexdigest() in dump


async def test_a_revocation_by_another_process_is_honoured_within_the_trust_window(
    sqlite_database_url: str,
) -> None:
    now = [0.0]
    with (
        Store.open(sqlite_database_url, clock=lambda: now[0]) as serving,
        Store.open(sqlite_database_url) as cli,
    ):
        record, secret = serving.create_api_key_sync("alice")
        await serving.auth.check()  # what the instance's watch does every 0.5 s
        assert await serving.authenticate_api_key(secret) == record  # cached
        cli.lifecycle.revoke_key(record.key_id, actor="cli:ops")
        # Inside the window the cached answer is still trusted (no database read at all) ...
        now[0] = TRUST_S - 0.01
        assert await serving.authenticate_api_key(secret) == record
        # ... past it the epoch is read again before the cache is believed.
        now[0] = TRUST_S + 0.01
        assert await serving.authenticate_api_key(secret) is None

        other, other_secret = serving.create_api_key_sync("bob")
        assert await serving.authenticate_api_key(other_secret) == other
        _, rotated_secret = cli.lifecycle.rotate_key(other.key_id, actor="cli:ops")
        now[0] += TRUST_S + 0.01
        assert await serving.authenticate_api_key(other_secret) is None
        assert await serving.authenticate_api_key(rotated_secret) == other


async def test_expiry_is_checked_on_every_cached_use(sqlite_database_url: str) -> None:
    wall = [T0]
    with Store.open(sqlite_database_url, clock=lambda: 0.0, wall_clock=lambda: wall[0]) as store:
        record, secret = store.create_api_key_sync("short", expires_at=T0 + 10)
        await store.auth.check()  # the clock stands still: the cache stays trusted
        assert await store.authenticate_api_key(secret) == record
        with store.engine.begin() as conn:  # the cache alone answers from here
            conn.execute(sa.text("UPDATE api_keys SET expires_at = NULL"))
        wall[0] = T0 + 9.9
        assert await store.authenticate_api_key(secret) == record
        wall[0] = T0 + 10
        assert await store.authenticate_api_key(secret) is None


async def test_a_lookup_that_straddles_an_epoch_move_is_not_cached() -> None:
    # The lookup read the key before the revocation; the epoch read after it empties the
    # cache meanwhile. Caching the lookup's answer then would keep a revoked key alive.
    epoch, lookups, release = [0], [], trio.Event()
    record = ApiKey("key_a", "alice")

    async def lookup(key_hash: str) -> ApiKey | None:
        lookups.append(key_hash)
        if len(lookups) == 1:
            await release.wait()
        return record

    async def read_epoch() -> int:
        return epoch[0]

    auth = CachedAuth(
        lookup, read_epoch, ttl_s=30, max_size=10, clock=trio.current_time, wall_clock=lambda: T0
    )
    await auth.check()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(auth.authenticate, "h")
        await trio.testing.wait_all_tasks_blocked()
        epoch[0] = 1
        await auth.check()
        release.set()
    assert await auth.authenticate("h") == record
    assert lookups == ["h", "h"]  # asked again: the straddling answer was not kept
    assert await auth.authenticate("h") == record
    assert lookups == ["h", "h"]  # and this one was


def test_uses_are_written_at_most_once_a_minute_per_key() -> None:
    wall = [T0]
    uses = UseRecorder(wall_clock=lambda: wall[0])
    for _ in range(1000):
        uses.touch("key_a")
    assert uses.due() == {"key_a": T0}
    uses.written({"key_a": T0})
    wall[0] = T0 + 30
    uses.touch("key_a")
    uses.touch("key_b")
    assert uses.due() == {"key_b": T0 + 30}  # key_a was written 30 s ago
    uses.written({"key_b": T0 + 30})
    wall[0] = T0 + 60
    assert uses.due() == {"key_a": T0 + 30}
    assert uses.due(final=True) == {"key_a": T0 + 30}


def test_an_older_database_gains_the_lifecycle_columns(database_url: str) -> None:
    engine = sa.create_engine(normalize_url(database_url))
    old = sa.MetaData()
    keys = sa.Table(
        "api_keys",
        old,
        sa.Column("key_id", sa.String(64), primary_key=True),
        sa.Column("name", sa.String(255)),
        sa.Column("key_hash", sa.String(64)),
        sa.Column("created_at", sa.Float),
        sa.Column("is_admin", sa.Boolean, server_default=sa.false()),
    )
    nodes = sa.Table(
        "node_tokens",
        old,
        sa.Column("node_id", sa.String(255), primary_key=True),
        sa.Column("token_hash", sa.String(64)),
        sa.Column("enrolled_at", sa.Float),
    )
    secret, token = tokens.new_api_key(), tokens.new_node_token()
    with engine.begin() as conn:
        old.create_all(conn)
        conn.execute(
            keys.insert().values(
                key_id="old", name="old", key_hash=tokens.digest(secret), created_at=1.0
            )
        )
        conn.execute(
            nodes.insert().values(node_id="n", token_hash=tokens.digest(token), enrolled_at=1.0)
        )
    engine.dispose()
    with Store.open(database_url) as store:
        assert store.authenticate_api_key_sync(secret) == ApiKey("old", "old")
        assert store.verify_node_token_sync("n", token)
        [info] = store.lifecycle.list_keys()
        assert (info.expires_at, info.revoked_at, info.last_used_at) == (None, None, None)
        [node] = store.lifecycle.list_nodes()
        assert (node.node_id, node.revoked_at, node.online_instance_id) == ("n", None, None)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30d", 30 * 86400),
        ("12h", 43200),
        ("90m", 5400),
        ("45s", 45),
        ("2w", 1209600),
        ("1d12h", 129600),
        ("1.5h", 5400),
        (" 7D ", 7 * 86400),
    ],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "30", "d", "3x", "1y", "0s", "-1d", "1d 2h", "101w" * 60])
def test_bad_durations_are_refused_with_a_sentence(text: str) -> None:
    with pytest.raises(ValueError, match="duration|lifetime"):
        parse_duration(text)


async def test_a_fresh_check_does_not_settle_for_a_read_begun_before_it() -> None:
    # The admin API revokes, then reads the epoch before answering: joining the watch's read
    # begun before the revocation would answer with the cache still full.
    epoch, reads, release = [0], [], trio.Event()

    async def read_epoch() -> int:
        reads.append(epoch[0])
        if len(reads) == 2:
            await release.wait()  # the watch's read, slow, begun before the revocation
        return reads[-1]

    async def lookup(key_hash: str) -> ApiKey | None:
        return ApiKey("key_a", "alice")

    auth = CachedAuth(
        lookup, read_epoch, ttl_s=30, max_size=10, clock=trio.current_time, wall_clock=lambda: T0
    )
    await auth.check()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(auth.check)
        await trio.testing.wait_all_tasks_blocked()
        epoch[0] = 1  # the revocation commits while that read is under way
        nursery.start_soon(partial(auth.check, fresh=True))  # as honour_now asks
        await trio.testing.wait_all_tasks_blocked()
        release.set()
    assert auth.epoch == 1 and reads == [0, 0, 1]


Step = tuple[str, int | float]
STEPS = st.one_of(
    st.tuples(st.just("wait"), st.floats(0, 0.6)),
    st.tuples(st.just("revoke"), st.integers(0, 1)),
    st.tuples(st.just("watch"), st.just(0)),
    st.tuples(st.just("ask"), st.integers(0, 1)),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(STEPS, max_size=40))
@example([("ask", 0), ("revoke", 0), ("wait", 0.5), ("wait", 0.5), ("ask", 0)])
def test_no_revoked_key_outlives_the_trust_window_and_no_valid_key_is_refused(
    steps: list[Step],
) -> None:
    # Against a reference model: the database is a dict, another process revokes keys (and
    # bumps the epoch); the instance's watch runs at arbitrary times or not at all.
    now, epoch = [0.0], [0]
    revoked_at: dict[int, float] = {}
    records = {i: ApiKey(f"key_{i}", f"k{i}") for i in range(2)}

    async def lookup(key_hash: str) -> ApiKey | None:
        i = int(key_hash)
        return None if i in revoked_at else records[i]

    async def read_epoch() -> int:
        return epoch[0]

    async def run() -> None:
        auth = CachedAuth(
            lookup, read_epoch, ttl_s=30, max_size=10, clock=lambda: now[0], wall_clock=lambda: T0
        )
        for op, arg in steps:
            if op == "wait":
                now[0] += arg
            elif op == "revoke" and arg not in revoked_at:
                revoked_at[int(arg)] = now[0]
                epoch[0] += 1
            elif op == "watch":
                await auth.check()
            elif op == "ask":
                got = await auth.authenticate(str(arg))
                since = now[0] - revoked_at.get(int(arg), math.inf)
                if since == -math.inf:
                    assert got == records[int(arg)], "a valid key was refused"
                elif since > TRUST_S:
                    assert got is None, f"revoked {since:.3f} s ago and still accepted"

    trio.run(run)
