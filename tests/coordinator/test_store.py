"""The durable store, against SQLite and a real PostgreSQL (``database_url`` fixture)."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import sqlalchemy as sa
import trio

from coordinator.store import (
    AlreadyRated,
    ApiKey,
    Store,
    StoreError,
    StoreUnavailable,
    TaskForbidden,
    TaskNotFound,
    TaskRecord,
    normalize_url,
)

T0 = 1_700_000_000.0


@pytest.fixture
def store(database_url: str) -> Iterator[Store]:
    with Store.open(database_url) as opened:
        yield opened


def make_task(task_id: str, key_id: str, node_id: str | None = "node-a", **changes) -> TaskRecord:
    fields = {
        "task_id": task_id,
        "key_id": key_id,
        "node_id": node_id,
        "model": "gemma3:4b",
        "status": "ok",
        "error_code": None,
        "created_at": T0,
        "finished_at": T0 + 0.25,
        "stream": False,
        "instance_id": "inst-1",
    }
    fields.update(changes)
    return TaskRecord(**fields)  # type: ignore[arg-type]


def raw_rows(store: Store, table: str) -> list[dict]:
    with store.engine.connect() as conn:
        return [dict(row._mapping) for row in conn.execute(sa.text(f"SELECT * FROM {table}"))]


# ---------------------------------------------------------------------- API keys


async def test_created_api_key_authenticates(store: Store) -> None:
    record, plaintext = store.create_api_key_sync("alice")
    assert plaintext.startswith("gn_") and len(plaintext) == len("gn_") + 43
    assert record == ApiKey(key_id=record.key_id, name="alice")
    assert await store.authenticate_api_key(plaintext) == record
    assert await store.authenticate_api_key(plaintext) == record  # served from the cache
    other, other_plaintext = store.create_api_key_sync("bob")
    assert other.key_id != record.key_id and other_plaintext != plaintext
    assert await store.authenticate_api_key(other_plaintext) == other


async def test_unknown_and_tampered_api_keys_are_refused(store: Store) -> None:
    _, plaintext = store.create_api_key_sync("alice")
    tampered = plaintext[:-1] + ("A" if plaintext[-1] != "A" else "B")
    node_token = store.enroll_node_sync("node-a")
    for candidate in [
        tampered,
        plaintext + "x",
        plaintext[:-1],
        "gn_" + "A" * 43,
        "",
        "gn_",
        plaintext.upper(),
        node_token,
        "gn_" + "x" * 10_000,
    ]:
        assert await store.authenticate_api_key(candidate) is None, candidate
    assert await store.authenticate_api_key(plaintext) is not None


async def test_only_the_hash_of_a_secret_is_stored(store: Store) -> None:
    record, plaintext = store.create_api_key_sync("alice")
    token = store.enroll_node_sync("node-a")
    (key_row,) = raw_rows(store, "api_keys")
    (node_row,) = raw_rows(store, "node_tokens")
    assert key_row["key_id"] == record.key_id
    assert key_row["key_hash"] == hashlib.sha256(plaintext.encode()).hexdigest()
    assert node_row["token_hash"] == hashlib.sha256(token.encode()).hexdigest()
    assert node_row["enrolled_at"] > T0
    for value in [*key_row.values(), *node_row.values()]:
        assert plaintext not in str(value) and token not in str(value)
        assert plaintext[3:] not in str(value) and token[4:] not in str(value)


async def test_auth_cache_keeps_positive_answers_for_its_ttl_only(database_url: str) -> None:
    now = [0.0]
    with Store.open(database_url, clock=lambda: now[0]) as store:
        record, plaintext = store.create_api_key_sync("alice")
        assert await store.authenticate_api_key(plaintext) == record
        with store.engine.begin() as conn:
            conn.execute(sa.text("DELETE FROM api_keys"))
        now[0] = 29.0
        assert await store.authenticate_api_key(plaintext) == record
        now[0] = 31.0
        assert await store.authenticate_api_key(plaintext) is None
        # A miss is not cached: a key that appears later authenticates at once.
        with store.engine.begin() as conn:
            conn.execute(
                sa.text(
                    "INSERT INTO api_keys (key_id, name, key_hash, created_at)"
                    " VALUES ('key_x', 'alice', :h, 0)"
                ),
                {"h": hashlib.sha256(plaintext.encode()).hexdigest()},
            )
        assert await store.authenticate_api_key(plaintext) == ApiKey("key_x", "alice")


# ---------------------------------------------------------------------- node tokens


async def test_enrolled_node_token_verifies_for_that_node_only(store: Store) -> None:
    token_a = store.enroll_node_sync("node-a")
    token_b = store.enroll_node_sync("node-b")
    assert token_a.startswith("gnn_") and token_a != token_b
    assert await store.verify_node_token("node-a", token_a)
    assert await store.verify_node_token("node-b", token_b)
    assert not await store.verify_node_token("node-a", token_b)
    assert not await store.verify_node_token("node-a", token_a[:-1] + "?")
    assert not await store.verify_node_token("node-a", "")
    assert not await store.verify_node_token("node-unknown", token_a)


async def test_reenrolling_a_node_invalidates_its_old_token(store: Store) -> None:
    old = store.enroll_node_sync("node-a")
    new = store.enroll_node_sync("node-a")
    assert new != old
    assert await store.verify_node_token("node-a", new)
    assert not await store.verify_node_token("node-a", old)
    assert len(raw_rows(store, "node_tokens")) == 1


def test_blank_names_are_refused(store: Store) -> None:
    with pytest.raises(ValueError):
        store.create_api_key_sync("  ")
    with pytest.raises(ValueError):
        store.enroll_node_sync("")


@pytest.mark.parametrize("node_id", ["a b", "quo'te", "x" * 129, "node\n"])
def test_node_ids_the_protocol_refuses_are_never_enrolled(store: Store, node_id: str) -> None:
    with pytest.raises(ValueError, match="node protocol"):
        store.enroll_node_sync(node_id)


# ---------------------------------------------------------------------- tasks


async def test_recorded_task_reads_back_unchanged(store: Store) -> None:
    ok = make_task("t-ok", "key_1", stream=True, finished_at=T0 + 1.234567)
    failed = make_task("t-err", "key_1", node_id=None, status="error", error_code="no_capacity")
    await store.record_task(ok)
    await store.record_task(failed)
    assert await store.get_task("t-ok") == ok
    assert await store.get_task("t-err") == failed
    assert await store.get_task("t-missing") is None
    latency = {row["task_id"]: row["latency_ms"] for row in raw_rows(store, "tasks")}
    assert latency["t-ok"] == pytest.approx(1234.567)
    with pytest.raises(StoreError):
        await store.record_task(ok)
    with pytest.raises(ValueError):
        await store.record_task(make_task("t-bad", "key_1", status="weird"))


# ---------------------------------------------------------------------- ratings


async def test_rating_a_task(store: Store) -> None:
    await store.record_task(make_task("t1", "key_1"))
    await store.rate_task("t1", "key_1", 4)
    (row,) = raw_rows(store, "ratings")
    assert (row["task_id"], row["key_id"], row["score"]) == ("t1", "key_1", 4)

    with pytest.raises(AlreadyRated) as already:
        await store.rate_task("t1", "key_1", 5)
    assert (already.value.status, already.value.code) == (409, "already_rated")
    with pytest.raises(TaskNotFound) as missing:
        await store.rate_task("t-missing", "key_1", 3)
    assert (missing.value.status, missing.value.code) == (404, "task_not_found")
    with pytest.raises(TaskForbidden) as forbidden:
        await store.rate_task("t1", "key_2", 3)
    assert (forbidden.value.status, forbidden.value.code) == (403, "forbidden")

    await store.record_task(make_task("t2", "key_1"))
    for bad in [0, 6, True, 2.5]:
        with pytest.raises(ValueError):
            await store.rate_task("t2", "key_1", bad)  # type: ignore[arg-type]
    await store.rate_task("t2", "key_1", 1)
    assert {row["score"] for row in raw_rows(store, "ratings")} == {4, 1}


async def test_concurrent_raters_exactly_one_wins(database_url: str) -> None:
    # Two Store objects stand for two processes; 16 raters race across both.
    with Store.open(database_url) as first, Store.open(database_url) as second:
        await first.record_task(make_task("t1", "key_1"))
        outcomes: list[int | str] = []

        async def rate(store: Store, score: int) -> None:
            try:
                await store.rate_task("t1", "key_1", score)
                outcomes.append(score)
            except AlreadyRated:
                outcomes.append("already_rated")

        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                for i in range(16):
                    nursery.start_soon(rate, (first, second)[i % 2], i % 5 + 1)

        winners = [o for o in outcomes if o != "already_rated"]
        assert len(outcomes) == 16 and len(winners) == 1
        (row,) = raw_rows(first, "ratings")
        assert row["score"] == winners[0]


async def test_node_ratings_are_means_per_node(store: Store) -> None:
    scores = {"a1": ("node-a", 5), "a2": ("node-a", 2), "b1": ("node-b", 3)}
    for task_id, (node_id, score) in scores.items():
        await store.record_task(make_task(task_id, "key_1", node_id=node_id))
        await store.rate_task(task_id, "key_1", score)
    await store.record_task(make_task("a-unrated", "key_1", node_id="node-a"))
    await store.record_task(make_task("c-unrated", "key_1", node_id="node-c"))
    await store.record_task(make_task("no-node", "key_1", node_id=None, status="error"))
    await store.rate_task("no-node", "key_1", 1)

    assert await store.node_ratings() == {"node-a": (3.5, 2), "node-b": (3.0, 1)}


async def test_node_ratings_empty(store: Store) -> None:
    assert await store.node_ratings() == {}


# ---------------------------------------------------------------------- sharing and opening


async def test_two_stores_share_one_database(database_url: str) -> None:
    with Store.open(database_url) as first, Store.open(database_url) as second:
        record, plaintext = first.create_api_key_sync("alice")
        assert await second.authenticate_api_key(plaintext) == record

        old = second.enroll_node_sync("node-a")
        assert await first.verify_node_token("node-a", old)
        new = first.enroll_node_sync("node-a")
        assert not await second.verify_node_token("node-a", old)
        assert await second.verify_node_token("node-a", new)

        task = make_task("t1", record.key_id)
        await first.record_task(task)
        assert await second.get_task("t1") == task
        await second.rate_task("t1", record.key_id, 5)
        with pytest.raises(AlreadyRated):
            await first.rate_task("t1", record.key_id, 5)
        assert await first.node_ratings() == {"node-a": (5.0, 1)}


def test_concurrent_opens_create_the_tables_once(database_url: str) -> None:
    # Like several processes starting at once against an empty database.
    barrier = threading.Barrier(6)

    def open_and_use(i: int) -> None:
        barrier.wait(timeout=10)
        with Store.open(database_url) as opened:
            opened.enroll_node_sync(f"node-{i}")

    with ThreadPoolExecutor(max_workers=6) as pool:
        for future in [pool.submit(open_and_use, i) for i in range(6)]:
            future.result(timeout=20)  # re-raises whatever the opener raised
    with Store.open(database_url) as opened:
        assert len(raw_rows(opened, "node_tokens")) == 6


def test_reopening_keeps_the_data(database_url: str) -> None:
    with Store.open(database_url) as first:
        _, plaintext = first.create_api_key_sync("alice")
    with Store.open(database_url) as second:
        assert second.authenticate_api_key_sync(plaintext) is not None


# ---------------------------------------------------------------------- URLs and engines


def test_postgres_urls_get_the_psycopg3_driver() -> None:
    def driver(url: str) -> str:
        return normalize_url(url).drivername

    assert driver("postgresql://u@h/db") == "postgresql+psycopg"
    assert driver("postgres://u@h/db") == "postgresql+psycopg"
    assert driver("postgresql+psycopg2://u@h/db") == "postgresql+psycopg2"
    assert driver("sqlite:///./gemmanet.db") == "sqlite"


def test_sqlite_runs_in_wal_mode(sqlite_database_url: str) -> None:
    with Store.open(sqlite_database_url) as store, store.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 1  # NORMAL
        busy_timeout_ms = conn.exec_driver_sql("PRAGMA busy_timeout").scalar()
        assert busy_timeout_ms is not None and busy_timeout_ms >= 1000


async def test_in_memory_sqlite_is_one_database_across_threads() -> None:
    with Store.open("sqlite://") as store:
        record, plaintext = store.create_api_key_sync("alice")
        assert await store.authenticate_api_key(plaintext) == record
        await store.record_task(make_task("t1", record.key_id))
        await store.rate_task("t1", record.key_id, 2)
        assert await store.node_ratings() == {"node-a": (2.0, 1)}


def test_unreachable_database_is_unavailable_without_leaking_the_password() -> None:
    with pytest.raises(StoreUnavailable) as excinfo:
        Store.open("postgresql://postgres:s3cret-pw@127.0.0.1:1/test?connect_timeout=2")
    assert excinfo.value.status == 503
    assert "s3cret-pw" not in str(excinfo.value)
