"""Settings from GEMMANET_* environment variables (see INTERFACE.md and the README).

Each default is written once, on its field of ``Settings``: ``from_env`` passes only the
variables that are set, so an unset variable takes the field's default.
"""

from __future__ import annotations

import functools
import logging
import os
import secrets
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from coordinator.capacity import Capacity, load_capacity
from coordinator.core.hosts.gate import HOST_PLACEMENTS, HostPlacement
from coordinator.core.liveness import STREAMS_PRESENCE_TTL_S, LivenessTiming
from coordinator.errors import SettingsError
from coordinator.settings_values import (
    PERIODS,
    _choice,
    _database_url,
    _flag,
    _identifier,
    _name,
    _number,
    _port,
    _readable_file,
    _redis_url,
    _switch,
    _whole,
    check_redis_tls,
    parse_rate_limit,
)
from protocol.constraints import MAX_TIMEOUT_S

#: GEMMANET_DATABASE_URL unset: an SQLite file in the working directory. (Here rather than in
#: coordinator/store/, so that reading the settings, and every command's --help, loads no
#: SQLAlchemy.)
DEFAULT_DATABASE_URL = "sqlite:///./gemmanet.db"
# A heartbeat slower than this would leave a dead node's tasks hanging for minutes.
MAX_HEARTBEAT_S = 60.0
BUSES = ("pubsub", "streams")
QUEUE_POLICIES = ("fair", "fifo")
#: Variables no longer read, with why: a deployment that still sets one starts as before and is
#: told once, at start, that it has no effect (``Settings.from_env``), rather than refused.
RETIRED_VARIABLES = {
    "GEMMANET_REDIS_BUS_CLIENT": (
        "the Redis pub/sub bus has one client, the lean one, on every deployment"
    ),
}

log = logging.getLogger(__name__)


