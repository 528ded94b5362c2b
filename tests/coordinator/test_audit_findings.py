"""The audit's verdict (``coordinator/audit/findings.py``) on hand-made observations: each
reason and warning at its boundary, and the exit code. Plus which agent nodes count as
connected, read from a real registry (memory backend, injected clock). The end-to-end test
(tests/e2e/test_audit.py) runs the same rules on real processes."""

from __future__ import annotations

import pytest

from coordinator.audit.findings import ConnectedNode, Observed, judge
from coordinator.audit.observe import _connected_nodes
from coordinator.audit.render import render_text
from coordinator.capacity import parse_capacity
from coordinator.coordination import keys
from coordinator.coordination.leases import NodeFacts
from coordinator.coordination.memory.coordination import MemoryCoordination
from coordinator.coordination.monitor_types import HostFacts, MonitorStatus
from coordinator.core import registry
from coordinator.settings import Settings

OPERATOR_FILE = """
[models."llama3:8b"]
resident_gb = 5.5
[models."gemma:2b"]
resident_gb = 1.7
[nodes."box-1"]
vram_gb = 24
[hosts."box-c"]
url = "http://box-c:11434"
kind = "ollama"
memory_gb = 8
"""
SETTINGS = Settings(capacity=parse_capacity(OPERATOR_FILE), redis_url="redis://r:6379/0")
MONITOR = MonitorStatus(holder="m1", lease_epoch=3, epoch=3, fenced_rejects=0)
#: box-1's facts as its instance A writes them (the operator file's 24 GB over its hello's 8)
NODE_FACTS = {"box-1": NodeFacts("box-1", "c-1", "A", 4, 24.0, {})}


def facts(
    age_s: float = 1.0,
    epoch: int = 3,
    reachable: bool = True,
    resident: dict[str, float] | None = None,
) -> dict[str, HostFacts]:
    record = {
        "host_id": "box-c",
        "kind": "ollama",
        "reachable": reachable,
        "resident": {"llama3:8b": 5.5} if resident is None else resident,
        "models": ["llama3:8b"],
        "epoch": epoch,
    }
    if not reachable:
        record["error"] = "ConnectError: refused"
    return {"box-c": HostFacts("box-c", record, 100.0, age_s)}


def reason_codes(observed: Observed, settings: Settings = SETTINGS) -> list[tuple[str, object]]:
    return [(f.code, f.subject) for f in judge(settings, observed).reasons]


def test_fresh_reachable_facts_under_a_held_lease_are_ready() -> None:
    report = judge(SETTINGS, Observed(monitor=MONITOR, facts=facts()))
    assert report.exit_code == 0 and report.reasons == []
    assert report.document["ready"] is True
    assert report.document["hosts"][0]["fresh"] is True


@pytest.mark.parametrize(
    "age_s,stale", [(15.0, False), (15.001, True), (14.9, False), (40.0, True)]
)
def test_facts_older_than_the_window_are_stale(age_s: float, stale: bool) -> None:
    expected = [("stale_facts", "box-c")] if stale else []
    assert reason_codes(Observed(monitor=MONITOR, facts=facts(age_s=age_s))) == expected


def test_facts_of_an_older_epoch_are_stale_however_young() -> None:
    observed = Observed(monitor=MONITOR, facts=facts(age_s=0.1, epoch=2))
    assert reason_codes(observed) == [("stale_facts", "box-c")]
    report = judge(SETTINGS, observed)
    assert "epoch 2" in report.reasons[0].message and report.document["hosts"][0]["fresh"] is False


def test_a_host_that_missed_the_last_poll_is_not_ready() -> None:
    report = judge(SETTINGS, Observed(monitor=MONITOR, facts=facts(reachable=False)))
    assert [(f.code, f.subject) for f in report.reasons] == [("host_unreachable", "box-c")]
    assert "ConnectError" in report.reasons[0].message and report.exit_code == 1


