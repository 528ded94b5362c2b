"""Elected residency monitors in the simulator (``--monitors N``).

N candidates run the production monitor loop (``coordinator.monitor.loop.run_monitor``: the real
election, fenced writes, step-down) on virtual time, each through its own road to the run's
shared coordination state. The direct hosts they poll are simulated behind an
``httpx.MockTransport`` that answers in Ollama's and the OpenAI API's wire format, so the real
poller parses the answers and the real poll timeout applies. A reader reads the facts and
judges each host with placement's own rule (``coordinator.core.hosts.direct_hosts.host_state``). The pause fault stops one monitor (or all) and resumes it.

What the store did with each election and fact write is traced from the store's side, read from
the state in the same atomic step as the call (nothing can run in between), so the invariants
judge the store, not what a monitor believes.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from functools import partial
from typing import Any, ClassVar

import httpx
import trio

from coordinator.capacity import Capacity, HostSpec
from coordinator.coordination import CoordinationUnavailable
from coordinator.coordination.memory.coordination import MemoryCoordination, MemoryState
from coordinator.coordination.monitor_types import MonitorClaim
from coordinator.core.hosts import direct_hosts
from coordinator.hosts.facts_reader import host_read
from coordinator.monitor.election import Candidacy
from coordinator.monitor.loop import run_monitor
from coordinator.monitor.timing import check_monitor_bound
from coordinator.settings import Settings
from sim.faults import ROADS, Fault, FaultyCoordination, Gate, Road, StoreState
from sim.trace import Trace

#: monitor timing scaled to the simulator's short runs; it passes the production start-up
#: check (poll + TTL + retry + 2 x poll timeout = 4.5 s fits the 5 s staleness window)
SIM_MONITOR_TIMING: dict[str, float] = {
    "monitor_poll_s": 1.0,
    "monitor_ttl_s": 2.0,
    "monitor_retry_s": 0.5,
    "monitor_poll_timeout_s": 0.5,
    "residency_stale_s": 5.0,
}
#: how often the reader reads the facts, as placement would before each decision
READ_EVERY_S = 0.5

#: the models a simulated Ollama host can load, with their size in bytes
HOST_MODELS = {"m1": 4_000_000_000, "m2": 6_000_000_000, "m3": 3_000_000_000}
HOST_KINDS = {"H0": "ollama", "H1": "ollama", "H2": "openai"}


def host_url(host_id: str) -> str:
    return f"http://{host_id.lower()}.sim:11434"


class SimHost:
    """A direct model host: loads and unloads models at random times; answers a poll with what
    is loaded when the request arrives, after a latency (now and then past the poll timeout,
    so the monitor writes it as unreachable)."""

    def __init__(self, host_id: str, kind: str, rng: random.Random) -> None:
        self.host_id, self.kind, self.rng = host_id, kind, rng
        self.resident: dict[str, int] = {}

    @property
    def url(self) -> str:
        return host_url(self.host_id)

    async def run(self) -> None:
        while True:
            await trio.sleep(self.rng.uniform(0.3, 2.5))
            if self.kind == "ollama":
                model = self.rng.choice(sorted(HOST_MODELS))
                if self.resident.pop(model, None) is None:
                    self.resident[model] = HOST_MODELS[model]

    def latency(self) -> float:
        return 1.0 if self.rng.random() < 0.03 else self.rng.uniform(0.005, 0.1)

    def answer(self, path: str) -> tuple[int, dict[str, Any]]:
        if self.kind == "ollama" and path == "/api/ps":
            loaded = sorted(self.resident.items())
            return 200, {"models": [{"name": n, "model": n, "size": s} for n, s in loaded]}
        if self.kind == "ollama" and path == "/api/tags":
            return 200, {"models": [{"name": n, "model": n} for n in sorted(HOST_MODELS)]}
        if self.kind == "openai" and path == "/v1/models":
            data = [{"id": n, "object": "model"} for n in sorted(HOST_MODELS)]
            return 200, {"object": "list", "data": data}
        return 404, {"error": "not found"}


# The first request of a poll, whose answer says what is loaded: the observation time.
_OBSERVING = ("/api/ps", "/v1/models")


def host_transport(hosts: dict[str, SimHost], observed_at: dict[str, float]) -> httpx.MockTransport:
    """One monitor's network to the hosts; notes when it observed each host (its last poll)."""
    by_name = {httpx.URL(h.url).host: h for h in hosts.values()}

    async def handle(request: httpx.Request) -> httpx.Response:
        host = by_name[request.url.host]
        if request.url.path in _OBSERVING:
            observed_at[host.host_id] = trio.current_time()
        status, body = host.answer(request.url.path)
        await trio.sleep(host.latency())
        return httpx.Response(status, json=body)

    return httpx.MockTransport(handle)


