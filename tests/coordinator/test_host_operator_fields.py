"""A direct host's ``api_key_file`` and ``telemetry_url`` (``[hosts."ID"]`` of the operator
file). The key is read at start and sent as ``Authorization: Bearer <key>`` by the calls
(``hosts/host_calls.py``) and by the monitor's poll of ``/v1/models``, checked by the fake
OpenAI server demanding it over a real socket; a file that is missing, unreadable, empty or
holds more than one key is refused in one line naming the file, never its content; the key is
in no repr and no log line. A host's own ``telemetry_url`` needs no ``[nodes]`` entry of its
id, so the audit finds nothing to warn about (the monitor's poll of it:
``test_monitor_telemetry_poll.py``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio

from coordinator.capacity import HostSpec, parse_capacity
from coordinator.errors import SettingsError
from coordinator.log_redaction import REDACTOR
from coordinator.monitor.poller import poll_host
from protocol import BusResult, TaskErrorCode
from tests.coordinator.test_host_calls import call, run_call
from tests.fixtures.cli import run_cli
from tools.fakes.openai import FakeOpenAI

KEY = "sk-test-0123456789abcdef"


def host_toml(**fields: str) -> str:
    lines = ['[hosts."box-o"]', 'url = "http://box-o:8080"', 'kind = "openai"']
    return "\n".join(lines + [f"{k} = {v}" for k, v in fields.items()]) + "\n"


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "box-o.key"
    path.write_text(f"  {KEY}\n")  # surrounding whitespace (an editor's newline) is dropped
    return path


def test_the_key_file_is_read_at_start_and_shown_nowhere(key_file: Path) -> None:
    capacity = parse_capacity(host_toml(api_key_file=f'"{key_file}"'))
    spec = capacity.hosts["box-o"]
    assert spec.api_key == KEY
    assert spec.auth_headers() == {"Authorization": f"Bearer {KEY}"}
    assert KEY not in repr(spec) and KEY not in repr(capacity)
    # Registered with the log redactor: a log line quoting it shows the mask instead.
    assert KEY not in REDACTOR.redact(f"GET /v1/models Authorization: Bearer {KEY}")
    # No file, no header.
    assert parse_capacity(host_toml()).hosts["box-o"].auth_headers() == {}


@pytest.mark.parametrize(
    "content, problem",
    [
        (None, "cannot read it: No such file or directory"),
        ("", "must hold one API key"),
        ("two words\n", "must hold one API key"),
        ("line-one\nline-two\n", "must hold one API key"),
    ],
    ids=["missing", "empty", "spaces", "two-lines"],
)
def test_a_bad_key_file_is_refused_in_one_line_without_its_content(
    tmp_path: Path, content: str | None, problem: str
) -> None:
    path = tmp_path / "box-o.key"
    if content is not None:
        path.write_text(content)
    with pytest.raises(SettingsError) as refused:
        parse_capacity(host_toml(api_key_file=f'"{path}"'))
    message = str(refused.value)
    assert problem in message and str(path) in message and "api_key_file" in message
    assert "\n" not in message
    for word in ("words", "line-one", "line-two"):
        assert word not in message


def test_an_unreadable_key_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="api_key_file.*cannot read it"):
        parse_capacity(host_toml(api_key_file=f'"{tmp_path}"'))  # a directory


def test_a_host_names_its_telemetry_agent() -> None:
    url = "http://box-o:9105/telemetry"
    assert parse_capacity(host_toml(telemetry_url=f'"{url}"')).hosts["box-o"].telemetry_url == url
    with pytest.raises(SettingsError, match="telemetry_url"):
        parse_capacity(host_toml(telemetry_url='"box-o:9105"'))


def test_serve_refuses_a_missing_key_file_in_one_line(tmp_path: Path) -> None:
    operator_file = tmp_path / "hosts.toml"
    missing = tmp_path / "nope.key"
    operator_file.write_text(host_toml(api_key_file=f'"{missing}"'))
    env = {**os.environ, "GEMMANET_CAPACITY_FILE": str(operator_file)}
    env["GEMMANET_DATABASE_URL"] = f"sqlite:///{tmp_path / 'gn.db'}"
    done = run_cli("serve", "--port", "0", env=env)
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "api_key_file" in lines[0] and str(missing) in lines[0], lines


# -- the header on the wire --------------------------------------------------------------------


async def keyed_server(nursery: trio.Nursery) -> tuple[FakeOpenAI, str]:
    server = FakeOpenAI(models={"llama3"}, api_key=KEY)
    url: str = await nursery.start(server.run)
    return server, url


async def test_a_call_carries_the_key(nursery: trio.Nursery) -> None:
    server, url = await keyed_server(nursery)
    answers = await run_call({"box": HostSpec(url, "openai", api_key=KEY)}, call("box"))
    result = answers[-1]
    assert isinstance(result, BusResult) and result.failure is None
    assert result.output == "one two three"
    assert server.authorizations == [f"Bearer {KEY}"]


async def test_without_the_key_the_host_refuses_the_call(nursery: trio.Nursery) -> None:
    # What the key changes: the same call without it is answered 401 (the task fails, 502).
    _, url = await keyed_server(nursery)
    answers = await run_call({"box": HostSpec(url, "openai")}, call("box"))
    result = answers[-1]
    assert isinstance(result, BusResult) and result.failure is not None
    assert result.failure.code == TaskErrorCode.BACKEND_ERROR
    assert "401" in result.failure.message and KEY not in result.failure.message


async def test_the_monitor_polls_the_model_list_with_the_key(nursery: trio.Nursery) -> None:
    _, url = await keyed_server(nursery)
    import httpx

    async with httpx.AsyncClient() as client:
        keyed = await poll_host(client, "box", HostSpec(url, "openai", api_key=KEY), 5.0)
        bare = await poll_host(client, "box", HostSpec(url, "openai"), 5.0)
    assert keyed["reachable"] is True and keyed["models"] == ["llama3"]
    assert bare["reachable"] is False and "401" in bare["error"]


# -- the audit ---------------------------------------------------------------------------------


def test_a_hosts_own_telemetry_url_leaves_the_audit_nothing_to_warn_about() -> None:
    from coordinator.audit.findings import Observed, judge
    from coordinator.coordination.monitor_types import HostFacts, MonitorStatus
    from coordinator.settings import Settings

    monitor = MonitorStatus(holder="m1", lease_epoch=3, epoch=3, fenced_rejects=0)
    record = {"host_id": "box-o", "kind": "openai", "reachable": True, "resident": {}}
    observed = Observed(
        monitor=monitor,
        facts={"box-o": HostFacts("box-o", record | {"models": ["m"], "epoch": 3}, 100.0, 1.0)},
    )
    agent = '"http://box-o:9105/telemetry"'
    own = judge(Settings(capacity=parse_capacity(host_toml(telemetry_url=agent))), observed)
    assert own.exit_code == 0 and own.document["nodes"] == []
    assert [w.code for w in own.warnings if w.subject == "box-o"] == []
    # The older way, a [nodes] entry of the host's id, is a node that never connects.
    both = host_toml() + f'[nodes."box-o"]\ntelemetry_url = {agent}\n'
    old = judge(Settings(capacity=parse_capacity(both)), observed)
    assert [w.code for w in old.warnings if w.subject == "box-o"] == ["node_not_connected"]
    # ... and the warning says what to do about it.
    (leftover,) = [w.message for w in old.warnings if w.subject == "box-o"]
    assert "is a direct host ([hosts]): drop its [nodes] entry" in leftover