def test_no_lease_and_no_facts_are_reasons() -> None:
    nobody = MonitorStatus(holder=None, lease_epoch=None, epoch=3, fenced_rejects=0)
    assert reason_codes(Observed(monitor=nobody)) == [("no_monitor", None), ("no_facts", "box-c")]


def test_an_operator_file_without_hosts_is_not_ready() -> None:
    settings = Settings(capacity=parse_capacity(""), redis_url="redis://r:6379/0")
    assert reason_codes(Observed(monitor=MONITOR), settings) == [("no_hosts", None)]


@pytest.mark.parametrize(
    "timing,expected",
    [
        ({"residency_stale_s": 12.0}, []),  # 2 + 5 + 1 + 2 x 2 = 12: exactly fits
        ({"residency_stale_s": 11.9}, ["bound_exceeded"]),
        ({"monitor_ttl_s": 4.0, "residency_stale_s": 15.0}, ["lease_shorter_than_tick"]),
    ],
)
def test_the_timing_bound_against_the_window(timing: dict[str, float], expected: list[str]) -> None:
    settings = SETTINGS.with_(**timing)
    observed = Observed(monitor=MONITOR, facts=facts(age_s=0.5))
    report = judge(settings, observed)
    assert [f.code for f in report.reasons] == expected
    assert report.document["timing"]["ok"] is (not expected)
    assert report.exit_code == (1 if expected else 0)


def test_redis_unreachable_is_exit_3_and_still_judges_the_settings() -> None:
    report = judge(SETTINGS.with_(residency_stale_s=5.0), Observed(redis_error="refused"))
    assert report.exit_code == 3
    assert [f.code for f in report.reasons] == ["redis_unreachable", "bound_exceeded"]
    assert report.document["catalog"] is None and report.document["nodes"][0]["connected"] is None


def test_catalog_gaps_are_warnings_and_only_ready_hosts_serve() -> None:
    node = ConnectedNode("box-1", "A", ("gemma:2b",), 4, 8.0, conn_id="c-1", owner_age_s=0.4)
    ready = judge(
        SETTINGS,
        Observed(
            monitor=MONITOR,
            facts=facts(resident={"qwen:0.5b": 0.4}),
            connected={"box-1": node},
            node_facts=NODE_FACTS,
        ),
    )
    assert ready.exit_code == 0
    catalog = ready.document["catalog"]
    assert catalog["served_by"] == {"gemma:2b": ["box-1"], "llama3:8b": ["box-c"]}
    assert catalog["unserved"] == [] and catalog["unlisted"] == {"qwen:0.5b": ["box-c"]}
    assert [(w.code, w.subject) for w in ready.warnings] == [("catalog_unlisted", "qwen:0.5b")]
    # The node's budgets: the operator file's memory, its hello's parallelism.
    assert ready.document["nodes"][0] == {
        "node_id": "box-1", "max_parallel": 4, "vram_gb": 24.0, "budget_from": "operator file",
        "parallel_from": "hello", "connected": True, "instance_id": "A", "models": ["gemma:2b"],
        "owner_age_s": 0.4, "has_facts": True, "fresh": True, "uncatalogued": [],
        "verdict": "ready", "ready": True,
    }  # fmt: skip
    # A stale host serves nothing: its models become gaps, and box-1 is not connected.
    stale = judge(SETTINGS, Observed(monitor=MONITOR, facts=facts(age_s=99)))
    assert stale.document["catalog"]["unserved"] == ["gemma:2b", "llama3:8b"]
    assert [(w.code, w.subject) for w in stale.warnings] == [
        ("node_not_connected", "box-1"),
        ("catalog_unserved", "gemma:2b"),
        ("catalog_unserved", "llama3:8b"),
    ]


def test_resident_models_over_the_hosts_memory_budget_are_a_warning() -> None:
    over = facts(resident={"llama3:8b": 5.5, "gemma:2b": 2.6})  # 8.1 GB > 8 GB
    report = judge(SETTINGS, Observed(monitor=MONITOR, facts=over))
    assert ("over_memory_budget", "box-c") in [(w.code, w.subject) for w in report.warnings]
    fits = judge(SETTINGS, Observed(monitor=MONITOR, facts=facts(resident={"gemma:2b": 8.0})))
    assert "over_memory_budget" not in [w.code for w in fits.warnings]


