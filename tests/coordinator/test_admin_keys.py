"""Operator (admin) keys: the flag is stored and read back, and a database created before the
``is_admin`` column existed keeps working (the column is added at open, old keys stay plain)
on SQLite and on a real PostgreSQL."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import sqlalchemy as sa

from coordinator.store import Store
from coordinator.store.engine import normalize_url
from coordinator.store.keys import tokens
from coordinator.store.schema import api_keys
from tests.fixtures.processes import CLI, ROOT


async def test_admin_flag_is_stored_and_read_back(database_url: str) -> None:
    with Store.open(database_url) as store:
        plain, plain_key = store.create_api_key_sync("client")
        admin, admin_key = store.create_api_key_sync("operator", admin=True)
        assert not plain.admin and admin.admin
        assert (await store.authenticate_api_key(plain_key)).admin is False  # type: ignore[union-attr]
        assert (await store.authenticate_api_key(admin_key)).admin is True  # type: ignore[union-attr]
    with Store.open(database_url) as reopened:
        assert reopened.authenticate_api_key_sync(admin_key).admin is True  # type: ignore[union-attr]


def _old_api_keys_table(database_url: str) -> str:
    """The api_keys table as the release before admin keys made it, with one key in it."""
    engine = sa.create_engine(normalize_url(database_url))
    old = sa.MetaData()
    table = sa.Table(
        "api_keys",
        old,
        *(
            sa.Column(c.name, c.type, primary_key=c.primary_key)
            for c in api_keys.c
            if c.name not in ("is_admin", "priority")
        ),
    )
    plaintext = tokens.new_api_key()
    with engine.begin() as conn:
        old.create_all(conn)
        conn.execute(
            table.insert().values(
                key_id="old", name="old", key_hash=tokens.digest(plaintext), created_at=0.0
            )
        )
    engine.dispose()
    return plaintext


def _columns(database_url: str) -> set[str]:
    engine = sa.create_engine(normalize_url(database_url))
    try:
        return {c["name"] for c in sa.inspect(engine).get_columns("api_keys")}
    finally:
        engine.dispose()


def test_a_database_without_the_admin_column_keeps_working(database_url: str) -> None:
    old_key = _old_api_keys_table(database_url)
    assert "is_admin" not in _columns(database_url)
    # Several processes may open the old database at once; each must come up.
    with ThreadPoolExecutor(4) as pool:
        stores = list(pool.map(lambda _: Store.open(database_url), range(4)))
    try:
        assert "is_admin" in _columns(database_url)
        store = stores[0]
        old = store.authenticate_api_key_sync(old_key)
        assert old is not None and old.key_id == "old" and old.admin is False
        _, new_admin = store.create_api_key_sync("operator", admin=True)
        assert stores[1].authenticate_api_key_sync(new_admin).admin is True  # type: ignore[union-attr]
    finally:
        for store in stores:
            store.close()


def test_keys_create_admin_on_the_command_line(sqlite_database_url: str) -> None:
    import os
    import subprocess

    env = {**os.environ, "GEMMANET_DATABASE_URL": sqlite_database_url}

    def create(*extra: str) -> str:
        done = subprocess.run(
            [*CLI, "keys", "create", "--name", "ops", *extra],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        assert "operator (admin) API key" in done.stdout
        return done.stdout.strip().splitlines()[-1]

    # One process only (each costs seconds); without --admin is the path every other test takes.
    admin = create("--admin")
    with Store.open(sqlite_database_url) as store:
        assert store.authenticate_api_key_sync(admin).admin is True  # type: ignore[union-attr]
