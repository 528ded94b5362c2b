"""Prometheus metrics of one coordinator instance (``GET /metrics``).

Every instance owns its ``CollectorRegistry`` (never the process-global default), so several
instances in one process (tests, the simulator) keep their counts apart. The shell counts
events where they happen (runtime/, api/, the Redis link); the gauges and the counters the
machines already keep (``Instance.diagnostics``) are read at scrape time, so the pure core
stays free of metrics code.

Labels stay low-cardinality: never task ids or key ids. The one exception, documented in the
README, is ``node_id`` on ``gemmanet_node_replaced_total``: node ids are enrolled by the
operator (a bounded set), and per-node flapping is what the rollout check looks for. ``model``
on ``gemmanet_tokens_total`` is bounded the same way: only a task a node ran reports usage, so
only models the operator's nodes serve appear (per-key usage is ``GET /api/v1/usage``).

Counted where they happen:

==========================================  =========  ===========================================
name                                        type       labels and meaning
==========================================  =========  ===========================================
gemmanet_http_requests_total                counter    route (URL rule or "unmatched"), status
gemmanet_http_request_duration_seconds      histogram  route; until the response starts (a
                                                       stream's first event)
gemmanet_task_duration_seconds              histogram  path="local"|"remote" (the node's owner is
                                                       this instance or a peer); a placed task,
                                                       from the request asking to its end
gemmanet_task_outcomes_total                counter    code ("ok", "client_gone" or an error
                                                       code), status (HTTP status; 499 for a
                                                       client that left); refusals before a node
                                                       was chosen included (no_node_for_model,
                                                       all_nodes_busy after the queue, …)
gemmanet_tokens_total                       counter    model, kind="prompt"|"completion": tokens
                                                       of the tasks that ended with usage, as the
                                                       node's model server counted them
gemmanet_node_connects_total                counter    node connections registered
gemmanet_node_closes_total                  counter    code: the close code sent ("4000" replaced,
                                                       "4003" heartbeat timeout, …) or "gone"
                                                       (the node's side went away first)
gemmanet_node_replaced_total                counter    node_id: 4000 closes per node (flapping)
gemmanet_admission_queue_wait_seconds       histogram  time a request waited in the queue (only
                                                       requests that had to wait)
gemmanet_admission_queue_wait_by_priority_seconds
                                            histogram  priority: the API key's priority class
                                                       (``priority_class``: "1", "2-4", "5-9",
                                                       "10-24", "25-100"); the same waits
gemmanet_lease_grants_total                 counter    capacity leases granted
gemmanet_lease_denials_total                counter    reason: no_room (one per ask answered
                                                       "queued"), queue_timeout, queue_full,
                                                       key_limit, stale_facts, facts_missing,
                                                       no_node, coordination_unavailable
gemmanet_affinity_placements_total          counter    result: hit (the lease went to a node
                                                       predicted to hold some of the prefix),
                                                       miss, unavailable (the lookup failed or
                                                       timed out); only with GEMMANET_AFFINITY on
gemmanet_affinity_predicted_blocks          histogram  blocks of the prefix (256 characters each)
                                                       the chosen node was predicted to hold
gemmanet_bus_envelopes_sent_total           counter    envelopes handed to the instance bus
gemmanet_bus_envelopes_received_total       counter    envelopes read from this instance's inbox
gemmanet_bus_envelopes_dropped_total        counter    reason: outbox_full, gave_up (the store
                                                       stayed away past the envelope's deadline),
                                                       unreached (nobody listened), unreadable
gemmanet_redis_op_duration_seconds          histogram  op (command or script name)
gemmanet_redis_errors_total                 counter    op; operations that failed or timed out
gemmanet_peers_declared_dead_total          counter    peer instances this one judged dead
gemmanet_gc_pause_seconds                   histogram  generation (0, 1, 2); the process's garbage
                                                       collections: the event loop stops for each
                                                       (coordinator/server/gc_tuning.py)
==========================================  =========  ===========================================

Read at scrape time (``Instance.diagnostics``):

==========================================  =========  ===========================================
gemmanet_tasks_in_flight                    gauge      this instance's requests with a task out
gemmanet_forwarded_in_flight                gauge      tasks our nodes run for other instances
gemmanet_local_nodes                        gauge      node connections on this instance
gemmanet_admission_queue_depth              gauge      model; this instance's waiting requests
gemmanet_dropped_answers_total              counter    reason; node answers refused
gemmanet_liveness_lost_total                counter    times our own presence lapsed
gemmanet_bus_losses_total                   counter    times our inbox was lost
gemmanet_lost_leases_total                  counter    leases expired before their renewal
==========================================  =========  ===========================================

Read at scrape time from the facts reader (``hosts/facts_reader.py``, which reads the switch
every 0.5 s), only on an instance with ``[hosts]``:

==========================================  =========  ===========================================
gemmanet_host_placement_open                gauge      mode (GEMMANET_HOST_PLACEMENT): 1 while the
                                                       gate lets this instance place on direct
                                                       hosts (those with fresh facts), else 0
gemmanet_host_placement_switch_readable     gauge      1 if the last read of the shared switch
                                                       succeeded, else 0; ``gated`` only
==========================================  =========  ===========================================

prometheus-client's own collectors are registered on the instance's registry too: the
process's ``process_*`` series (CPU seconds, resident and virtual memory, open and maximum file
descriptors, start time) and ``python_info``. Instances sharing a process report the same
process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from coordinator.core.hosts.gate import GateView
from coordinator.errors import GemmaNetError
from protocol import Usage

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Seconds: tasks run from milliseconds (echo) to minutes (long generations).
#: the upper ends of the priority classes of the queue wait by priority (bounded labels)
PRIORITY_CLASSES = ((1, "1"), (4, "2-4"), (9, "5-9"), (24, "10-24"), (100, "25-100"))


def priority_class(priority: int) -> str:
    """The label of a key priority (1-100) in the queue wait by priority."""
    return next((label for top, label in PRIORITY_CLASSES if priority <= top), "25-100")


TASK_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
AFFINITY_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
REDIS_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)

#: outcomes that are not an error code, with the status they stand for
_OUTCOME_STATUS = {"ok": 200, "client_gone": 499, "internal_error": 500}


def _statuses() -> dict[str, int]:
    """Every error code of the hierarchy and its HTTP status (``coordinator/errors.py``)."""
    found: dict[str, int] = {}
    pending: list[type[GemmaNetError]] = [GemmaNetError]
    while pending:
        cls = pending.pop()
        found.setdefault(cls.code, cls.status)
        pending += cls.__subclasses__()
    return {**found, **_OUTCOME_STATUS}


class _DiagnosticsCollector(Collector):
    """The gauges and the counters the machines keep, read when Prometheus scrapes."""

    def __init__(self, read: Callable[[], Mapping[str, object]]) -> None:
        self._read = read

    def collect(self) -> Iterator[Metric]:
        d = self._read()
        for name, key, doc in (
            ("gemmanet_tasks_in_flight", "local_in_flight", "requests with a task out"),
            ("gemmanet_forwarded_in_flight", "forwarded_in_flight", "tasks run for peers"),
            ("gemmanet_local_nodes", "local_nodes", "node connections on this instance"),
        ):
            yield GaugeMetricFamily(name, doc, value=_number(d.get(key)))
        queue = GaugeMetricFamily(
            "gemmanet_admission_queue_depth", "requests waiting for room", labels=["model"]
        )
        for model, depth in _mapping(d.get("local_queued")).items():
            queue.add_metric([model], depth)
        yield queue
        dropped = CounterMetricFamily(
            "gemmanet_dropped_answers", "node answers refused", labels=["reason"]
        )
        for reason, count in _mapping(d.get("dropped_answers")).items():
            dropped.add_metric([reason], count)
        yield dropped
        for name, key, doc in (
            ("gemmanet_liveness_lost", "liveness_lost", "times our own presence lapsed"),
            ("gemmanet_bus_losses", "bus_losses", "times our inbox was lost"),
            ("gemmanet_lost_leases", "lost_leases", "leases expired before renewal"),
        ):
            yield CounterMetricFamily(name, doc, value=_number(d.get(key)))

    def describe(self) -> Iterator[Metric]:
        # Declared without reading: registering must not call into a half-built instance.
        return iter(())


class _HostGateCollector(Collector):
    """The placement gate of direct hosts, read when Prometheus scrapes. Both families are
    declared on every instance; they hold a series only where there are hosts to gate."""

    def __init__(self, read: Callable[[], GateView | None]) -> None:
        self._read = read

    def collect(self) -> Iterator[Metric]:
        gate = self._read()
        placing = GaugeMetricFamily(
            "gemmanet_host_placement_open",
            "1 while the gate lets this instance place on direct hosts",
            labels=["mode"],
        )
        readable = GaugeMetricFamily(
            "gemmanet_host_placement_switch_readable",
            "1 if the last read of the placement switch succeeded",
        )
        if gate is not None:
            placing.add_metric([gate.mode], float(gate.open))
            if gate.switch_readable is not None:
                readable.add_metric([], float(gate.switch_readable))
        yield placing
        yield readable

    def describe(self) -> Iterator[Metric]:
        return iter(())


def _number(value: object) -> float:
    return float(value) if isinstance(value, int | float) else 0.0


def _mapping(value: object) -> dict[str, float]:
    if not isinstance(value, dict):
        return {}
    return {str(k): _number(v) for k, v in value.items()}


class Children:
    """A labelled metric's children, each looked up once: ``labels()`` takes a lock and
    builds its key on every call (a few µs, several times per request), a dict does not.
    Children are never removed from these metrics, so a cached one stays the metric's."""

    __slots__ = ("_children", "_metric")

    def __init__(self, metric: Any) -> None:
        self._metric = metric
        self._children: dict[tuple[str, ...], Any] = {}

    def __call__(self, *values: str) -> Any:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self._metric.labels(*values)
        return child


