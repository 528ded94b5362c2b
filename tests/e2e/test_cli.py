"""The command line contract of INTERFACE.md."""

from __future__ import annotations

import argparse
import socket
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.fixtures.processes import Processes, free_port, wait_until

pytestmark = pytest.mark.e2e


def test_key_and_token_are_alone_on_the_last_line(procs: Processes) -> None:
    key = procs.cli("keys", "create", "--name", "n").stdout.strip().splitlines()[-1]
    token = procs.cli("nodes", "enroll", "--node-id", "x").stdout.strip().splitlines()[-1]
    assert key.startswith("gn_") and " " not in key
    assert token.startswith("gnn_") and " " not in token


def test_every_subcommand_has_help(procs: Processes) -> None:
    for args in (
        ["--help"],
        ["serve", "--help"],
        ["keys", "create", "--help"],
        ["nodes", "enroll", "--help"],
        ["node", "--help"],
    ):
        done = procs.cli(*args)
        assert done.returncode == 0 and "usage" in done.stdout.lower(), args


def test_serve_monitor_and_audit_help_list_their_settings(procs: Processes) -> None:
    for command, variable in (
        ("serve", "GEMMANET_RATE_LIMIT"),
        ("monitor", "GEMMANET_MONITOR_POLL_S"),
        ("audit", "GEMMANET_RESIDENCY_STALE_S"),
    ):
        done = procs.cli(command, "--help")
        assert done.returncode == 0, done.stderr
        _, listing = done.stdout.split("settings it reads (default after each; see docs/")
        assert variable in listing and "GEMMANET_REDIS_URL" in listing, done.stdout


def test_bad_settings_fail_with_one_line(procs: Processes) -> None:
    env = {**procs.env, "GEMMANET_MULTI_INSTANCE": "1"}
    done = procs.cli("serve", "--port", "1", env=env)
    assert done.returncode != 0
    assert "GEMMANET_REDIS_URL" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_app_runs_under_plain_hypercorn(procs: Processes) -> None:
    port = free_port()
    proc = procs._popen(
        [
            sys.executable,
            "-m",
            "hypercorn",
            "--worker-class",
            "trio",
            "-b",
            f"127.0.0.1:{port}",
            "coordinator.app:create_app()",
        ]
    )
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: httpx.get(f"{url}/healthz").json() == {"ok": True}, "hypercorn serving")
    assert httpx.get(f"{url}/api/v1/status").json()["instances"] == 1
    proc.terminate()


def test_unreachable_database_is_one_clear_line(procs: Processes) -> None:
    env = {**procs.env, "GEMMANET_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none"}
    for args in (["serve", "--port", str(free_port())], ["keys", "create", "--name", "x"]):
        done = procs.cli(*args, env=env)
        assert done.returncode == 1, args
        assert done.stderr.startswith("gemmanet: database: cannot open the database"), done.stderr
        assert "Traceback" not in done.stderr
        # psycopg's hint ("Is the server running …?") joins the reason on its one line.
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr


@pytest.mark.parametrize("multi", ["0", "1"])
def test_unreachable_redis_is_one_line_and_nothing_else(procs: Processes, multi: str) -> None:
    env = {
        **procs.env,
        "GEMMANET_REDIS_URL": "redis://127.0.0.1:1/0",
        "GEMMANET_MULTI_INSTANCE": multi,
    }
    done = procs.cli("serve", "--port", str(free_port()), env=env)
    assert done.returncode == 1, done.stderr
    # Only the refusal: no log line of the start before it (the store opens at debug level).
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("gemmanet: cannot reach Redis at start: "), line
    assert "Connection refused" in line, line


def test_serve_refuses_liveness_settings_over_the_3_s_bound(procs: Processes) -> None:
    env = {**procs.env, "GEMMANET_ALIVE_TTL_S": "2.5"}
    done = procs.cli("serve", "--port", str(free_port()), env=env)
    assert done.returncode == 2
    line = done.stderr.strip()
    assert len(line.splitlines()) == 1, line
    assert "alive_ttl_s 2.5" in line and "sweep_s 0.5" in line and "3.40 s" in line, line
    assert "exceeds the promised 3 s" in line and "Traceback" not in line


def test_serve_accepts_a_tighter_ttl(procs: Processes) -> None:
    coord = procs.coordinator(GEMMANET_ALIVE_TTL_S="1.5")
    assert coord.status()["instances"] == 1


