"""Direct model hosts as placement candidates: the rule that decides whether the facts the
elected monitor wrote about a host may be trusted now, and the hosts' share of this instance's
work.

A direct host (an Ollama or OpenAI-compatible server listed under ``[hosts]`` in the operator
file) never connects to anybody: the requesting instance calls it itself. So a host is a
candidate of *every* instance, as a node whose owner is the instance itself, with a connection
id of its own (``direct:<host id>``) that the requester's tracker checks answers against like
any node's.

**Fail closed.** A host is a candidate only while its facts (``Coordination.host_facts``)

* exist and say it was reachable at the last poll,
* were written under the monitor epoch that is current now (a deposed monitor's last words are
  not trusted, even where fencing let none of them through, e.g. facts a store kept from an
  earlier election), and
* are younger than ``GEMMANET_RESIDENCY_STALE_S``, counting the time since they were read: the
  age the store reported plus the local time elapsed since the read.

And it serves a model only when its facts name it: among the models it *has* (Ollama:
``/api/tags``; OpenAI-compatible: ``/v1/models``) or loaded (``/api/ps``). A model that is
available but not loaded is a candidate too: Ollama loads it on the first request, as it
would for a node agent, and its memory is charged by the lease as for any node.

And no host is a candidate while the enablement gate (``gate.py``) is closed: with the
default ``GEMMANET_HOST_PLACEMENT=gated``, until ``gemmanet audit --enable`` switched it on.

Pure: the shell reads the facts, the epoch and the switch and hands them in with ``now``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from coordinator.core.hosts.gate import HostPlacement, hosts_placeable
from coordinator.core.placement.choose import NodeView

__all__ = [
    "DIRECT_OWNER",
    "DirectHosts",
    "HostRead",
    "HostState",
    "HostTerms",
    "host_conn_id",
    "host_state",
    "state_reason",
]

#: the connection id of a direct host starts with this (node connection ids never do)
HOST_CONN_PREFIX = "direct:"
#: what ``/api/v1/nodes`` shows as a direct host's instance: no instance owns it
DIRECT_OWNER = "direct"

#: why a host is or is not a candidate now
HostState = Literal["ok", "no_facts", "unreachable", "old_epoch", "stale"]


def host_conn_id(host_id: str) -> str:
    return HOST_CONN_PREFIX + host_id


@dataclass(frozen=True, slots=True)
class HostTerms:
    """What the operator file says about a host (``capacity.HostSpec``, the parts placement
    uses)."""

    kind: str
    max_parallel: int = 1
    memory_gb: float | None = None
    weight: float = 1.0


@dataclass(frozen=True, slots=True)
class HostRead:
    """One host's facts as the shell read them at local time ``read_at``."""

    reachable: bool
    epoch: int
    #: the facts' age on the store's clock when read
    age_s: float
    read_at: float
    models: frozenset[str] = frozenset()
    #: model -> GB loaded in memory now
    resident: Mapping[str, float] = field(default_factory=dict)
    #: why the monitor's poll failed (its facts' ``error``), when it did
    error: str | None = None

    def serves(self) -> frozenset[str]:
        return self.models | frozenset(self.resident)


def state_reason(state: HostState, read: HostRead | None) -> str | None:
    """The sentence an operator reads beside a host's state (None while it is "ok")."""
    if state == "ok":
        return None
    if state == "unreachable":
        error = read.error if read is not None and read.error else "no reason given"
        return f"the monitor's last poll failed: {error}"
    return {
        "no_facts": "no facts from a monitor yet (is one running?)",
        "old_epoch": "its facts were written under an earlier monitor epoch",
        "stale": "its facts are older than GEMMANET_RESIDENCY_STALE_S",
    }[state]


def host_state(
    read: HostRead | None, *, current_epoch: int | None, stale_s: float, now: float
) -> HostState:
    """Whether the facts may be trusted at ``now`` ("ok"), and if not, why not.
    ``current_epoch``: ``monitor:epoch`` as read with them (None: no monitor was ever
    elected)."""
    if read is None:
        return "no_facts"
    if current_epoch is None or read.epoch != current_epoch:
        return "old_epoch"
    if read.age_s + max(0.0, now - read.read_at) > stale_s:
        return "stale"
    if not read.reachable:
        return "unreachable"
    return "ok"


class DirectHosts:
    """The configured hosts, their last read facts and the tasks this instance runs on them."""

    def __init__(
        self,
        instance_id: str,
        hosts: Mapping[str, HostTerms],
        stale_s: float,
        *,
        placement: HostPlacement = "gated",
    ) -> None:
        self.me = instance_id
        self.terms = dict(hosts)
        self.stale_s = stale_s
        #: GEMMANET_HOST_PLACEMENT, and the shared switch at the last read (None: not known)
        self.placement: HostPlacement = placement
        self.switch_on: bool | None = None
        self._reads: dict[str, HostRead] = {}
        self._epoch: int | None = None
        #: task id -> host id, for the calls this instance runs now
        self._running: dict[str, str] = {}

    def __bool__(self) -> bool:
        return bool(self.terms)

    # -- facts ------------------------------------------------------------------------------

    def facts_read(self, reads: Mapping[str, HostRead], current_epoch: int | None) -> None:
        """A new read of the facts (hosts missing from ``reads`` have none)."""
        self._reads = {h: r for h, r in reads.items() if h in self.terms}
        self._epoch = current_epoch

    def switch_read(self, on: bool | None) -> None:
        """A new read of the shared switch (None: never set)."""
        self.switch_on = on

    @property
    def placing(self) -> bool:
        """Whether the gate lets placement use the hosts whose facts are fresh."""
        return hosts_placeable(self.placement, self.switch_on)

    def state(self, host_id: str, now: float) -> HostState:
        return host_state(
            self._reads.get(host_id), current_epoch=self._epoch, stale_s=self.stale_s, now=now
        )

    def read(self, host_id: str) -> HostRead | None:
        return self._reads.get(host_id)

    def views(self, now: float) -> list[NodeView]:
        """The hosts that are candidates at ``now``, as placement sees nodes (none while the
        gate is closed)."""
        if not self.placing:
            return []
        views = []
        for host_id in sorted(self.terms):
            read = self._reads.get(host_id)
            if read is None or self.state(host_id, now) != "ok":
                continue
            views.append(
                NodeView(
                    node_id=host_id,
                    instance_id=self.me,
                    conn_id=host_conn_id(host_id),
                    models=read.serves(),
                    max_parallel=self.terms[host_id].max_parallel,
                    in_flight=self.in_flight(host_id),
                    weight=self.terms[host_id].weight,
                )
            )
        return views

    # -- calls ------------------------------------------------------------------------------

    def host_of_conn(self, conn_id: str) -> str | None:
        if not conn_id.startswith(HOST_CONN_PREFIX):
            return None
        host_id = conn_id[len(HOST_CONN_PREFIX) :]
        return host_id if host_id in self.terms else None

    def started(self, task_id: str, host_id: str) -> None:
        self._running[task_id] = host_id

    def finished(self, task_id: str) -> bool:
        """The call ended or is being stopped; False when it was not running."""
        return self._running.pop(task_id, None) is not None

    def running(self, task_id: str) -> bool:
        return task_id in self._running

    def in_flight(self, host_id: str) -> int:
        return sum(1 for h in self._running.values() if h == host_id)
