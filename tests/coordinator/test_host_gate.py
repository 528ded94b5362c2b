"""The enablement gate of placement on direct hosts: the pure rule (``core/hosts/gate.py``), the
machine with the gate closed and opened (fresh facts alone place nothing; closing it stops new
placements and lets the call in flight finish), an instance's facts reader following the
switch in a real memory store and the metrics it feeds (``gemmanet_host_placement_open``,
``..._switch_readable``), the refusal of ``on`` without Redis, and the audit's part:
``--enable`` refused naming the red gates, the report showing who switched and when.

The end-to-end run (real processes, real Redis, two instances, ``gemmanet audit --enable`` and
``--disable``) is tests/e2e/test_host_gate.py."""

from __future__ import annotations

import random

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from coordinator.audit.findings import Observed, judge
from coordinator.audit.gate import check_by, enable_refusal
from coordinator.audit.nodes import Finding
from coordinator.audit.render import render_text
from coordinator.capacity import parse_capacity
from coordinator.coordination.memory.coordination import MemoryCoordination
from coordinator.coordination.monitor_types import HostFacts, MonitorStatus, PlacementSwitch
from coordinator.core.cluster_view import host_infos
from coordinator.core.effects import Deliver, DoneEvent, Reserve, StopHostCall
from coordinator.core.hosts.direct_hosts import DirectHosts, HostRead, HostTerms
from coordinator.core.hosts.gate import hosts_placeable
from coordinator.core.instance_machine import InstanceMachine
from coordinator.errors import NoNodeForModel, SettingsError
from coordinator.hosts.facts_reader import HostFactsReader, direct_hosts
from coordinator.runtime.metrics import Metrics
from coordinator.settings import Settings
from protocol import Assign, BusResult

HOST_FILE = '[hosts."box"]\nurl = "http://box:11434"\nkind = "ollama"\nmax_parallel = 2\n'
FRESH = HostRead(reachable=True, epoch=1, age_s=0.0, read_at=100.0, models=frozenset({"llama3"}))


@pytest.mark.parametrize(
    ("mode", "switch", "placing"),
    [
        ("gated", None, False),  # a new deployment: never switched on
        ("gated", False, False),
        ("gated", True, True),
        ("on", None, True),  # a deployment from before the gate: the facts alone decide
        ("on", False, True),
        ("off", True, False),
    ],
)
def test_the_rule(mode, switch, placing) -> None:  # type: ignore[no-untyped-def]
    assert hosts_placeable(mode, switch) is placing


def machine() -> InstanceMachine:
    hosts = DirectHosts("A", {"box": HostTerms("ollama", max_parallel=2)}, 15.0)
    hosts.facts_read({"box": FRESH}, 1)
    return InstanceMachine("A", forward_grace_s=5.0, rng=random.Random(0), hosts=hosts)


def submit(m: InstanceMachine, task_id: str, now: float = 100.0):  # type: ignore[no-untyped-def]
    assign = Assign(task_id=task_id, model="llama3", prompt="p", timeout_s=30.0)
    return m.submit(assign, deadline=now + 30.0, now=now)


def test_fresh_facts_place_nothing_until_the_switch_is_on_and_nothing_new_after_it_is_off() -> None:
    m = machine()
    assert m.hosts.state("box", 100.0) == "ok"  # the facts rule alone would place on it
    with pytest.raises(NoNodeForModel):  # the gate is closed by default
        submit(m, "t0")
    # GET /api/v1/nodes lists it with its facts' state, serving nothing.
    assert host_infos(m, 100.0)["box"]["models"] == []
    m.hosts.switch_read(True)
    assert host_infos(m, 100.0)["box"]["models"] == ["llama3"]
    assert submit(m, "t1") == [Reserve("t1", 1)]
    [view] = m.requester.candidates("t1", 1, 100.0) or []
    effects = m.reserved("t1", 1, view, "t1.1", 100.0)
    assert m.hosts.in_flight("box") == 1 and effects

    m.hosts.switch_read(False)  # gemmanet audit --disable, as the next read sees it
    with pytest.raises(NoNodeForModel):
        submit(m, "t2")
    # The call in flight is not stopped; its answer still reaches its request.
    assert not [e for e in m.tick(101.0, silence_deadline_s=None) if isinstance(e, StopHostCall)]
    done = BusResult(task_id="t1", node_id="box", conn_id="direct:box", output="hi", chunks=0)
    assert Deliver("t1", DoneEvent("hi")) in m.host_answer(done, 102.0)