VARIABLES: dict[str, tuple[str, Callable[[str, str], object]]] = {
    "database_url": ("GEMMANET_DATABASE_URL", _database_url),
    "redis_url": ("GEMMANET_REDIS_URL", _redis_url),
    "redis_password_file": ("GEMMANET_REDIS_PASSWORD_FILE", _readable_file),
    # rediss:// verified against a private CA, optionally with a client certificate.
    "redis_ca_file": ("GEMMANET_REDIS_CA_FILE", _readable_file),
    "redis_cert_file": ("GEMMANET_REDIS_CERT_FILE", _readable_file),
    "redis_key_file": ("GEMMANET_REDIS_KEY_FILE", _readable_file),
    "multi_instance": ("GEMMANET_MULTI_INSTANCE", _flag),
    "bus": ("GEMMANET_BUS", lambda n, v: _choice(n, v, BUSES)),
    "key_prefix": ("GEMMANET_KEY_PREFIX", _name),
    "instance_id": ("GEMMANET_INSTANCE_ID", _identifier),
    "rate_limit": ("GEMMANET_RATE_LIMIT", lambda n, v: parse_rate_limit(v)),
    "task_timeout_s": (
        "GEMMANET_TASK_TIMEOUT_S",
        lambda n, v: _number(n, v, minimum=0.1, maximum=MAX_TIMEOUT_S),
    ),
    "heartbeat_interval_s": (
        "GEMMANET_HEARTBEAT_S",
        lambda n, v: _number(n, v, minimum=0.05, maximum=MAX_HEARTBEAT_S),
    ),
    "heartbeat_rate": (
        "GEMMANET_HEARTBEAT_RATE",
        lambda n, v: _number(n, v, minimum=0.0, maximum=1e6),
    ),
    "alive_ttl_s": (
        "GEMMANET_ALIVE_TTL_S",
        lambda n, v: _number(n, v, minimum=0.1, maximum=60.0),
    ),
    "sweep_s": ("GEMMANET_SWEEP_S", lambda n, v: _number(n, v, minimum=0.05, maximum=60.0)),
    "capacity": ("GEMMANET_CAPACITY_FILE", lambda n, v: load_capacity(v)),
    "queue_timeout_s": (
        "GEMMANET_QUEUE_TIMEOUT_S",
        lambda n, v: _number(n, v, minimum=0.0, maximum=MAX_TIMEOUT_S),
    ),
    "queue_max": ("GEMMANET_QUEUE_MAX", lambda n, v: _whole(n, v, minimum=0)),
    "max_active_per_key": ("GEMMANET_MAX_ACTIVE_PER_KEY", lambda n, v: _whole(n, v, minimum=1)),
    # The order of a model's admission queue (docs/fair-queuing.md).
    "queue_policy": ("GEMMANET_QUEUE_POLICY", lambda n, v: _choice(n, v, QUEUE_POLICIES)),
    "residency_stale_s": (
        "GEMMANET_RESIDENCY_STALE_S",
        lambda n, v: _number(n, v, minimum=1.0, maximum=3600.0),
    ),
    "lease_ttl_s": (
        "GEMMANET_LEASE_TTL_S",
        lambda n, v: _number(n, v, minimum=1.0, maximum=3600.0),
    ),
    # /metrics on a port of its own (README "Metrics and the rollout check").
    "metrics_port": ("GEMMANET_METRICS_PORT", _port),
    "metrics_host": ("GEMMANET_METRICS_HOST", lambda n, v: v),
    "telemetry_interval_s": (
        "GEMMANET_TELEMETRY_INTERVAL_S",
        lambda n, v: _number(n, v, minimum=0.1, maximum=3600.0),
    ),
    # Prefix-affine placement (docs/affinity.md).
    "affinity": ("GEMMANET_AFFINITY", _switch),
    "affinity_prefix_weight": (
        "GEMMANET_AFFINITY_PREFIX_WEIGHT",
        lambda n, v: _number(n, v, minimum=0.0, maximum=1000.0),
    ),
    "affinity_load_weight": (
        "GEMMANET_AFFINITY_LOAD_WEIGHT",
        lambda n, v: _number(n, v, minimum=0.0, maximum=1000.0),
    ),
    "affinity_ttl_s": (
        "GEMMANET_AFFINITY_TTL_S",
        lambda n, v: _number(n, v, minimum=1.0, maximum=86400.0),
    ),
    "affinity_max_blocks": ("GEMMANET_AFFINITY_MAX_BLOCKS", lambda n, v: _whole(n, v, minimum=1)),
    "affinity_lookup_timeout_s": (
        "GEMMANET_AFFINITY_LOOKUP_TIMEOUT_S",
        lambda n, v: _number(n, v, minimum=0.001, maximum=5.0),
    ),
    # SIGTERM's drain window (docs/operations.md).
    "drain_s": ("GEMMANET_DRAIN_S", lambda n, v: _number(n, v, minimum=0.0, maximum=MAX_TIMEOUT_S)),
    # The enablement gate of placement on direct hosts (core/hosts/gate.py).
    "host_placement": (
        "GEMMANET_HOST_PLACEMENT",
        lambda n, v: _choice(n, v, HOST_PLACEMENTS),
    ),
    # The elected residency monitor (README "Monitor and fencing").
    "monitor": ("GEMMANET_MONITOR", _flag),
    "monitor_poll_s": (
        "GEMMANET_MONITOR_POLL_S",
        lambda n, v: _number(n, v, minimum=0.05, maximum=3600.0),
    ),
    "monitor_ttl_s": (
        "GEMMANET_MONITOR_TTL_S",
        lambda n, v: _number(n, v, minimum=0.1, maximum=3600.0),
    ),
    "monitor_retry_s": (
        "GEMMANET_MONITOR_RETRY_S",
        lambda n, v: _number(n, v, minimum=0.05, maximum=3600.0),
    ),
    "monitor_poll_timeout_s": (
        "GEMMANET_MONITOR_POLL_TIMEOUT_S",
        lambda n, v: _number(n, v, minimum=0.05, maximum=600.0),
    ),
    "monitor_unfenced": ("GEMMANET_MONITOR_UNFENCED", _flag),
    "allow_test_switches": ("GEMMANET_ALLOW_TEST_SWITCHES", _flag),
}