# The gated monitor road of sim/faults.py, built at run time from the role's Protocol.
_MonitorRoad: type[Road] = ROADS["monitor"]


class WatchedMonitor(_MonitorRoad):  # type: ignore[misc,valid-type]  # a class built at run time
    """A monitor's road to the store that tells the trace what the store did with each acquire
    and fact write."""

    faults: WatchedCoordination

    async def monitor_acquire(self, candidate: str, ttl_s: float) -> MonitorClaim:
        claim: MonitorClaim = await super().monitor_acquire(candidate, ttl_s)
        if claim.held:
            self.faults.trace.emit("monitor.acquired", candidate=candidate, epoch=claim.epoch)
        return claim

    async def write_host_facts(
        self, candidate: str, epoch: int, host_id: str, record: bytes, *, fenced: bool = True
    ) -> bool:
        accepted: bool = await super().write_host_facts(
            candidate, epoch, host_id, record, fenced=fenced
        )
        watched = self.faults
        # No checkpoint since the write: this is the state the write left.
        status = watched.state.monitor.status()
        watched.trace.emit(
            "monitor.write",
            candidate=candidate,
            epoch=epoch,
            host=host_id,
            accepted=accepted,
            current_epoch=status.epoch,
            holder=status.holder,
            observed_at=round(watched.observed_at.get(host_id, -1.0), 6),
            reachable=bool(json.loads(record).get("reachable")),
        )
        return accepted


class WatchedCoordination(FaultyCoordination):
    """A monitor's road to the store (its own freeze gate, the run's store outages) whose
    monitor role is a ``WatchedMonitor``."""

    roads: ClassVar[dict[str, type[Road]]] = {**ROADS, "monitor": WatchedMonitor}

    def __init__(
        self,
        state: MemoryState,
        gate: Gate,
        store: StoreState,
        trace: Trace,
        observed_at: dict[str, float],
    ) -> None:
        super().__init__(MemoryCoordination(trio.current_time, state=state), gate, store)
        self.state, self.trace, self.observed_at = state, trace, observed_at


@dataclass
class SimMonitor:
    name: str
    gate: Gate
    coordination: WatchedCoordination
    observed_at: dict[str, float] = field(default_factory=dict)
    candidacy: Candidacy | None = None