def test_a_request_waiting_for_room_gets_no_host_once_the_switch_is_off() -> None:
    m = machine()
    m.hosts.switch_read(True)
    assert submit(m, "t1") == [Reserve("t1", 1)]
    m.hosts.switch_read(False)
    # The admission loop asks for candidates at every look: the host is gone from them.
    assert m.requester.candidates("t1", 1, 100.5) == []


async def test_an_instance_follows_the_switch_in_the_store() -> None:
    settings = Settings(instance_id="A", capacity=parse_capacity(HOST_FILE))
    async with MemoryCoordination(trio.current_time) as store:
        claim = await store.monitor.monitor_acquire("m1", 30.0)
        assert claim.epoch is not None
        record = b'{"host_id": "box", "reachable": true, "epoch": 1, "models": ["llama3"]}'
        assert await store.monitor.write_host_facts("m1", claim.epoch, "box", record)
        hosts = direct_hosts(settings)
        reader = HostFactsReader(
            "A", settings.capacity, store.monitor, store.leases, hosts, trio.current_time
        )
        await reader.read_once()
        assert hosts.state("box", trio.current_time()) == "ok"
        assert hosts.views(trio.current_time()) == [] and reader.switch is None

        on = PlacementSwitch(enabled=True, by="alice", at=1.0, epoch=claim.epoch)
        await store.monitor.set_host_placement(on)
        await reader.read_once()
        assert [v.node_id for v in hosts.views(trio.current_time())] == ["box"]
        assert reader.switch == on

        await store.monitor.set_host_placement(PlacementSwitch(enabled=False, by="bob", at=2.0))
        await reader.read_once()
        assert hosts.views(trio.current_time()) == []

        # GEMMANET_HOST_PLACEMENT=on and =off do not read the switch at all.
        for mode, placed in (("on", ["box"]), ("off", [])):
            hosts = direct_hosts(settings.with_(host_placement=mode))
            reader = HostFactsReader(
                "A", settings.capacity, store.monitor, store.leases, hosts, trio.current_time
            )
            await reader.read_once()
            assert [v.node_id for v in hosts.views(trio.current_time())] == placed, mode
            assert reader.switch is None


def gate_series(metrics: Metrics) -> dict[str, object]:
    """The gate's series of a scrape: name (with its mode label, if any) -> value."""
    found: dict[str, object] = {}
    for family in text_string_to_metric_families(metrics.exposition().decode()):
        for sample in family.samples:
            if sample.name.startswith("gemmanet_host_placement"):
                mode = sample.labels.get("mode")
                found[sample.name + (f"{{{mode}}}" if mode else "")] = sample.value
    return found


async def test_the_gate_metrics_follow_the_mode_and_the_switch_as_read() -> None:
    settings = Settings(instance_id="A", capacity=parse_capacity(HOST_FILE))
    async with MemoryCoordination(trio.current_time) as store:
        # The instance's own client of the shared state: closing it fails its reads only.
        client = MemoryCoordination(trio.current_time, state=store.state)
        hosts = direct_hosts(settings)
        reader = HostFactsReader(
            "A", settings.capacity, client.monitor, client.leases, hosts, trio.current_time
        )
        metrics = Metrics(dict, reader.gate)
        closed = {"gemmanet_host_placement_open{gated}": 0.0}
        assert gate_series(metrics) == {**closed, "gemmanet_host_placement_switch_readable": 0.0}
        await reader.read_once()  # never switched: closed by the switch, read fine
        readable = {"gemmanet_host_placement_switch_readable": 1.0}
        assert gate_series(metrics) == {**closed, **readable}

        on = PlacementSwitch(enabled=True, by="alice", at=1.0, epoch=1)
        await store.monitor.set_host_placement(on)
        await reader.read_once()
        assert gate_series(metrics) == {"gemmanet_host_placement_open{gated}": 1.0, **readable}

        # The store away: the last switch read stands (the facts age out), said as unreadable.
        client.link.closed = True
        await reader.read_once()
        assert gate_series(metrics) == {
            "gemmanet_host_placement_open{gated}": 1.0,
            "gemmanet_host_placement_switch_readable": 0.0,
        }
        client.link.closed = False  # back, like a reconnected Redis client
        await store.monitor.set_host_placement(PlacementSwitch(enabled=False, by="bob", at=2.0))
        await reader.read_once()
        assert gate_series(metrics) == {**closed, **readable}

        # on and off read no switch: no readable series, whatever the switch says.
        await store.monitor.set_host_placement(on)
        for mode, value in (("on", 1.0), ("off", 0.0)):
            hosts = direct_hosts(settings.with_(host_placement=mode))
            reader = HostFactsReader(
                "A", settings.capacity, client.monitor, client.leases, hosts, trio.current_time
            )
            await reader.read_once()
            assert gate_series(Metrics(dict, reader.gate)) == {
                f"gemmanet_host_placement_open{{{mode}}}": value
            }

    # No [hosts]: nothing to gate, no series (the families are still declared).
    bare = direct_hosts(Settings(instance_id="A"))
    async with MemoryCoordination(trio.current_time) as store:
        reader = HostFactsReader(
            "A", settings.capacity, store.monitor, store.leases, bare, trio.current_time
        )
        text = Metrics(dict, reader.gate).exposition().decode()
    assert "# TYPE gemmanet_host_placement_open gauge" in text
    assert gate_series(Metrics(dict, reader.gate)) == {}