async def test_nodes_are_listed_with_how_long_ago_their_instance_beat() -> None:
    now = [1000.0]
    coordination = MemoryCoordination(lambda: now[0])

    async def beat(instance: str, *nodes: tuple[str, float]) -> None:
        entries = [
            registry.NodeEntry(
                node_id=node_id, conn_id=f"{instance}-{node_id}", models=["m"],
                max_parallel=1, in_flight=0, connected_at=connected_at,
            )
            for node_id, connected_at in nodes
        ]  # fmt: skip
        snapshot = registry.InstanceSnapshot(instance_id=instance, in_flight=0, nodes=entries)
        await coordination.presence.presence_beat(
            keys.PRESENCE,
            instance,
            registry.encode_snapshot(snapshot),
            stall_after_s=0.7,
            forget_after_s=60,
        )

    await beat("B", ("box-1", 1.0), ("box-2", 5.0))
    now[0] += 1.5
    # box-2 reconnected on A: the newer connection wins, whichever instance is read first.
    await beat("A", ("box-2", 9.0))
    found = await _connected_nodes(coordination.key_value, coordination.presence)
    assert {n: c.instance_id for n, c in found.items()} == {"box-1": "B", "box-2": "A"}
    now[0] += 1.0  # B last beat 2.5 s ago: dead to its peers (judged stale: below)
    found = await _connected_nodes(coordination.key_value, coordination.presence)
    assert {n: (c.instance_id, c.owner_age_s) for n, c in found.items()} == {
        "box-1": ("B", 2.5),
        "box-2": ("A", 1.0),
    }
    assert found["box-1"].conn_id == "B-box-1"


def test_the_json_document_has_exactly_the_documented_keys() -> None:
    """docs/interface.md "The audit report": scripts rely on these names."""
    node = ConnectedNode("box-1", "A", ("gemma:2b",), 4, 8.0, conn_id="c-1")
    observed = Observed(
        monitor=MONITOR,
        facts=facts(),
        connected={"box-1": node},
        node_facts=NODE_FACTS,
        probes={},
    )
    doc = judge(SETTINGS, observed).document
    assert list(doc) == [
        "ready", "exit_code", "redis", "monitor", "timing", "host_placement", "hosts", "nodes",
        "catalog", "reasons", "warnings",
    ]  # fmt: skip
    assert doc["host_placement"] == {"mode": "gated", "placing": False, "switch": None}
    assert set(doc["redis"]) == {"url", "key_prefix", "reachable", "error"}
    assert set(doc["monitor"]) == {"holder", "lease_epoch", "epoch", "fenced_rejects"}
    assert set(doc["timing"]) == {
        "poll_s", "election_ttl_s", "standby_retry_s", "poll_timeout_s", "bound_s",
        "stale_window_s", "sum", "ok",
    }  # fmt: skip
    assert set(doc["hosts"][0]) == {
        "host_id", "kind", "url", "memory_gb", "max_parallel", "weight", "has_facts",
        "reachable", "error", "age_s", "epoch", "fresh", "resident", "models", "probe", "ready",
        "verdict",
    }  # fmt: skip
    assert set(doc["nodes"][0]) == {
        "node_id", "max_parallel", "vram_gb", "budget_from", "parallel_from", "connected",
        "instance_id", "models", "owner_age_s", "has_facts", "fresh", "uncatalogued", "verdict",
        "ready",
    }  # fmt: skip
    assert set(doc["catalog"]) == {"models", "served_by", "unserved", "unlisted"}


# -- agent-only deployments: no direct host, no monitor -----------------------------------------

AGENT_ONLY = Settings(
    capacity=parse_capacity('[models."llama3:8b"]\nresident_gb = 5.5\n'),
    redis_url="redis://r:6379/0",
)