class MonitorCast:
    """The run's monitors, hosts and facts reader."""

    def __init__(
        self, seed: int, count: int, trace: Trace, state: MemoryState, store: StoreState
    ) -> None:
        self.trace, self.state, self.store = trace, state, store
        hosts = {
            host_id: HostSpec(url=host_url(host_id), kind=kind)
            for host_id, kind in HOST_KINDS.items()
        }
        self.settings = Settings(capacity=Capacity(hosts=hosts), **SIM_MONITOR_TIMING)  # type: ignore[arg-type]
        check_monitor_bound(self.settings)  # the production start-up check
        self.hosts = {
            host_id: SimHost(host_id, kind, random.Random(f"{seed}:host:{host_id}"))
            for host_id, kind in HOST_KINDS.items()
        }
        self.monitors: dict[str, SimMonitor] = {}
        for i in range(count):
            name, gate, observed_at = f"M{i}", Gate(), dict[str, float]()
            coordination = WatchedCoordination(state, gate, store, trace, observed_at)
            self.monitors[name] = SimMonitor(name, gate, coordination, observed_at)
        self.elections = self.pauses = 0

    async def start(self, nursery: trio.Nursery) -> None:
        timing = self.settings
        self.trace.emit(
            "monitor.timing",
            stale_s=timing.residency_stale_s,
            ttl_s=timing.monitor_ttl_s,
            poll_timeout_s=timing.monitor_poll_timeout_s,
        )
        for host in self.hosts.values():
            nursery.start_soon(host.run)
        for monitor in self.monitors.values():
            monitor.candidacy = await nursery.start(self._run, monitor)
        nursery.start_soon(self._read_facts)

    async def _run(
        self,
        monitor: SimMonitor,
        task_status: trio.TaskStatus[Candidacy] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        await run_monitor(
            monitor.coordination.monitor,
            monitor.coordination.telemetry,
            self.settings,
            monitor.name,
            emit=partial(self._emit, monitor.name),
            transport=host_transport(self.hosts, monitor.observed_at),
            task_status=task_status,
        )

    def _emit(self, candidate: str, event: dict[str, Any]) -> None:
        fields = dict(event)
        kind = fields.pop("event")
        if kind == "write":
            return  # traced from the store's side (``monitor.write``)
        if kind == "elected":
            self.elections += 1
        fields.pop("candidate", None)
        self.trace.emit(f"monitor.{kind}", candidate=candidate, **fields)

    async def _read_facts(self) -> None:
        """Read every host's facts as placement would, and say which it would trust."""
        reader = FaultyCoordination(
            MemoryCoordination(trio.current_time, state=self.state), Gate(), self.store
        )
        stale_s = self.settings.residency_stale_s
        while True:
            await trio.sleep(READ_EVERY_S)
            read_at = trio.current_time()
            try:
                # the epoch first: the facts are then judged in the same step as they are
                # read (an epoch newer than the read only makes a host look older: safe)
                epoch = (await reader.monitor.monitor_status()).epoch or None
                facts = await reader.monitor.host_facts()
            except CoordinationUnavailable:
                continue
            now = trio.current_time()
            self.trace.emit(
                "facts.read",
                facts={
                    host: {
                        "epoch": f.epoch,
                        "written_at": round(f.polled_at, 6),
                        # placement's own rule (coordinator/core/hosts/direct_hosts.py): would a
                        # request be placed on this host now?
                        "fresh": direct_hosts.host_state(
                            host_read(f, read_at), current_epoch=epoch, stale_s=stale_s, now=now
                        )
                        == "ok",
                    }
                    for host, f in sorted(facts.items())
                },
            )

    def primary(self) -> str | None:
        for name, monitor in sorted(self.monitors.items()):
            candidacy = monitor.candidacy
            if candidacy is not None and candidacy.primary and not monitor.gate.frozen:
                return name
        return None

    async def pause(self, fault: Fault) -> None:
        """Stop a monitor's every store call (a SIGSTOP seen from the store) for the fault's
        duration. Its next tick still polls, then waits at the write with the epoch it holds;
        resumed, it writes with that token and must be turned away if a standby took over."""
        if fault.target == "primary":
            primary = self.primary()
            names = [] if primary is None else [primary]
        elif fault.target == "all":
            names = sorted(self.monitors)
        else:
            names = [fault.target] if fault.target in self.monitors else []
        gates = [self.monitors[n].gate for n in names if not self.monitors[n].gate.frozen]
        if not gates:
            return
        self.pauses += 1
        self.trace.emit("monitor.paused", candidates=names)
        for gate in gates:
            gate.freeze()
        await trio.sleep(fault.duration)
        for gate in gates:
            gate.thaw()
        self.trace.emit("monitor.unpaused", candidates=names)

    def summary(self) -> dict[str, int]:
        status = self.state.monitor.status()
        return {
            "elections": self.elections,
            "pauses": self.pauses,
            "fenced_rejects": status.fenced_rejects,
            "epoch": status.epoch,
        }


def draw_monitor_pauses(
    rng: random.Random, monitors: list[str], *, traffic_s: float
) -> list[Fault]:
    """One to three pauses: mostly of whoever is primary at the time (so a standby takes over
    when the pause outlasts the TTL), sometimes of one named candidate, sometimes of all (then
    the facts age past the window and a reader must stop trusting them)."""
    faults = []
    for _ in range(rng.randint(1, 3)):
        at = round(rng.uniform(2.0, traffic_s * 0.8), 3)
        roll = rng.random()
        if roll < 0.2:
            target, duration = "all", round(rng.uniform(3.0, 12.0), 3)
        elif roll < 0.35:
            target, duration = rng.choice(monitors), round(rng.uniform(0.3, 6.0), 3)
        else:
            target, duration = "primary", round(rng.uniform(0.3, 6.0), 3)
        faults.append(Fault(at=at, kind="monitor_pause", target=target, duration=duration))
    return faults