class Metrics:
    """The metrics of one instance; ``diagnostics`` and ``host_gate`` are read at every
    scrape."""

    def __init__(
        self,
        diagnostics: Callable[[], Mapping[str, object]],
        host_gate: Callable[[], GateView | None] = lambda: None,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self._status_of = _statuses()
        self.http_requests = Counter(
            "gemmanet_http_requests", "HTTP requests", ["route", "status"], registry=r
        )
        self.http_duration = Histogram(
            "gemmanet_http_request_duration_seconds",
            "HTTP request time until the response starts",
            ["route"],
            buckets=TASK_BUCKETS,
            registry=r,
        )
        self.task_duration = Histogram(
            "gemmanet_task_duration_seconds",
            "placed task time, local or cross-instance node",
            ["path"],
            buckets=TASK_BUCKETS,
            registry=r,
        )
        self.task_outcomes = Counter(
            "gemmanet_task_outcomes", "task outcomes by code", ["code", "status"], registry=r
        )
        self.tokens = Counter(
            "gemmanet_tokens", "tokens counted by model servers", ["model", "kind"], registry=r
        )
        self.node_connects = Counter(
            "gemmanet_node_connects", "node connections registered", registry=r
        )
        self.node_closes = Counter(
            "gemmanet_node_closes", "node connections closed, by code", ["code"], registry=r
        )
        self.node_replaced = Counter(
            "gemmanet_node_replaced", "4000 closes per node (flapping)", ["node_id"], registry=r
        )
        self.queue_wait = Histogram(
            "gemmanet_admission_queue_wait_seconds",
            "time waited in the admission queue",
            buckets=TASK_BUCKETS,
            registry=r,
        )
        self.queue_wait_by_priority = Histogram(
            "gemmanet_admission_queue_wait_by_priority_seconds",
            "time waited in the admission queue, by the API key's priority class",
            ["priority"],
            buckets=TASK_BUCKETS,
            registry=r,
        )
        self.lease_grants = Counter("gemmanet_lease_grants", "capacity leases granted", registry=r)
        self.lease_denials = Counter(
            "gemmanet_lease_denials", "capacity lease denials", ["reason"], registry=r
        )
        self.affinity_placements = Counter(
            "gemmanet_affinity_placements", "placements by prefix affinity", ["result"], registry=r
        )
        self.affinity_blocks = Histogram(
            "gemmanet_affinity_predicted_blocks",
            "prefix blocks the chosen node was predicted to hold",
            buckets=AFFINITY_BUCKETS,
            registry=r,
        )
        self.bus_sent = Counter("gemmanet_bus_envelopes_sent", "bus envelopes sent", registry=r)
        self.bus_received = Counter(
            "gemmanet_bus_envelopes_received", "bus envelopes received", registry=r
        )
        self.bus_dropped = Counter(
            "gemmanet_bus_envelopes_dropped", "bus envelopes dropped", ["reason"], registry=r
        )
        self.redis_duration = Histogram(
            "gemmanet_redis_op_duration_seconds",
            "Redis operation time",
            ["op"],
            buckets=REDIS_BUCKETS,
            registry=r,
        )
        self.redis_errors = Counter(
            "gemmanet_redis_errors", "Redis operations failed or timed out", ["op"], registry=r
        )
        self.peers_dead = Counter(
            "gemmanet_peers_declared_dead", "peer instances judged dead", registry=r
        )
        self.gc_pauses = Histogram(
            "gemmanet_gc_pause_seconds",
            "garbage collection pauses of the process (the event loop stops)",
            ["generation"],
            buckets=REDIS_BUCKETS,
            registry=r,
        )
        # The children counted on every request (``Children``).
        self.http_requests_of = Children(self.http_requests)
        self.http_duration_of = Children(self.http_duration)
        self.task_duration_of = Children(self.task_duration)
        self.task_outcomes_of = Children(self.task_outcomes)
        self.tokens_of = Children(self.tokens)
        self.lease_denials_of = Children(self.lease_denials)
        self.affinity_placements_of = Children(self.affinity_placements)
        self.queue_wait_by_priority_of = Children(self.queue_wait_by_priority)
        r.register(_DiagnosticsCollector(diagnostics))
        r.register(_HostGateCollector(host_gate))
        # The process's own series (process_cpu_seconds_total, process_resident_memory_bytes,
        # process_open_fds, …; python_info), read from /proc at scrape time.
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        # Peers counted dead and not seen alive since (a verdict repeats while a peer lingers).
        self._counted_dead: set[str] = set()
        self._redis_children: dict[str, tuple[Histogram, Counter]] = {}

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    # -- events -----------------------------------------------------------------------------

    def task_outcome(self, code: str, status: int | None = None) -> None:
        status = status if status is not None else self._status_of.get(code, 500)
        self.task_outcomes_of(code, str(status)).inc()

    def task_refused(self, error: GemmaNetError) -> None:
        """A request that ended before a task was placed (no node, queue timeout, …)."""
        self.task_outcome(error.code, error.status)

    def task_ended(self, outcome: str, *, local: bool, took_s: float) -> None:
        self.task_outcome(outcome)
        self.task_duration_of("local" if local else "remote").observe(took_s)

    def tokens_used(self, model: str, usage: Usage) -> None:
        """A task ended with the usage its node reported (a task without usage counts nothing)."""
        self.tokens_of(model, "prompt").inc(usage.prompt_tokens)
        self.tokens_of(model, "completion").inc(usage.completion_tokens)

    def affinity_placement(self, result: str, blocks: int) -> None:
        """A placement with affinity on: ``result`` hit, miss or unavailable."""
        self.affinity_placements_of(result).inc()
        if result != "unavailable":
            self.affinity_blocks.observe(blocks)

    def node_closed(self, node_id: str, code: int | None) -> None:
        """``code`` None: the node's side went away before we closed it."""
        self.node_closes.labels(code="gone" if code is None else str(code)).inc()
        if code == 4000:
            self.node_replaced.labels(node_id=node_id).inc()

    def peers_judged_dead(self, dead: set[str], live: set[str]) -> None:
        """Count each death once: again only after the peer was seen alive in between."""
        self.peers_dead.inc(len(dead - self._counted_dead))
        self._counted_dead = (self._counted_dead - (live - dead)) | dead

    def gc_pause(self, generation: int, took_s: float) -> None:
        self.gc_pauses.labels(str(generation)).observe(took_s)

    def redis_op(self, what: str, took_s: float, failed: bool) -> None:
        # On every Redis command: the labelled children are looked up once per op name.
        children = self._redis_children.get(what)
        if children is None:
            # "SUBSCRIBE 'gn:inbox:A'" -> "SUBSCRIBE": the op, not its arguments.
            op = what.split(" '", 1)[0]
            children = (self.redis_duration.labels(op=op), self.redis_errors.labels(op=op))
            self._redis_children[what] = children
        children[0].observe(took_s)
        if failed:
            children[1].inc()