def _all_parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    from coordinator.cli import build_parser

    found: list[tuple[str, argparse.ArgumentParser]] = []

    def walk(name: str, parser: argparse.ArgumentParser) -> None:
        found.append((name, parser))
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub_name, sub in action.choices.items():
                    walk(f"{name} {sub_name}".strip(), sub)

    walk("", build_parser())
    return found


def test_every_option_of_every_subcommand_explains_itself_and_its_default() -> None:
    parsers = _all_parsers()
    assert {"serve", "demo", "sim run", "sim sweep", "sim replay", "loadtest", "node"} <= {
        name for name, _ in parsers
    }
    missing: list[str] = []
    for name, parser in parsers:
        text = "".join(parser.format_help().split())  # argparse wraps lines, even at hyphens
        for action in parser._actions:
            if isinstance(
                action, argparse._HelpAction | argparse._SubParsersAction | argparse._VersionAction
            ):
                continue
            if action.help == argparse.SUPPRESS:
                continue
            label = f"gemmanet {name} {'/'.join(action.option_strings) or action.dest}"
            if not action.help:
                missing.append(f"{label}: no help text")
                continue
            shows_default = (
                action.required
                or action.default in (None, False)
                or "default" in action.help.lower()
            )
            if not shows_default:
                missing.append(f"{label}: default {action.default!r} not shown")
            assert "".join(action.help.split()) in text, label
    assert not missing, "\n".join(missing)


def test_every_subcommand_help_runs(procs: Processes) -> None:
    names = [name for name, _ in _all_parsers()]
    # A process each (the import is most of the time), two at a time: the machine has 2 cores.
    with ThreadPoolExecutor(max_workers=2) as pool:
        runs = list(pool.map(lambda name: procs.cli(*name.split(), "--help"), names))
    for name, done in zip(names, runs, strict=True):
        assert done.returncode == 0 and "usage" in done.stdout.lower(), name


def test_sim_replay_of_a_missing_or_foreign_file_is_one_line(
    procs: Processes, tmp_path: Path
) -> None:
    foreign = tmp_path / "foreign.jsonl"
    foreign.write_text('{"x": 1}\n')
    for path, expected in (
        (tmp_path / "seed-12.jsonl", "cannot read the trace"),
        (foreign, "is not a simulator trace"),
    ):
        done = procs.cli("sim", "replay", str(path))
        assert done.returncode == 1
        assert done.stderr.strip().splitlines() == [done.stderr.strip()], done.stderr
        assert done.stderr.startswith("gemmanet: ") and expected in done.stderr, done.stderr


def test_sim_sweep_of_an_empty_range_is_refused(procs: Processes) -> None:
    done = procs.cli("sim", "sweep", "--seeds", "20-1")
    assert done.returncode == 1
    assert done.stderr.strip() == (
        "gemmanet: --seeds '20-1' is empty: the first seed must not exceed the last"
    )


@pytest.mark.parametrize(
    "variables,expected",
    [
        (
            {
                "GEMMANET_REDIS_URL": "redis://127.0.0.1:1/0",
                "GEMMANET_REDIS_PASSWORD_FILE": "/run/secrets/redis-absent",
            },
            "GEMMANET_REDIS_PASSWORD_FILE='/run/secrets/redis-absent': cannot read the file",
        ),
        (
            {"GEMMANET_REDIS_URL": "http://127.0.0.1:6379/0"},
            (
                "GEMMANET_REDIS_URL must be redis://host:port/db, rediss://… (TLS) or "
                "redis+cluster://host:port, not http://"
            ),
        ),
        (
            {"GEMMANET_REDIS_URL": "redis://:hunter2@127.0.0.1:6379/0"},
            "GEMMANET_REDIS_PASSWORD_FILE",
        ),
    ],
    ids=["password-file-missing", "http-url", "password-in-url"],
)
def test_bad_redis_settings_are_one_line(
    procs: Processes, variables: dict[str, str], expected: str
) -> None:
    done = procs.cli("serve", "--port", str(free_port()), env={**procs.env, **variables})
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [done.stderr.strip()], done.stderr
    assert done.stderr.startswith("gemmanet: ") and expected in done.stderr, done.stderr
    assert "hunter2" not in done.stderr


def test_serve_logs_running_on_once_and_sends_reason_phrases(procs: Processes) -> None:
    coord = procs.coordinator()
    host, port = coord.url.removeprefix("http://").split(":")
    for path, status_line in (
        ("/healthz", b"HTTP/1.1 200 OK\r\n"),
        ("/nope", b"HTTP/1.1 404 Not Found\r\n"),
    ):
        with socket.create_connection((host, int(port)), timeout=5) as raw:
            raw.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            reply = b""
            while b"\r\n" not in reply and (chunk := raw.recv(65536)):
                reply += chunk
        assert reply.startswith(status_line), reply[:60]
    log = Path(coord.proc.log_path).read_text()  # type: ignore[attr-defined]
    assert log.count("Running on") == 1, log