def agents(*nodes: tuple[str, str, float], vram_gb: float | None = 8.0) -> Observed:
    """Nodes (id, instance, owner beat age) serving llama3:8b, each with its own facts."""
    connected = {
        node_id: ConnectedNode(node_id, instance, ("llama3:8b",), 2, vram_gb, f"c-{node_id}", age)
        for node_id, instance, age in nodes
    }
    node_facts = {
        node_id: NodeFacts(node_id, f"c-{node_id}", instance, 2, vram_gb, {})
        for node_id, instance, _ in nodes
    }
    return Observed(connected=connected, node_facts=node_facts)


def test_a_healthy_agent_only_cluster_is_ready_without_monitor_or_hosts() -> None:
    report = judge(AGENT_ONLY, agents(("n1", "A", 0.3), ("n2", "B", 0.6)))
    assert report.exit_code == 0 and report.reasons == [] and report.warnings == []
    assert [(n["node_id"], n["instance_id"], n["verdict"]) for n in report.document["nodes"]] == [
        ("n1", "A", "ready"),
        ("n2", "B", "ready"),
    ]
    assert report.document["catalog"]["served_by"] == {"llama3:8b": ["n1", "n2"]}
    # The monitor timing is shown but judges nothing without hosts.
    slow = AGENT_ONLY.with_(residency_stale_s=5.0)
    assert judge(slow, agents(("n1", "A", 0.3))).exit_code == 0
    text = render_text(report.document)
    assert text.startswith("gemmanet audit: READY (exit 0)")
    assert "n2    yes (B)    fresh, owner beat 0.6 s ago" in text


def test_an_agent_node_whose_instance_went_silent_is_named_stale() -> None:
    # B beat 2.5 s ago: past GEMMANET_ALIVE_TTL_S (2 s), its peers no longer place on n2.
    report = judge(AGENT_ONLY, agents(("n1", "A", 0.3), ("n2", "B", 2.5)))
    assert report.exit_code == 1
    assert [(f.code, f.subject) for f in report.reasons] == [("stale_facts", "n2")]
    assert "instance B last beat 2.5 s ago" in report.reasons[0].message
    n1, n2 = report.document["nodes"]
    assert (n1["ready"], n2["ready"], n2["fresh"], n2["verdict"]) == (
        True,
        False,
        False,
        "stale_facts",
    )
    assert report.document["catalog"]["served_by"] == {"llama3:8b": ["n1"]}
    assert "NOT READY" in render_text(report.document)


def test_missing_or_foreign_node_facts_are_reasons() -> None:
    observed = agents(("n1", "A", 0.1), ("n2", "A", 0.1))
    del observed.node_facts["n1"]
    observed.node_facts["n2"] = NodeFacts("n2", "c-older", "B", 2, 8.0, {})
    assert [(f.code, f.subject) for f in judge(AGENT_ONLY, observed).reasons] == [
        ("no_facts", "n1"),
        ("stale_facts", "n2"),
    ]
    # Nothing to place on at all.
    assert reason_codes(Observed(), AGENT_ONLY) == [("no_hosts", None)]


def test_agent_node_warnings_budgets_catalog_and_never_fitting_models() -> None:
    observed = agents(("n1", "A", 0.1), vram_gb=None)
    observed.connected["n2"] = ConnectedNode("n2", "A", ("llama3:8b", "qwen"), 2, 4.0, "c-n2")
    observed.node_facts["n2"] = NodeFacts("n2", "c-n2", "A", 3, 4.0, {})  # another file's 3
    report = judge(AGENT_ONLY, observed)
    assert report.exit_code == 0
    assert [(w.code, w.subject) for w in report.warnings] == [
        ("no_memory_budget", "n1"),
        ("budget_mismatch", "n2"),
        ("model_never_fits", "n2"),
        ("catalog_unlisted", "qwen"),
    ]
    assert report.document["catalog"]["unlisted"] == {"qwen": ["n2"]}
    assert report.document["nodes"][1]["uncatalogued"] == ["qwen"]
