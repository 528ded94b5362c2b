"""One simulation run: a cluster of real instances, simulated nodes and clients, a fault plan,
all on trio's MockClock and all drawn from one seed."""

from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import trio

from coordinator.capacity import Capacity, ModelCost
from coordinator.coordination.bus.memory import MemoryBus, MemoryBusHub
from coordinator.coordination.factory import BUS_NAMES
from coordinator.coordination.memory.coordination import MemoryCoordination, MemoryState
from coordinator.errors import StartupRefused
from coordinator.runtime.instance import Instance
from coordinator.settings import Settings
from protocol import CloseCode
from sim import mutations
from sim.actors import InstanceSide, SimNode, SocketClosed, SocketPair
from sim.faults import BusChaos, Fault, FaultPlan, FaultyBus, FaultyCoordination, Gate, StoreState
from sim.invariants import Invariant, Violation, fresh_invariants
from sim.lease_observer import LeaseObserver
from sim.stand_ins import SimStore
from sim.trace import Trace
from sim.traffic import Clients
from sim.trio_hook import mock_clock, pin_trio_scheduler

if TYPE_CHECKING:
    from sim.monitors import MonitorCast

#: the model catalog of every simulated instance: sizes that make the memory budgets of
#: 8 and 12 GB nodes bind (two m2 tasks do not fit in 8 GB)
SIM_CATALOG = Capacity(
    models={
        "m1": ModelCost(resident_gb=4.0, kv_gb=1.0),
        "m2": ModelCost(resident_gb=6.0, kv_gb=1.5),
        "m3": ModelCost(resident_gb=3.0, kv_gb=0.5),
    }
)


@dataclass(frozen=True)
class SimConfig:
    instances: int = 3
    nodes: int = 8
    clients: int = 6
    traffic_s: float = 20.0
    request_interval_s: float = 0.5
    stream_fraction: float = 0.3
    task_timeout_s: float = 10.0
    heartbeat_s: float = 1.0
    #: GEMMANET_HEARTBEAT_RATE of the instances (a low one makes them stretch the nodes'
    #: heartbeat interval and tell connected nodes, as past hundreds of nodes in production)
    heartbeat_rate: float = 200.0
    rate_limit: tuple[int, float] = (8, 4.0)
    forgers: int = 1
    mutation: str | None = None
    #: "pubsub" (at-most-once) or "streams" (durable inboxes, as GEMMANET_BUS=streams)
    bus: str = "pubsub"
    queue_timeout_s: float = 5.0
    #: elected residency monitor candidates (0: none, and the run is what it was before them)
    monitors: int = 0
    #: GEMMANET_QUEUE_POLICY of the instances: "fair" (keys take turns) or "fifo"
    queue_policy: str = "fair"


@dataclass
class SimResult:
    seed: int
    digest: str
    ok: bool
    virtual_seconds: float
    events: int
    wall_seconds: float
    violation: dict[str, Any] | None = None
    requests: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    faults: list[dict[str, object]] = field(default_factory=list)
    #: elections, pauses, fenced rejects, newest epoch (None: a run without monitors)
    monitor: dict[str, int] | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class SimInstance:
    def __init__(self, name: str, instance: Instance, gate: Gate, bus: MemoryBus) -> None:
        self.name, self.instance, self.gate, self.bus = name, instance, gate, bus
        self.scope = trio.CancelScope()
        self.nursery: trio.Nursery | None = None
        self.pairs: list[SocketPair] = []
        self.crashed = False


