"""The metrics' definitions and what is shipped on them: deploy/prometheus/rules.yml parses and
its alerts compare with the baseline (``promtool test rules``), every metric name the rules and
the Grafana dashboard use is one the coordinator exports, registries of two instances stay
apart, and GEMMANET_METRICS_PORT is checked."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from coordinator.errors import SettingsError
from coordinator.runtime.metrics import Metrics
from coordinator.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "rules.yml"
RULES_TEST = ROOT / "deploy" / "prometheus" / "rules_test.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "gemmanet.json"

DIAGNOSTICS: dict[str, object] = {
    "local_nodes": 2,
    "local_in_flight": 3,
    "dropped_answers": {"duplicate": 1},
    "forwarded_in_flight": 1,
    "liveness_lost": 0,
    "bus_losses": 0,
    "local_queued": {"echo": 4},
    "lost_leases": 0,
}
_SUFFIXES = {"counter": ("",), "gauge": ("",), "histogram": ("_bucket", "_count", "_sum")}


def exported_names() -> set[str]:
    """Every series name a coordinator's /metrics can hold, from the TYPE lines of a real
    exposition (labelled metrics with no series yet still declare their type)."""
    text = Metrics(lambda: DIAGNOSTICS).exposition().decode()
    names: set[str] = set()
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", text, re.MULTILINE):
        names.update(name + suffix for suffix in _SUFFIXES.get(kind, ("",)))
    return names


def rule_expressions() -> list[str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule["expr"] for group in groups for rule in group["rules"]]


def dashboard_expressions() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [target["expr"] for panel in panels for target in panel["targets"]]


def test_rules_parse_and_each_rule_records_or_alerts() -> None:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    rules = [rule for group in groups for rule in group["rules"]]
    assert {r["alert"] for r in rules if "alert" in r} == {
        "GemmaNetTimeoutRateAboveBaseline",
        "GemmaNet502RateAboveBaseline",
        "GemmaNetNodeFlapping",
    }
    for rule in rules:
        assert ("record" in rule) != ("alert" in rule), rule
        assert rule["expr"].strip()
    # Every alert compares the candidate with the baseline.
    for rule in rules:
        if "alert" in rule:
            assert 'baseline="true"' in rule["expr"] and 'baseline="false"' in rule["expr"]


def test_every_metric_the_rules_and_dashboard_use_is_exported() -> None:
    exported = exported_names()
    expressions = rule_expressions() + dashboard_expressions()
    used = {n for e in expressions for n in re.findall(r"\bgemmanet_[a-z0-9_]+", e)}
    assert used, "the rules use no metric at all"
    assert used - exported == set(), sorted(used - exported)
    # The recording rules the alerts and the dashboard read are recorded.
    groups = yaml.safe_load(RULES.read_text())["groups"]
    recorded = {r["record"] for g in groups for r in g["rules"] if "record" in r}
    read = {n for e in expressions for n in re.findall(r"\bgemmanet:[a-z0-9_:]+", e)}
    assert read - recorded == set(), sorted(read - recorded)


def test_the_alerts_fire_against_the_baseline_as_promtool_sees_them() -> None:
    """rules_test.yml: 5x the baseline's timeouts fires, as many 502s as the baseline does not,
    a node replaced once a minute fires for that node only."""
    promtool = shutil.which("promtool")
    if promtool is None:
        if os.environ.get("CI"):
            pytest.fail("promtool is missing (tools/run-tests.sh installs Debian's prometheus)")
        pytest.skip("promtool not installed (apt-get install prometheus)")
    for args in (["check", "rules", str(RULES)], ["test", "rules", str(RULES_TEST)]):
        done = subprocess.run(
            [promtool, *args], capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == 0, done.stdout + done.stderr


def test_the_process_series_are_exported_too() -> None:
    """prometheus-client's process and platform collectors, on the instance's own registry."""
    samples = {
        s.name: s
        for f in text_string_to_metric_families(Metrics(lambda: DIAGNOSTICS).exposition().decode())
        for s in f.samples
    }
    for name in (
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_start_time_seconds",
    ):
        assert samples[name].value > 0, name
    assert samples["python_info"].labels["implementation"] == "CPython"


def test_two_instances_in_one_process_keep_their_counts_apart() -> None:
    first, second = Metrics(lambda: DIAGNOSTICS), Metrics(lambda: DIAGNOSTICS)
    first.task_outcome("task_timeout")
    first.node_closed("twin", 4000)
    families = {
        f.name: f for f in text_string_to_metric_families(second.exposition().decode()) if f.samples
    }
    assert "gemmanet_task_outcomes" not in families and "gemmanet_node_replaced" not in families
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(first.exposition().decode())
        for s in f.samples
    }
    assert samples[("gemmanet_task_outcomes_total", (("code", "task_timeout"), ("status", "504")))]
    assert samples[("gemmanet_node_closes_total", (("code", "4000"),))] == 1
    assert samples[("gemmanet_node_replaced_total", (("node_id", "twin"),))] == 1
    # Read from the instance at scrape time.
    assert samples[("gemmanet_admission_queue_depth", (("model", "echo"),))] == 4
    assert samples[("gemmanet_tasks_in_flight", ())] == 3


def test_outcome_statuses_come_from_the_error_hierarchy() -> None:
    metrics = Metrics(lambda: DIAGNOSTICS)
    for code in ("no_node_for_model", "all_nodes_busy", "node_disconnected", "node_error", "ok"):
        metrics.task_outcome(code)
    text = metrics.exposition().decode()
    for code, status in (
        ("no_node_for_model", 503),
        ("all_nodes_busy", 503),
        ("node_disconnected", 502),
        ("node_error", 502),
        ("ok", 200),
    ):
        assert f'gemmanet_task_outcomes_total{{code="{code}",status="{status}"}} 1.0' in text


def test_a_peer_death_is_counted_once_until_it_lives_again() -> None:
    metrics = Metrics(lambda: DIAGNOSTICS)
    metrics.peers_judged_dead({"A"}, live={"A", "C"})
    metrics.peers_judged_dead({"A"}, live={"C"})  # the verdict repeats
    assert metrics.peers_dead._value.get() == 1
    metrics.peers_judged_dead({"C"}, live={"A", "C"})  # A is back, C dies
    metrics.peers_judged_dead({"A"}, live={"C"})  # and A dies again
    assert metrics.peers_dead._value.get() == 3


@pytest.mark.parametrize("raw", ["abc", "0", "65536", "-1", "80.5"])
def test_a_bad_metrics_port_is_refused_in_one_line(raw: str) -> None:
    with pytest.raises(SettingsError, match="GEMMANET_METRICS_PORT=.* must be a TCP port"):
        Settings.from_env({"GEMMANET_METRICS_PORT": raw})


def test_the_metrics_port_setting() -> None:
    assert Settings.from_env({}).metrics_port is None
    settings = Settings.from_env({"GEMMANET_METRICS_PORT": "9464"})
    assert settings.metrics_port == 9464 and settings.metrics_host == "127.0.0.1"
