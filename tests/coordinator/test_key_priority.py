"""An API key's priority (its weight in the fair admission queue): stored and read back, added
to a database made before the column existed (old keys get 1), checked on the command line,
and overridden by name in the operator file."""

from __future__ import annotations

import random

import pytest
import sqlalchemy as sa

from coordinator.capacity import parse_capacity
from coordinator.cli import main
from coordinator.coordination.bus.memory import MemoryBus, MemoryBusHub
from coordinator.coordination.memory.coordination import MemoryCoordination
from coordinator.errors import SettingsError
from coordinator.runtime.instance import Instance
from coordinator.settings import Settings
from coordinator.store import Store
from coordinator.store.engine import normalize_url
from coordinator.store.keys import tokens
from coordinator.store.records import check_priority
from coordinator.store.schema import api_keys
from sim.stand_ins import SimStore


async def test_priority_is_stored_and_read_back(database_url: str) -> None:
    with Store.open(database_url) as store:
        plain, plain_key = store.create_api_key_sync("client")
        urgent, urgent_key = store.create_api_key_sync("urgent", priority=7)
        assert (plain.priority, urgent.priority) == (1, 7)
        assert (await store.authenticate_api_key(urgent_key)).priority == 7  # type: ignore[union-attr]
        assert store.authenticate_api_key_sync(plain_key).priority == 1  # type: ignore[union-attr]
        with pytest.raises(ValueError, match="from 1 to 100"):
            store.create_api_key_sync("too-much", priority=101)


def test_a_database_without_the_priority_column_gets_it(sqlite_database_url: str) -> None:
    engine = sa.create_engine(normalize_url(sqlite_database_url))
    old = sa.MetaData()
    columns = [sa.Column(c.name, c.type, primary_key=c.primary_key) for c in api_keys.c]
    table = sa.Table("api_keys", old, *(c for c in columns if c.name != "priority"))
    plaintext = tokens.new_api_key()
    with engine.begin() as conn:
        old.create_all(conn)
        conn.execute(
            table.insert().values(
                key_id="old", name="old", key_hash=tokens.digest(plaintext), created_at=0.0,
                is_admin=False,
            )
        )  # fmt: skip
    engine.dispose()
    with Store.open(sqlite_database_url) as store:
        assert store.authenticate_api_key_sync(plaintext).priority == 1  # type: ignore[union-attr]


@pytest.mark.parametrize("bad", [0, 101, -3, True, 2.5, "2"])
def test_a_priority_outside_1_to_100_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="priority must be from 1 to 100"):
        check_priority(bad)


def test_keys_create_priority_on_the_command_line(
    sqlite_database_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GEMMANET_DATABASE_URL", sqlite_database_url)
    assert main(["keys", "create", "--name", "batch", "--priority", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--priority: priority must be from 1 to 100, got 0" in err
    assert main(["keys", "create", "--name", "batch", "--priority", "5"]) == 0
    key = capsys.readouterr().out.strip().splitlines()[-1]
    with Store.open(sqlite_database_url) as store:
        assert store.authenticate_api_key_sync(key).priority == 5  # type: ignore[union-attr]


def test_the_operator_file_sets_a_priority_by_key_name() -> None:
    capacity = parse_capacity('[keys."batch"]\npriority = 1\n[keys."ops"]\npriority = 40\n')
    assert capacity.key_priorities == {"batch": 1, "ops": 40}
    for bad in ("0", "101", "2.5", '"high"', "true"):
        with pytest.raises(SettingsError, match=r'keys\."x"\.priority must be a whole number'):
            parse_capacity(f'[keys."x"]\npriority = {bad}\n', "ops.toml")
    with pytest.raises(SettingsError, match="unknown"):
        parse_capacity('[keys."x"]\nweight = 2\n', "ops.toml")
    # The file's priority for a name wins over the key's own; other keys keep theirs.
    settings = Settings(database_url="sim://", capacity=capacity)
    instance = Instance(
        settings,
        SimStore(),  # type: ignore[arg-type]
        MemoryCoordination(),
        MemoryBus(hub=MemoryBusHub()),
        rng=random.Random(0),
    )
    instance.admissions.note_key("key_a", "ops", 3)
    instance.admissions.note_key("key_b", "other", 3)
    assert instance.admissions.weight_of("key_a") == 40
    assert instance.admissions.weight_of("key_b") == 3
    assert instance.admissions.weight_of("never-seen") == 1
