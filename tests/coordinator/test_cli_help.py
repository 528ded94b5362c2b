"""What a new user meets first: ``gemmanet --help`` and ``--version`` load no server stack
(checked in a fresh interpreter, like tests/coordinator/test_node_agent_imports.py), the
commands' --help list the settings they read (generated from coordinator/settings.py), and
those defaults are the ones docs/interface.md writes."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from coordinator import __version__
from coordinator.capacity import parse_capacity
from coordinator.cli import build_parser
from coordinator.cli_help import AUDIT_SETTINGS, MONITOR_SETTINGS, one_line
from coordinator.errors import SettingsError
from coordinator.settings import VARIABLES, Settings, variables_help

ROOT = Path(__file__).resolve().parents[2]
SERVER_STACK = {"quart", "hypercorn", "sqlalchemy", "coredis", "quart_trio", "prometheus_client"}

_RUN_MAIN = """
import contextlib, io, json, sys
from coordinator.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    try:
        code = main({argv!r})
    except SystemExit as exit:
        code = exit.code
print(json.dumps({{"code": code, "out": out.getvalue(), "modules": sorted(sys.modules)}}))
"""


def _run(*argv: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", _RUN_MAIN.format(argv=list(argv))],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def _top_level(modules: object) -> set[str]:
    assert isinstance(modules, list)
    return {str(name).partition(".")[0] for name in modules}


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["-v", "--help"]])
def test_help_and_version_load_nothing_of_the_server_or_the_coordinator(argv: list[str]) -> None:
    seen = _run(*argv)
    assert seen["code"] == 0
    modules = seen["modules"]
    assert not _top_level(modules) & (SERVER_STACK | {"trio", "msgspec"}), sorted(
        _top_level(modules) & (SERVER_STACK | {"trio", "msgspec"})
    )
    assert isinstance(modules, list)
    ours = sorted(m for m in modules if m.partition(".")[0] in ("coordinator", "tools", "sim"))
    # cli_keys defines the keys/nodes actions, cli_monitor the monitor's; like cli_help they
    # import the standard library only.
    assert ours == [
        "coordinator",
        "coordinator.cli",
        "coordinator.cli_help",
        "coordinator.cli_keys",
        "coordinator.cli_monitor",
    ], ours


def test_version_is_the_package_version() -> None:
    assert _run("--version")["out"] == f"gemmanet {__version__}\n"


@pytest.mark.parametrize(
    "argv", [["serve", "--help"], ["audit", "--help"], ["node", "--help"], ["keys", "create", "-h"]]
)
def test_a_commands_help_loads_no_server_stack(argv: list[str]) -> None:
    # `gemmanet node` runs on model hosts, which need only what the agent uses.
    seen = _run(*argv)
    assert seen["code"] == 0 and "usage:" in str(seen["out"])
    assert not _top_level(seen["modules"]) & SERVER_STACK


def test_running_a_node_agent_loads_no_server_stack() -> None:
    # Past parsing, through main's own imports to the agent (stopped by a bad flag value).
    seen = _run(
        *("node", "--coordinator", "http://127.0.0.1:1", "--node-id", "n", "--model", "m"),
        *("--backend", "echo", "--token", "t", "--max-parallel", "0"),
    )
    assert seen["code"] == 2
    assert isinstance(seen["modules"], list) and "tools.node_agent.cli" in seen["modules"]
    assert not _top_level(seen["modules"]) & SERVER_STACK, sorted(
        _top_level(seen["modules"]) & SERVER_STACK
    )


def _epilog(command: str) -> dict[str, str]:
    """The settings a command's --help lists: variable -> default."""
    parser = build_parser(command)
    action = next(a for a in parser._actions if a.dest == "command")
    text = action.choices[command].format_help()  # type: ignore[index]
    listing = text.split(
        'settings it reads (default after each; see docs/interface.md, "Settings"):'
    )
    assert len(listing) == 2, text
    return dict(line.split(None, 1) for line in listing[1].strip().splitlines())


def test_serve_help_lists_every_setting_with_its_default() -> None:
    listed = _epilog("serve")
    assert list(listed) == [variable for variable, _ in VARIABLES.values()] + [
        "GEMMANET_LOG_FORMAT"
    ]
    assert listed["GEMMANET_RATE_LIMIT"] == "60/minute"
    assert listed["GEMMANET_DATABASE_URL"] == "sqlite:///./gemmanet.db"
    assert listed["GEMMANET_SWEEP_S"] == "0.5" and listed["GEMMANET_MONITOR"] == "0"
    assert listed["GEMMANET_LOG_FORMAT"] == "text"


@pytest.mark.parametrize(
    ("command", "fields"), [("monitor", MONITOR_SETTINGS), ("audit", AUDIT_SETTINGS)]
)
def test_monitor_and_audit_help_list_the_settings_they_read(
    command: str, fields: tuple[str, ...]
) -> None:
    listed = _epilog(command)
    assert list(listed) == [VARIABLES[f][0] for f in fields] + ["GEMMANET_LOG_FORMAT"]
    assert "GEMMANET_REDIS_URL" in listed and "GEMMANET_RESIDENCY_STALE_S" in listed
    # The settings' field names exist (a renamed field would fail here, not in a user's help).
    assert set(fields) <= set(Settings.__dataclass_fields__)


def test_the_defaults_listed_are_those_of_docs_interface() -> None:
    """docs/interface.md's settings tables and the generated --help say the same defaults."""
    rows: dict[str, str] = {}
    for line in (ROOT / "docs" / "interface.md").read_text().splitlines():
        found = re.match(r"\| (`GEMMANET_[^|]+) \| ([^|]+) \|", line)
        for variable in re.findall(r"`(GEMMANET_[A-Z_]+)`", found.group(1) if found else ""):
            rows.setdefault(variable, found.group(2).replace("`", "").strip())  # type: ignore[union-attr]
    for variable, default in variables_help():
        assert variable in rows, f"{variable} is not in docs/interface.md's settings tables"
        assert default in rows[variable], (variable, default, rows[variable])


def test_a_multi_line_reason_becomes_one_line() -> None:
    reason = "connection failed: port 1 failed: Connection refused\n\tIs the server running?\n"
    assert one_line(reason) == (
        "connection failed: port 1 failed: Connection refused; Is the server running?"
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[telemetry]\ninterval_s = 5\n", "unknown table(s) [telemetry]"),
        ("[model.x]\nkv_gb = 1\n", "unknown table(s) [model]"),
        ("resident_gb = 1\n", "unknown top-level key(s) 'resident_gb'"),
    ],
)
def test_an_unknown_table_of_the_operator_file_is_refused(text: str, expected: str) -> None:
    with pytest.raises(SettingsError) as refused:
        parse_capacity(text, "ops.toml")
    assert str(refused.value) == (
        f"ops.toml has {expected}: the operator file knows only the tables [models], [nodes], "
        "[hosts] and [keys]"
    )