@pytest.mark.parametrize(
    "node_id", ["has space", "quo'te", 'dq"', "x" * 129, "", "slash/es", "new\nline"]
)
def test_enroll_refuses_a_node_id_the_protocol_refuses(procs: Processes, node_id: str) -> None:
    """A token for an id no hello can carry could never connect: refused, one line, exit 2."""
    done = procs.cli("nodes", "enroll", "--node-id", node_id)
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert "gnn_" not in done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gemmanet: --node-id"), done.stderr


def test_enroll_accepts_the_longest_node_id(procs: Processes) -> None:
    done = procs.cli("nodes", "enroll", "--node-id", "a.b_c:d-" + "x" * 120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1].startswith("gnn_")


@pytest.mark.parametrize("name", ["", "   ", "n" * 300])
def test_keys_create_refuses_an_empty_or_overlong_name(procs: Processes, name: str) -> None:
    done = procs.cli("keys", "create", "--name", name)
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert "gn_" not in done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gemmanet: --name"), done.stderr


@pytest.mark.parametrize("command", ["serve", "telemetry-agent"])
def test_a_port_in_use_is_one_line(procs: Processes, command: str) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        done = procs.cli(command, "--host", "127.0.0.1", "--port", str(port))
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"gemmanet: cannot listen on 127.0.0.1:{port}: Address already in use"
    ], done.stderr


@pytest.mark.parametrize(
    ("args", "code", "expected"),
    [
        (
            ["serve", "--port", "99999"],
            2,
            "--port '99999' must be a TCP port number from 0 (any free port) to 65535",
        ),
        (
            ["serve", "--port", "http"],
            2,
            "--port 'http' must be a TCP port number from 0 (any free port) to 65535",
        ),
        (["demo", "--port", "0"], 2, "--port '0' must be a TCP port number from 1 to 65535"),
        (
            ["telemetry-agent", "--port", "70000"],
            2,
            "--port '70000' must be a TCP port number from 1 to 65535",
        ),
        (
            ["serve", "--host", "no-such-host.invalid", "--port", "8000"],
            1,
            "cannot listen on no-such-host.invalid:8000: ",
        ),
        (
            ["telemetry-agent", "--host", "no-such-host.invalid"],
            1,
            "cannot listen on no-such-host.invalid:9105: ",
        ),
    ],
)
def test_a_bad_port_or_host_is_one_line(
    procs: Processes, args: list[str], code: int, expected: str
) -> None:
    done = procs.cli(*args)
    assert done.returncode == code, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(f"gemmanet: {expected}"), line


def test_version_names_the_package_version(procs: Processes) -> None:
    from coordinator import __version__

    done = procs.cli("--version")
    assert done.returncode == 0 and done.stdout == f"gemmanet {__version__}\n", done


def test_verbose_goes_before_or_after_the_command(procs: Processes) -> None:
    for args in (["-v", "keys", "create", "--name", "a"], ["keys", "create", "--name", "b", "-v"]):
        done = procs.cli(*args)
        assert done.returncode == 0, done.stderr
        assert " DEBUG coordinator.store.store: store opened at " in done.stderr, done.stderr
    quiet = procs.cli("keys", "create", "--name", "c")
    assert "DEBUG" not in quiet.stderr, quiet.stderr
    # Parsed on every command: serve -v reaches the settings check (and its one line).
    env = {**procs.env, "GEMMANET_MULTI_INSTANCE": "1"}
    done = procs.cli("serve", "-v", "--port", str(free_port()), env=env)
    assert done.returncode == 2 and "GEMMANET_REDIS_URL" in done.stderr, done.stderr


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("foo://x/y", "unsupported database 'foo'"),
        ("mysql://root@127.0.0.1/test", "unsupported database 'mysql'"),
        ("not a url", "is not a database URL"),
    ],
)
def test_an_unknown_database_scheme_is_one_line(procs: Processes, url: str, expected: str) -> None:
    env = {**procs.env, "GEMMANET_DATABASE_URL": url}
    for args in (["serve", "--port", str(free_port())], ["keys", "create", "--name", "x"]):
        done = procs.cli(*args, env=env)
        assert done.returncode == 1, done.stderr
        assert done.stderr.strip().splitlines() == [done.stderr.strip()], done.stderr
        assert done.stderr.startswith("gemmanet: database: ") and expected in done.stderr
