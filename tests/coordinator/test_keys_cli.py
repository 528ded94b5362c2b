"""``gemmanet keys list|revoke|rotate``, ``keys create --expires`` and ``nodes list|revoke``,
run in-process through ``coordinator.cli.main`` on a real SQLite file (the last-line
convention and the subprocess path are covered by tests/e2e/test_cli.py)."""

from __future__ import annotations

import json
import time

import pytest

from coordinator.cli import main
from coordinator.store import Store


@pytest.fixture
def db(sqlite_database_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("GEMMANET_DATABASE_URL", sqlite_database_url)
    return sqlite_database_url


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_keys_list_shows_every_key_and_its_state(db: str, capsys: pytest.CaptureFixture[str]):
    code, out, _ = run(capsys, "keys", "create", "--name", "alice", "--expires", "30d")
    assert code == 0 and "expiring 20" in out.splitlines()[0]
    alice_secret = out.strip().splitlines()[-1]
    assert run(capsys, "keys", "create", "--name", "ops", "--admin")[0] == 0
    code, out, _ = run(capsys, "keys", "list", "--json")
    keys = json.loads(out)["keys"]
    assert [(k["name"], k["admin"], k["state"], k["revoked_at"]) for k in keys] == [
        ("alice", False, "active", None),
        ("ops", True, "active", None),
    ]
    assert list(keys[0]) == [
        "key_id", "name", "admin", "created_at", "last_used_at", "expires_at", "revoked_at",
        "state",
    ]  # fmt: skip
    assert 29.9 * 86400 < keys[0]["expires_at"] - time.time() <= 30 * 86400
    alice = keys[0]["key_id"]

    code, out, _ = run(capsys, "keys", "rotate", alice)
    new_secret = out.strip().splitlines()[-1]
    assert code == 0 and new_secret.startswith("gn_") and new_secret != alice_secret
    code, out, _ = run(capsys, "keys", "revoke", alice)
    assert code == 0 and f"revoked API key {alice}" in out
    code, out, _ = run(capsys, "keys", "revoke", alice)
    assert code == 0 and "already revoked" in out
    with Store.open(db) as store:
        assert store.authenticate_api_key_sync(alice_secret) is None
        assert store.authenticate_api_key_sync(new_secret) is None

    code, out, _ = run(capsys, "keys", "list")
    header, first, second = out.strip().splitlines()
    assert header.split() == [
        "ID", "NAME", "ADMIN", "CREATED", "LAST", "USED", "EXPIRES", "REVOKED", "STATE",
    ]  # fmt: skip
    assert first.startswith(alice) and first.split()[-1] == "revoked" and "never" in first
    assert second.split()[1:3] == ["ops", "yes"] and second.split()[-1] == "active"


@pytest.mark.parametrize(
    ("argv", "code", "reason"),
    [
        (["keys", "revoke", "key_nope"], 1, "no API key with id 'key_nope'"),
        (["keys", "rotate", "key_nope"], 1, "no API key with id 'key_nope'"),
        (["keys", "create", "--name", "x", "--expires", "soon"], 2, "--expires: 'soon' is not a"),
        (["nodes", "revoke", "ghost"], 1, "no node enrolled with id 'ghost'"),
        (["nodes", "revoke", "bad id"], 2, "NODE_ID: node id must be"),
    ],
)
def test_mistakes_are_one_line(db: str, capsys, argv: list[str], code: int, reason: str) -> None:
    got, out, err = run(capsys, *argv)
    assert got == code and out == ""
    assert err.startswith(f"gemmanet: {reason}") and err.count("\n") == 1, err


def test_nodes_list_and_revoke(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "nodes", "enroll", "--node-id", "n1")[0] == 0
    assert run(capsys, "nodes", "enroll", "--node-id", "n2")[0] == 0
    with Store.open(db) as store:  # what an instance holding n1 writes
        store.lifecycle.write_nodes_seen("inst-A", ["n1"], time.time())
    code, out, _ = run(capsys, "nodes", "revoke", "n2")
    assert code == 0 and "revoked node n2" in out
    code, out, _ = run(capsys, "nodes", "list", "--json")
    nodes = json.loads(out)["nodes"]
    assert [(n["node_id"], n["online_on"], n["state"]) for n in nodes] == [
        ("n1", "inst-A", "online"),
        ("n2", None, "revoked"),
    ]
    code, out, _ = run(capsys, "nodes", "list")
    header, n1, n2 = out.strip().splitlines()
    assert header.split() == ["ID", "ENROLLED", "LAST", "SEEN", "ONLINE", "ON", "REVOKED", "STATE"]
    assert n1.split()[0] == "n1" and "inst-A" in n1 and n1.split()[-1] == "online"
    assert n2.split()[-1] == "revoked" and "never" in n2