class World:
    def __init__(self, seed: int, config: SimConfig) -> None:
        if config.bus not in BUS_NAMES:
            raise ValueError(f"unknown bus {config.bus!r}: expected one of {BUS_NAMES}")
        self.seed, self.config = seed, config
        self.rng = {
            name: random.Random(f"{seed}:{name}")
            for name in ("plan", "nodes", "clients", "bus", "routing", "trio", "monitor-plan")
        }
        self.store = SimStore()
        self.store_state = StoreState()
        self.chaos = BusChaos()
        self.instances: dict[str, SimInstance] = {}
        self.nodes: dict[str, SimNode] = {}
        self.invariants: list[Invariant] = fresh_invariants()
        self.violation: Violation | None = None
        self.restarts = 0
        self.monitors: MonitorCast | None = None
        self.monitor_summary: dict[str, int] | None = None

    # -- the run ----------------------------------------------------------------------------

    def run(self) -> tuple[SimResult, Trace]:
        started = time.perf_counter()
        pin_trio_scheduler(f"{self.seed}:trio")  # exact replay: sim/trio_hook.py
        with mutations.applied(self.config.mutation):
            trio.run(self._main, clock=mock_clock())
        result = SimResult(
            seed=self.seed,
            digest=self.trace.digest,
            ok=self.violation is None,
            virtual_seconds=round(self.end_time, 6),
            events=self.trace.count,
            wall_seconds=round(time.perf_counter() - started, 3),
            violation=None
            if self.violation is None
            else {
                "invariant": self.violation.invariant,
                "message": self.violation.message,
                "t": self.violation.t,
            },
            requests=self.clients.count,
            outcomes=dict(sorted(self.clients.outcomes.items())),
            faults=self.plan.describe(),
            monitor=self.monitor_summary,
        )
        return result, self.trace

    async def _main(self) -> None:
        self.trace = Trace(trio.current_time)
        self.trace.listeners.append(self._check_invariants)
        self.state = MemoryState(trio.current_time)
        self.bus_hub = MemoryBusHub(trio.current_time)
        names = [f"I{i}" for i in range(self.config.instances)]
        node_ids = [f"N{i}" for i in range(self.config.nodes)]
        self.plan = FaultPlan.draw(
            self.rng["plan"], instances=names, nodes=node_ids, traffic_s=self.config.traffic_s
        )
        self.clients = Clients(
            self.seed,
            request_interval_s=self.config.request_interval_s,
            stream_fraction=self.config.stream_fraction,
            trace=self.trace,
            instances=self.instances,
            live=self.live_instances,
            walk_away_chance=lambda: self.plan.client_disconnect,
        )
        if self.config.monitors:
            # Imported here: the monitors' pollers bring httpx (~0.15 s), which a run without
            # monitors never uses.
            from sim.monitors import MonitorCast, draw_monitor_pauses

            # A stream of its own: the rest of the plan is the same with or without monitors.
            self.monitors = MonitorCast(
                self.seed, self.config.monitors, self.trace, self.state, self.store_state
            )
            self.plan.faults += draw_monitor_pauses(
                self.rng["monitor-plan"],
                sorted(self.monitors.monitors),
                traffic_s=self.config.traffic_s,
            )
            self.plan.faults.sort(key=lambda f: (f.at, f.kind, f.target))
        self.trace.emit(
            "run.start",
            seed=self.seed,
            plan=self.plan.describe(),
            queue_policy=self.config.queue_policy,
        )
        try:
            async with trio.open_nursery() as root:
                self.root = root
                for name in names:
                    await self._start_instance(name)
                if self.monitors is not None:
                    await self.monitors.start(root)
                for i, node_id in enumerate(node_ids):
                    self._start_node(
                        node_id, home=names[i % len(names)], forger=i < self.config.forgers
                    )
                await trio.sleep(2 * self.config.heartbeat_s)  # let nodes register everywhere
                for c in range(self.config.clients):
                    root.start_soon(self.clients.client, c)
                root.start_soon(self._run_faults)
                root.start_soon(self._tick)
                await trio.sleep(self.config.traffic_s)
                self.clients.sending = False
                with trio.move_on_after(self.config.task_timeout_s + 15):
                    while self.clients.open:
                        await trio.sleep(0.1)
                root.cancel_scope.cancel()
            self.end_time = trio.current_time()
            for invariant in self.invariants:
                invariant.at_end(self.end_time)
        except Violation as violation:
            self.violation = violation
        except BaseExceptionGroup as group:
            if _find_violation(group) is None:
                raise
        if self.violation is not None:
            self.end_time = self.violation.t
            self.trace.emit(
                "run.violation", invariant=self.violation.invariant, message=self.violation.message
            )
        if self.monitors is not None:
            self.monitor_summary = self.monitors.summary()  # reads the store: on virtual time

    def _check_invariants(self, event: dict[str, Any]) -> None:
        if self.violation is not None:
            return  # the run already failed; the rest is the unwinding
        for invariant in self.invariants:
            try:
                invariant.observe(event)
            except Violation as violation:
                self.violation = violation
                raise

    # -- instances --------------------------------------------------------------------------

    async def _start_instance(self, name: str) -> None:
        cfg = self.config
        settings = Settings(
            database_url="sim://",
            redis_url="sim://",
            multi_instance=True,
            instance_id=name,
            rate_limit=cfg.rate_limit,
            task_timeout_s=cfg.task_timeout_s,
            heartbeat_interval_s=cfg.heartbeat_s,
            heartbeat_rate=cfg.heartbeat_rate,
            capacity=SIM_CATALOG,
            queue_timeout_s=cfg.queue_timeout_s,
            queue_policy=cfg.queue_policy,
        )
        gate = Gate()
        coordination = FaultyCoordination(
            MemoryCoordination(trio.current_time, state=self.state),
            gate,
            self.store_state,
            observer=LeaseObserver(self.trace, self.state, name),
        )
        memory_bus = MemoryBus(
            hub=self.bus_hub, durable=cfg.bus == "streams", before_io=coordination.passage
        )
        bus = FaultyBus(memory_bus, coordination, self.rng["bus"], self.root, self.chaos)
        instance = Instance(
            settings,
            self.store,  # type: ignore[arg-type]
            coordination,
            bus,
            clock=trio.current_time,
            wall_clock=trio.current_time,
            rng=random.Random(f"{self.seed}:instance:{name}"),
        )
        sim = SimInstance(name, instance, gate, memory_bus)
        self.instances[name] = sim

        async def life(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            with sim.scope:
                async with trio.open_nursery() as nursery:
                    sim.nursery = nursery
                    await nursery.start(instance.run)
                    self.trace.emit("instance.up", instance=name)
                    task_status.started()

        await self.root.start(life)

    def live_instances(self) -> list[str]:
        return [n for n, s in sorted(self.instances.items()) if not s.crashed]

    def _connect(self, pair: SocketPair, preferred: str | None) -> str | None:
        live = self.live_instances()
        if not live:
            return None
        name = preferred if preferred in live else self.rng["routing"].choice(live)
        sim = self.instances[name]
        assert sim.nursery is not None
        side = InstanceSide(pair, sim.gate)
        sim.pairs.append(pair)

        async def serve() -> None:
            with side.handler_scope:
                await sim.instance.serve_node(side)

        sim.nursery.start_soon(serve)
        return name

    def _start_node(self, node_id: str, *, home: str | None, forger: bool = False) -> SimNode:
        rng = random.Random(f"{self.seed}:node:{node_id}:{len(self.nodes)}")
        node = SimNode(
            node_id=node_id,
            token=self.store.enroll(node_id),
            models=sorted(rng.sample(["m1", "m2", "m3"], k=rng.randint(1, 2))),
            max_parallel=rng.randint(1, 4),
            vram_gb=rng.choice([None, 8.0, 12.0]),
            latency=(0.05, rng.uniform(0.2, 2.0)),
            rng=rng,
            trace=self.trace,
            connect=self._connect,
            forger=forger,
            home=home,
            # Every other node offers v2: both versions serve side by side under every fault.
            speaks_v2=len(self.nodes) % 2 == 1,
        )
        if forger:
            self.store.enroll(node_id + "-x")
        self.nodes[node_id] = node
        self.root.start_soon(node.run)
        return node

    # -- faults -----------------------------------------------------------------------------

    async def _run_faults(self) -> None:
        start = trio.current_time()
        for fault in self.plan.faults:
            await trio.sleep_until(start + fault.at)
            self.root.start_soon(self._apply, fault)

    async def _apply(self, fault: Fault) -> None:
        self.trace.emit("fault", fault=fault.kind, target=fault.target, duration=fault.duration)
        if fault.kind == "crash_restart":
            await self._crash_restart(fault)
        elif fault.kind == "freeze":
            sim = self.instances.get(fault.target)
            if sim is None or sim.crashed:
                return
            sim.gate.freeze()
            if fault.duration >= 3.0:
                self.trace.emit("owner.dead", instance=sim.name, since=trio.current_time())
            await trio.sleep(fault.duration)
            sim.gate.thaw()
        elif fault.kind == "store_outage":
            self.store_state.go_down()
            await trio.sleep(fault.duration)
            self.store_state.come_back()
        elif fault.kind == "bus_chaos":
            self.chaos.drop, self.chaos.delay, self.chaos.duplicate = 0.05, 0.2, 0.1
            await trio.sleep(fault.duration)
            self.chaos.drop = self.chaos.delay = self.chaos.duplicate = 0.0
        elif fault.kind == "slow_node":
            self.nodes[fault.target].slow_until = trio.current_time() + fault.duration
        elif fault.kind == "node_move":
            live = self.live_instances()
            self.nodes[fault.target].drop_connection(
                self.rng["routing"].choice(live) if live else None
            )
        elif fault.kind == "monitor_pause" and self.monitors is not None:
            await self.monitors.pause(fault)
        elif fault.kind == "duplicate_identity":
            old = self.nodes[fault.target]
            others = [n for n in self.live_instances() if n != old.instance]
            if others:
                self._start_node(fault.target, home=self.rng["routing"].choice(others))

    async def _crash_restart(self, fault: Fault) -> None:
        sim = self.instances.get(fault.target)
        if sim is None or sim.crashed:
            return
        sim.crashed = True
        sim.bus.kill()  # its durable inbox presence lingers until its TTL, as after kill -9
        sim.gate.thaw()
        self.trace.emit("owner.dead", instance=sim.name, since=trio.current_time())
        sim.scope.cancel()  # like kill -9: nothing runs any more, nothing is cleaned up
        for pair in sim.pairs:
            pair.deliver_to_node(
                SocketClosed(CloseCode.ABNORMAL_CLOSURE)
            )  # the kernel closes its sockets
        await trio.sleep(fault.duration)
        self.restarts += 1
        name = f"{fault.target}r{self.restarts}"
        started = False
        while not started:  # a supervisor restarts it until it comes up (Redis may be down)
            started = True
            try:
                await self._start_instance(name)
            except* StartupRefused:
                started = False
                self.instances.pop(name, None)
                self.trace.emit("instance.refused", instance=name)
            if not started:
                await trio.sleep(1.0)

    async def _tick(self) -> None:
        while True:
            await trio.sleep(0.5)
            holders: dict[str, list[str]] = {}
            for name, sim in sorted(self.instances.items()):
                if sim.crashed or sim.gate.frozen or self.store_state.down:
                    continue
                for conn in sim.instance.nodes.connections():
                    holders.setdefault(conn.node_id, []).append(name)
            self.trace.emit(
                "tick", holders={n: h for n, h in sorted(holders.items()) if len(h) > 1}
            )


def _find_violation(group: BaseExceptionGroup[BaseException]) -> Violation | None:
    for exc in group.exceptions:
        if isinstance(exc, Violation):
            return exc
        if isinstance(exc, BaseExceptionGroup):
            found = _find_violation(exc)
            if found is not None:
                return found
    return None


def run_seed(seed: int, config: SimConfig | None = None) -> tuple[SimResult, Trace]:
    return World(seed, config or SimConfig()).run()
