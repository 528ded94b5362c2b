"""Each instance reads the monitor's host facts for placement, every ``READ_S``.

One read is ``Coordination.host_facts`` and ``monitor_status`` (the current epoch); the pure
rule in ``core/hosts/direct_hosts.py`` decides from them, and from the local time since the read,
which hosts are candidates. For every host that is, this instance also writes its *lease
facts* (``put_node_facts``: the host's parallel and memory budgets from the operator file, its
loaded models), naming itself as their writer: the lease script trusts facts while their
writer beats, so every live instance keeps them trusted, and after one dies the next read of
any other instance takes them over. Nothing is dropped: placement stops using a host as soon
as its monitor facts are stale, whatever its lease facts say.

When the store cannot be read, the last read stays, ageing: its hosts stop being candidates
once it is older than the staleness window (fail closed).

With ``GEMMANET_HOST_PLACEMENT=gated`` the same read takes the placement switch
(``host_placement``, set by ``gemmanet audit --enable``/``--disable``), so every instance
follows it within ``READ_S``; the gate itself is ``core/hosts/gate.py``. A switch that cannot be
read leaves the last one read in force (the facts, unread too, age out); ``gate()`` says which
(``gemmanet_host_placement_switch_readable``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

from coordinator.capacity import Capacity
from coordinator.coordination import CoordinationUnavailable, Leases, MonitorStore
from coordinator.coordination.leases import NodeFacts
from coordinator.coordination.monitor_types import HostFacts, PlacementSwitch
from coordinator.core.hosts.direct_hosts import (
    DirectHosts,
    HostRead,
    HostTerms,
    host_conn_id,
    host_state,
)
from coordinator.core.hosts.gate import GateView
from coordinator.settings import Settings

__all__ = ["READ_S", "HostFactsReader"]

log = logging.getLogger("gemmanet.hosts")

READ_S = 0.5

_SAYS = {
    "ok": "its facts are fresh, a candidate",
    "no_facts": "no monitor facts, not a candidate",
    "unreachable": "unreachable at the monitor's last poll, not a candidate",
    "old_epoch": "facts of an earlier monitor epoch, not a candidate",
    "stale": "facts older than GEMMANET_RESIDENCY_STALE_S, not a candidate",
}
_GATED = "its facts are fresh, not a candidate while placement on direct hosts is off"


def host_read(facts: HostFacts, read_at: float) -> HostRead:
    models = facts.record.get("models")
    error = facts.record.get("error")
    resident = {
        str(m): float(gb)
        for m, gb in facts.resident.items()
        if isinstance(gb, int | float) and not isinstance(gb, bool)
    }
    return HostRead(
        reachable=facts.reachable,
        epoch=facts.epoch,
        age_s=facts.age_s,
        read_at=read_at,
        models=frozenset(str(m) for m in models) if isinstance(models, list) else frozenset(),
        resident=resident,
        error=str(error)[:200] if error is not None and not facts.reachable else None,
    )


class HostFactsReader:
    def __init__(
        self,
        instance_id: str,
        capacity: Capacity,
        monitor: MonitorStore,
        leases: Leases,
        hosts: DirectHosts,
        clock: Callable[[], float],
    ) -> None:
        self.me = instance_id
        self._capacity = capacity
        #: the monitor's fenced facts and epoch to read, and the lease facts written from them
        self._monitor = monitor
        self._leases = leases
        self._hosts = hosts
        self._clock = clock
        # host id -> its state at the last read, to log each change once
        self._states: dict[str, str] = {}
        #: the placement switch at the last read (gated only; None: never set)
        self.switch: PlacementSwitch | None = None
        #: whether the last attempt to read the switch succeeded (gated only)
        self.switch_readable = False

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        if not self._hosts:
            task_status.started()
            return
        await self.read_once()
        if not self._hosts.placing:
            log.info(
                "placement on direct hosts is off (GEMMANET_HOST_PLACEMENT=%s%s)",
                self._hosts.placement,
                ", the switch off: `gemmanet audit --enable` turns it on, with Redis"
                if self._hosts.placement == "gated"
                else "",
            )
        task_status.started()
        while True:
            await trio.sleep(READ_S)
            await self.read_once()

    async def read_once(self) -> None:
        # The time before the read: the facts were at least this old then (conservative).
        read_at = self._clock()
        try:
            found = await self._monitor.host_facts(sorted(self._hosts.terms))
            epoch = (await self._monitor.monitor_status()).epoch
        except CoordinationUnavailable as exc:
            log.warning("cannot read the direct hosts' facts: %s", exc)
            self.switch_readable = False  # not even tried: the store did not answer
            return
        reads = {host_id: host_read(facts, read_at) for host_id, facts in found.items()}
        current = epoch or None
        if self._hosts.placement == "gated":
            await self._read_switch()
        try:
            # Written before placement sees the read: a lease needs them.
            for host_id, read in sorted(reads.items()):
                state = host_state(
                    read, current_epoch=current, stale_s=self._hosts.stale_s, now=self._clock()
                )
                if state == "ok":
                    await self._leases.put_node_facts(self._lease_facts(host_id, read))
        except CoordinationUnavailable as exc:
            log.warning("cannot write the direct hosts' lease facts: %s", exc)
        self._hosts.facts_read(reads, current)
        self._log_changes()

    async def _read_switch(self) -> None:
        try:
            switch = await self._monitor.host_placement()
        except CoordinationUnavailable as exc:  # the last read stands; the facts age out
            log.warning("cannot read the placement switch of direct hosts: %s", exc)
            self.switch_readable = False
            return
        was = self._hosts.placing
        self.switch, self.switch_readable = switch, True
        self._hosts.switch_read(switch.enabled if switch is not None else None)
        if self._hosts.placing != was and switch is not None:
            log.info(
                "placement on direct hosts switched %s by %s",
                "on" if switch.enabled else "off",
                switch.by,
            )

    def gate(self) -> GateView | None:
        """The gate now, for the metrics (None: no ``[hosts]``, nothing to gate)."""
        if not self._hosts:
            return None
        gated = self._hosts.placement == "gated"
        return GateView(
            self._hosts.placement, self._hosts.placing, self.switch_readable if gated else None
        )

    def _log_changes(self) -> None:
        now = self._clock()
        for host_id in sorted(self._hosts.terms):
            state = self._hosts.state(host_id, now)
            if self._states.get(host_id, "no_facts") != state:
                level = logging.INFO if state == "ok" else logging.WARNING
                says = _SAYS[state] if self._hosts.placing or state != "ok" else _GATED
                log.log(level, "direct host %s: %s for placement", host_id, says)
            self._states[host_id] = state

    def _lease_facts(self, host_id: str, read: HostRead) -> NodeFacts:
        terms = self._hosts.terms[host_id]
        resident = {}
        for model, gb in sorted(read.resident.items()):
            # The catalog's size where it has one: leases charge models by the catalog.
            resident[model] = self._capacity.cost(model).resident_gb or gb
        return NodeFacts(
            node_id=host_id,
            conn_id=host_conn_id(host_id),
            instance_id=self.me,
            max_parallel=terms.max_parallel,
            memory_gb=terms.memory_gb,
            resident=resident,
        )


def direct_hosts(settings: Settings) -> DirectHosts:
    """The operator file's direct hosts, as placement weighs them."""
    terms = {
        host_id: HostTerms(spec.kind, spec.max_parallel, spec.memory_gb, spec.weight)
        for host_id, spec in settings.capacity.hosts.items()
    }
    return DirectHosts(
        settings.instance_id, terms, settings.residency_stale_s, placement=settings.host_placement
    )
