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
    UsageRow,
    normalize_url,
)
from coordinator.store.schema import tasks as tasks_table

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


async def test_token_usage_is_written_by_both_writers_and_read_back(store: Store) -> None:
    one = make_task("t-one", "key_1", prompt_tokens=3, completion_tokens=5)
    batch = [
        make_task("t-b1", "key_1", prompt_tokens=7, completion_tokens=0),
        make_task("t-b2", "key_1", status="error", error_code="task_timeout"),  # no usage
        make_task("t-big", "key_1", prompt_tokens=2**53 - 1, completion_tokens=2**40),
    ]
    await store.record_task(one)
    assert await store.record_tasks(batch) == 3
    for record in [one, *batch]:
        assert await store.get_task(record.task_id) == record
    # A replayed id makes the batch fall back to one by one; the others keep their usage.
    again = make_task("t-b3", "key_1", prompt_tokens=1, completion_tokens=1)
    assert await store.record_tasks([batch[0], again]) == 1
    assert await store.get_task("t-b3") == again


def usage_of(rows: list[UsageRow]) -> dict[tuple[str, str], tuple[int, int, int, int]]:
    return {
        (r.key_id, r.model): (r.tasks, r.tasks_without_usage, r.prompt_tokens, r.completion_tokens)
        for r in rows
    }


async def test_usage_sums_tokens_per_key_and_model_over_a_half_open_window(store: Store) -> None:
    since, until = T0, T0 + 100

    def task(task_id: str, key_id: str, model: str, at: float, usage: tuple[int, int] | None):
        prompt, completion = usage if usage is not None else (None, None)
        return make_task(
            task_id, key_id, model=model, created_at=at, finished_at=at + 1,
            prompt_tokens=prompt, completion_tokens=completion,
            status="ok" if usage is not None else "error",
            error_code=None if usage is not None else "node_error",
        )  # fmt: skip

    await store.record_tasks(
        [
            task("a1", "key_1", "echo", since, (3, 4)),  # the start is in the window
            task("a2", "key_1", "echo", since + 50, (10, 20)),
            task("a3", "key_1", "echo", since + 60, None),  # failed: counted, no tokens
            task("a4", "key_1", "gemma", until - 0.001, (1, 2)),
            task("b1", "key_2", "echo", since + 1, (100, 200)),
            task("b2", "key_2", "nothing", since + 2, None),  # only tasks without usage
            task("early", "key_1", "echo", since - 0.001, (1000, 1000)),
            task("late", "key_1", "echo", until, (1000, 1000)),  # the end is not
        ]
    )
    key_1 = {("key_1", "echo"): (3, 1, 13, 24), ("key_1", "gemma"): (1, 0, 1, 2)}
    key_2 = {("key_2", "echo"): (1, 0, 100, 200), ("key_2", "nothing"): (1, 1, 0, 0)}
    mine = await store.usage(since, until, "key_1")
    assert usage_of(mine) == key_1
    assert [(r.model, r.total_tokens) for r in mine] == [("echo", 37), ("gemma", 3)]
    every = await store.usage(since, until)
    assert usage_of(every) == key_1 | key_2
    assert [(r.key_id, r.model) for r in every] == sorted(key_1 | key_2)  # ordered so

    assert await store.usage(since, until, "key_nobody") == []
    assert await store.usage(since, since) == []  # an empty window
    assert usage_of(await store.usage(since - 1, until + 1, "key_1"))[("key_1", "echo")] == (
        5, 1, 2013, 2024,
    )  # fmt: skip
    for bad in [(until, since), (float("nan"), until), (since, float("inf"))]:
        with pytest.raises(ValueError):
            await store.usage(*bad)


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


def _old_tasks_table(database_url: str) -> None:
    """The tasks table as the release before token usage made it, with one task in it."""
    engine = sa.create_engine(normalize_url(database_url))
    old = sa.MetaData()
    table = sa.Table(
        "tasks",
        old,
        *(
            sa.Column(c.name, c.type, primary_key=c.primary_key, nullable=c.nullable)
            for c in tasks_table.c
            if c.name not in ("prompt_tokens", "completion_tokens")
        ),
    )
    record = make_task("t-old", "key_1", created_at=T0 + 1, finished_at=T0 + 2)
    with engine.begin() as conn:
        old.create_all(conn)
        # Every old column from the record (latency_ms is its property).
        conn.execute(table.insert().values(**{c.name: getattr(record, c.name) for c in table.c}))
    engine.dispose()


def _task_columns(database_url: str) -> set[str]:
    engine = sa.create_engine(normalize_url(database_url))
    try:
        return {c["name"] for c in sa.inspect(engine).get_columns("tasks")}
    finally:
        engine.dispose()


async def test_a_database_without_the_usage_columns_gets_them_at_open(database_url: str) -> None:
    _old_tasks_table(database_url)
    assert {"prompt_tokens", "completion_tokens"} & _task_columns(database_url) == set()
    # Several processes may open the old database at once; each must come up.
    with ThreadPoolExecutor(4) as pool:
        stores = list(pool.map(lambda _: Store.open(database_url), range(4)))
    try:
        assert {"prompt_tokens", "completion_tokens"} <= _task_columns(database_url)
        first, second = stores[0], stores[1]
        old = await first.get_task("t-old")
        assert old is not None and (old.prompt_tokens, old.completion_tokens) == (None, None)
        assert old.status == "ok" and old.latency_ms == pytest.approx(1000.0)
        new = make_task("t-new", "key_1", created_at=T0 + 3, prompt_tokens=4, completion_tokens=6)
        assert await second.record_tasks([new]) == 1
        assert await first.get_task("t-new") == new
        # The old task counts as a task whose tokens are unknown, not as zero tokens.
        assert usage_of(await first.usage(T0, T0 + 10)) == {("key_1", "gemma3:4b"): (2, 1, 4, 6)}
        await first.rate_task("t-old", "key_1", 5)  # the old row is a task like any other
    finally:
        for opened in stores:
            opened.close()


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