def _env_values(env: Mapping[str, str]) -> dict[str, Any]:
    """The fields the environment sets, parsed and checked; unset or blank variables are left
    out so that their fields keep their defaults."""
    values: dict[str, Any] = {}
    for field_name, (variable, parse) in VARIABLES.items():
        raw = env.get(variable, "").strip()
        if raw:
            values[field_name] = parse(variable, raw)
    return values


# Defaults that are no plain value of their field.
_SHOWN_DEFAULTS = {
    "instance_id": "random (i- + 8 hex)",
    "capacity": "unset",
    "max_active_per_key": "unlimited",
    "affinity": "on",
}


def shown_default(field_name: str) -> str:
    """The default of a field as ``--help`` and docs/interface.md write it, from the field."""
    if field_name in _SHOWN_DEFAULTS:
        return _SHOWN_DEFAULTS[field_name]
    value: object = next(f.default for f in fields(Settings) if f.name == field_name)
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, tuple):  # rate_limit: (count, period)
        count, period = value
        unit = next((name for name, s in PERIODS.items() if s == period), None)
        return f"{count}/{unit}" if unit else f"{count}/{period:g}s"
    return f"{value:g}" if isinstance(value, float) else str(value)


def variables_help(field_names: Iterable[str] | None = None) -> list[tuple[str, str]]:
    """(variable, default) of every GEMMANET_* setting, or of the fields named, in order."""
    names = list(VARIABLES) if field_names is None else list(field_names)
    return [(VARIABLES[name][0], shown_default(name)) for name in names]