def test_on_without_redis_is_refused_with_one_line() -> None:
    with pytest.raises(SettingsError) as refused:
        Settings.from_env({"GEMMANET_HOST_PLACEMENT": "on"})
    assert "GEMMANET_HOST_PLACEMENT=on needs GEMMANET_REDIS_URL" in str(refused.value)
    assert "\n" not in str(refused.value)
    assert Settings.from_env({}).host_placement == "gated"
    assert Settings.from_env({"GEMMANET_HOST_PLACEMENT": "off"}).host_placement == "off"
    redis = {"GEMMANET_REDIS_URL": "redis://r:6379/0", "GEMMANET_HOST_PLACEMENT": "on"}
    assert Settings.from_env(redis).host_placement == "on"
    with pytest.raises(SettingsError, match="must be 'gated' or 'on' or 'off'"):
        Settings.from_env({"GEMMANET_HOST_PLACEMENT": "yes"})


# -- the audit's part -------------------------------------------------------------------------

AUDITED = Settings(capacity=parse_capacity(HOST_FILE), redis_url="redis://r:6379/0")
MONITOR = MonitorStatus(holder="m1", lease_epoch=1, epoch=1, fenced_rejects=0)
BOX = {"host_id": "box", "reachable": True, "epoch": 1, "models": ["llama3"], "resident": {}}


def test_enable_is_refused_naming_every_red_gate_and_allowed_only_when_none_is_red() -> None:
    red = judge(AUDITED, Observed(monitor=MonitorStatus(None, None, 0, 0)))
    refusal = enable_refusal(AUDITED, red.reasons, None)
    assert refusal == (
        "audit --enable refused: not ready: no_monitor, no_facts (box); the switch is unchanged"
    )
    green = judge(AUDITED, Observed(monitor=MONITOR, facts={"box": HostFacts("box", BOX, 9, 1)}))
    assert green.exit_code == 0 and enable_refusal(AUDITED, green.reasons, None) is None
    assert "Redis is unreachable (refused)" in (enable_refusal(AUDITED, [], "refused") or "")
    no_hosts = AUDITED.with_(capacity=parse_capacity(""))
    assert "lists no [hosts]" in (enable_refusal(no_hosts, [], None) or "")
    assert enable_refusal(AUDITED, [Finding("stale_facts", "m", "box")], None) is not None


def test_the_report_shows_who_switched_and_when() -> None:
    switch = PlacementSwitch(enabled=True, by="alice@ops", at=1_764_763_200.0, epoch=1)
    facts = {"box": HostFacts("box", BOX, 9, 1)}
    doc = judge(AUDITED, Observed(monitor=MONITOR, facts=facts, switch=switch)).document
    assert doc["host_placement"] == {
        "mode": "gated",
        "placing": True,
        "switch": {"enabled": True, "by": "alice@ops", "at": 1_764_763_200.0, "epoch": 1},
    }
    line = "gate     ENABLED by alice@ops at 2025-12-03 12:00:00 UTC (monitor epoch 1): placing"
    assert line in render_text(doc)
    never = judge(AUDITED, Observed(monitor=MONITOR, facts=facts)).document
    assert "gate     never switched on (gemmanet audit --enable, once ready): hosts unused" in (
        render_text(never)
    )
    # A setting that does not follow the switch is a warning, said on the gate's line too.
    on = AUDITED.with_(host_placement="on")
    report = judge(on, Observed(monitor=MONITOR, facts=facts))
    assert [w.code for w in report.warnings] == ["placement_not_gated"]
    assert "GEMMANET_HOST_PLACEMENT=on: the switch is not followed" in render_text(report.document)


@pytest.mark.parametrize("name", ["", "a b", "x" * 65, "bob;rm"])
def test_a_bad_by_name_is_refused(name: str) -> None:
    with pytest.raises(SettingsError, match="--by"):
        check_by(name)