@dataclass(frozen=True)
class Settings:
    database_url: str = DEFAULT_DATABASE_URL
    redis_url: str | None = None
    redis_password_file: str | None = None
    redis_ca_file: str | None = None
    redis_cert_file: str | None = None
    redis_key_file: str | None = None
    multi_instance: bool = False
    bus: str = "pubsub"
    key_prefix: str = "gn"
    instance_id: str = field(default_factory=lambda: "i-" + secrets.token_hex(4))
    rate_limit: tuple[int, float] = (60, 60.0)
    task_timeout_s: float = 120.0
    # How often nodes and coordinator exchange heartbeats; a node silent for
    # heartbeat_misses intervals is dropped (its tasks fail with 502).
    heartbeat_interval_s: float = 2.0
    heartbeat_misses: int = 3
    # At most this many node heartbeats per second per instance (0: no limit): beyond
    # heartbeat_interval_s x heartbeat_rate nodes, a new connection is told a longer interval
    # (nodes / rate). Each heartbeat costs ~150 us of CPU each way (README "Scale").
    heartbeat_rate: float = 200.0
    max_body_bytes: int = 1024 * 1024
    # Multi-instance timing (see coordinator/runtime/cluster/membership.py): the instance heartbeat and
    # its TTL bound failover; ownership keeps the seed's long TTL.
    beat_s: float = 0.5
    alive_ttl_s: float = 2.0
    owner_ttl_s: float = 15.0
    forward_grace_s: float = 5.0
    lock_ttl_s: float = 10.0
    # Liveness (coordinator/core/liveness.py): a judge read further than sweep_s +
    # stall_slack_s after the previous one, or slower than responsive_rtt_s, is a stall of Redis
    # or of the judge, and restarts every peer's TTL. `gemmanet serve` refuses settings whose
    # failover bound exceeds the promised 3 s.
    sweep_s: float = 0.5
    stall_slack_s: float = 0.2
    responsive_rtt_s: float = 0.1
    # Capacity (README "Capacity and the admission queue"): the operator file, how long and how
    # many requests may wait for a free node, running + queued requests per API key (0:
    # unlimited), how long a node's facts stay trusted after its owner's last beat, and the
    # TTL of a lease (a long stream renews it; a dead requester's lease heals by it).
    capacity: Capacity = field(default_factory=Capacity)
    queue_timeout_s: float = 30.0
    queue_max: int = 1000
    max_active_per_key: int = 0
    # fair: API keys take turns by their priority; fifo: first come, first served (every
    # instance sharing a store must use the same).
    queue_policy: str = "fair"
    residency_stale_s: float = 15.0
    lease_ttl_s: float = 30.0
    # None: /metrics is a route of the API port; a port: served there only, on metrics_host.
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    # Host telemetry from heartbeats: at most one stored sample per node this often (the
    # history keeps the last 60; README "Host telemetry").
    telemetry_interval_s: float = 5.0
    # Prefix affinity (docs/affinity.md): on or off, a predicted prefix's weight against
    # load, how long a record of who served a prefix lasts, how many blocks a model keeps, and
    # how long a placement waits for the prediction before ranking by load alone.
    affinity: bool = True
    affinity_prefix_weight: float = 1.0
    affinity_load_weight: float = 1.0
    affinity_ttl_s: float = 300.0
    affinity_max_blocks: int = 100_000
    affinity_lookup_timeout_s: float = 0.1
    # On SIGTERM (docs/operations.md): requests in flight get this long to end (never past
    # their own timeout), then what remains ends with 503 instance_shutting_down.
    drain_s: float = 30.0
    # The elected residency monitor: candidate or not, its poll interval, election TTL,
    # standby retry and per-host poll timeout (their sum with a second poll timeout must fit in
    # residency_stale_s: coordinator/monitor/timing.py). ``monitor_unfenced`` is TEST-ONLY (it
    # switches the token compare off to show the takeover gate can fail) and is refused unless
    # ``allow_test_switches`` is set too.
    # Placement on the operator file's [hosts]: gated (follow the switch `gemmanet audit
    # --enable` sets in the shared store), on (as soon as their facts are fresh), off.
    host_placement: HostPlacement = "gated"
    monitor: bool = False
    monitor_poll_s: float = 2.0
    monitor_ttl_s: float = 5.0
    monitor_retry_s: float = 1.0
    monitor_poll_timeout_s: float = 2.0
    monitor_unfenced: bool = False
    allow_test_switches: bool = False

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        for variable, why in RETIRED_VARIABLES.items():
            if env.get(variable, "").strip():
                log.warning("%s is set but no longer used (%s); remove it", variable, why)
        settings = cls(**_env_values(env))
        settings.check()
        return settings

    def check(self) -> None:
        if self.multi_instance and not self.redis_url:
            raise SettingsError(
                "GEMMANET_MULTI_INSTANCE=1 needs GEMMANET_REDIS_URL: instances can only share "
                "nodes through Redis/Valkey"
            )
        if self.host_placement == "on" and not self.redis_url:
            raise SettingsError(
                "GEMMANET_HOST_PLACEMENT=on needs GEMMANET_REDIS_URL: direct hosts are shared "
                "capacity, which a process-local (embedded) store cannot account for"
            )
        if self.monitor_unfenced and not self.allow_test_switches:
            raise SettingsError(
                "GEMMANET_MONITOR_UNFENCED=1 is a test-only switch (it lets a deposed monitor's "
                "writes through) and needs GEMMANET_ALLOW_TEST_SWITCHES=1"
            )
        check_redis_tls(
            self.redis_url, self.redis_ca_file, self.redis_cert_file, self.redis_key_file
        )

    def liveness_timing(self) -> LivenessTiming:
        return LivenessTiming(
            beat_s=self.beat_s,
            alive_ttl_s=self.alive_ttl_s,
            sweep_s=self.sweep_s,
            stall_slack_s=self.stall_slack_s,
            responsive_rtt_s=self.responsive_rtt_s,
            presence_ttl_s=STREAMS_PRESENCE_TTL_S if self.bus == "streams" else 0.0,
        )

    @functools.cached_property
    def store_outage_s(self) -> float:
        """How long the coordination store may go without answering before a request fails
        closed (``core/liveness.py``, ``store_outage_bound_s``): the failover bound. Read on
        every request and derived from a fresh ``LivenessTiming``, so computed once per
        settings object (they are frozen; ``with_`` makes a new one)."""
        return self.liveness_timing().store_outage_s

    def with_(self, **changes: Any) -> Settings:
        return replace(self, **changes)
