"""Settings from GEMMANET_* environment variables (see INTERFACE.md and the README).

Each default is written once, on its field of ``Settings``: ``from_env`` passes only the
variables that are set, so an unset variable takes the field's default.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any
from urllib.parse import urlsplit

from coordinator.capacity import Capacity, load_capacity
from coordinator.core.liveness import STREAMS_PRESENCE_TTL_S, LivenessTiming
from coordinator.errors import SettingsError
from protocol.constraints import MAX_IDENTIFIER_LENGTH, MAX_TIMEOUT_S, is_identifier

#: GEMMANET_DATABASE_URL unset: an SQLite file in the working directory. (Here rather than in
#: coordinator/store/, so that reading the settings, and every command's --help, loads no
#: SQLAlchemy.)
DEFAULT_DATABASE_URL = "sqlite:///./gemmanet.db"
_PERIODS = {"second": 1.0, "minute": 60.0, "hour": 3600.0, "day": 86400.0}
_NAME = re.compile(r"[A-Za-z0-9._:-]{1,64}")
# A heartbeat slower than this would leave a dead node's tasks hanging for minutes.
MAX_HEARTBEAT_S = 60.0
BUSES = ("pubsub", "streams")
#: Variables no longer read, with why: a deployment that still sets one starts as before and is
#: told once, at start, that it has no effect (``Settings.from_env``), rather than refused.
RETIRED_VARIABLES = {
    "GEMMANET_REDIS_BUS_CLIENT": (
        "the Redis pub/sub bus has one client, the lean one, on every deployment"
    ),
}

log = logging.getLogger(__name__)


def parse_rate_limit(text: str) -> tuple[int, float]:
    """'60/minute' -> (60, 60.0). Also accepts '10/second', '1000/hour', '5/30s'."""
    match = re.fullmatch(
        r"\s*(\d+)\s*/\s*(?:(\d+(?:\.\d+)?)\s*s|(second|minute|hour|day)s?)\s*", text
    )
    if not match or int(match.group(1)) < 1:
        raise SettingsError(
            f"GEMMANET_RATE_LIMIT={text!r} is not a rate like '60/minute', '10/second' or '5/30s'"
        )
    period = float(match.group(2)) if match.group(2) else _PERIODS[match.group(3)]
    if period <= 0:
        raise SettingsError(f"GEMMANET_RATE_LIMIT={text!r} has a zero period")
    return int(match.group(1)), period


def _flag(name: str, raw: str) -> bool:
    value = raw.lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise SettingsError(f"{name}={value!r} must be 0 or 1")


def _number(name: str, raw: str, *, minimum: float, maximum: float) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not a number") from None
    if not value >= minimum:
        raise SettingsError(f"{name}={raw!r} must be at least {minimum}")
    return min(value, maximum)


def _whole(name: str, raw: str, *, minimum: int) -> int:
    if not raw.isdigit() or int(raw) < minimum:
        raise SettingsError(f"{name}={raw!r} must be a whole number of at least {minimum}")
    return int(raw)


def _choice(name: str, raw: str, choices: tuple[str, ...]) -> str:
    if raw not in choices:
        raise SettingsError(f"{name}={raw!r} must be " + " or ".join(map(repr, choices)))
    return raw


# redis+cluster:// and rediss+cluster:// name a seed node of a Redis Cluster (README);
# redis+sentinel://s1:p1,s2:p2/service the sentinels of a master (checked above).
REDIS_SCHEMES = ("redis", "rediss", "redis+cluster", "rediss+cluster")


def _redis_url(name: str, raw: str) -> str:
    if raw.startswith(("redis+sentinel://", "rediss+sentinel://")):
        from coordinator.coordination.redis.connect.sentinel import parse_sentinel_url

        try:
            parse_sentinel_url(raw)
        except SettingsError as exc:
            raise SettingsError(f"{name}: {exc}") from None
        user_info = raw.split("://", 1)[1].split("/", 1)[0].rpartition("@")[0]
        if ":" in user_info:
            raise SettingsError(
                f"{name} must not carry a password: put it in a file and set "
                "GEMMANET_REDIS_PASSWORD_FILE to its path"
            )
        return raw
    try:
        parts = urlsplit(raw)
        parts.port  # noqa: B018 - raises ValueError on a port that is not a number
    except ValueError:
        raise SettingsError(f"{name} is not a URL like redis://host:6379/0") from None
    if parts.scheme not in REDIS_SCHEMES or not parts.hostname:
        # The URL is not echoed: it might carry a password.
        raise SettingsError(
            f"{name} must be redis://host:port/db, rediss://… (TLS) or redis+cluster://host:port, "
            f"not {parts.scheme + '://' if parts.scheme else 'a URL without a scheme'}"
        )
    if parts.scheme.endswith("+cluster") and parts.path not in ("", "/", "/0"):
        raise SettingsError(f"{name}: a Redis Cluster has only database 0, not {parts.path!r}")
    if parts.password is not None:
        raise SettingsError(
            f"{name} must not carry a password: put it in a file and set "
            "GEMMANET_REDIS_PASSWORD_FILE to its path"
        )
    return raw


def check_redis_tls(
    url: str | None, ca_file: str | None, cert_file: str | None, key_file: str | None
) -> None:
    """The TLS files only make sense together with a rediss:// URL, and cert with key."""
    if (cert_file is None) != (key_file is None):
        raise SettingsError(
            "GEMMANET_REDIS_CERT_FILE and GEMMANET_REDIS_KEY_FILE go together: set both or neither"
        )
    if cert_file and not ca_file:
        raise SettingsError("GEMMANET_REDIS_CERT_FILE needs GEMMANET_REDIS_CA_FILE")
    if ca_file and not (url or "").startswith(("rediss://", "rediss+cluster://")):
        raise SettingsError("GEMMANET_REDIS_CA_FILE needs a rediss:// GEMMANET_REDIS_URL")


def _readable_file(name: str, raw: str) -> str:
    try:
        with open(raw, encoding="utf-8") as handle:
            handle.read(1)
    except OSError as exc:
        raise SettingsError(f"{name}={raw!r}: cannot read the file: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise SettingsError(f"{name}={raw!r}: the file is not UTF-8 text") from None
    return raw


def _name(name: str, raw: str) -> str:
    if not _NAME.fullmatch(raw):
        raise SettingsError(f"{name}={raw!r} may hold only [A-Za-z0-9._:-]")
    return raw


def _identifier(name: str, raw: str) -> str:
    # The instance id travels in envelopes (welcome, bus.assign's reply_to): the wire's rule.
    if not is_identifier(raw):
        raise SettingsError(
            f"{name}={raw!r} may hold only [A-Za-z0-9._:-], at most {MAX_IDENTIFIER_LENGTH}"
        )
    return raw


def _port(name: str, raw: str) -> int:
    if not raw.isdigit() or not 1 <= int(raw) <= 65535:
        raise SettingsError(f"{name}={raw!r} must be a TCP port number from 1 to 65535")
    return int(raw)


#: Settings field -> (its GEMMANET_* variable, the parser that checks a value of it). The one
#: list of the variables: ``from_env`` reads it, and the commands' ``--help`` lists it
#: (``variables_help``).
VARIABLES: dict[str, tuple[str, Callable[[str, str], object]]] = {
    "database_url": ("GEMMANET_DATABASE_URL", lambda n, v: v),
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
    # SIGTERM's drain window (docs/operations.md).
    "drain_s": ("GEMMANET_DRAIN_S", lambda n, v: _number(n, v, minimum=0.0, maximum=MAX_TIMEOUT_S)),
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
        unit = next((name for name, s in _PERIODS.items() if s == period), None)
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
    residency_stale_s: float = 15.0
    lease_ttl_s: float = 30.0
    # None: /metrics is a route of the API port; a port: served there only, on metrics_host.
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    # Host telemetry from heartbeats: at most one stored sample per node this often (the
    # history keeps the last 60; README "Host telemetry").
    telemetry_interval_s: float = 5.0
    # On SIGTERM (docs/operations.md): requests in flight get this long to end (never past
    # their own timeout), then what remains ends with 503 instance_shutting_down.
    drain_s: float = 30.0
    # The elected residency monitor: candidate or not, its poll interval, election TTL,
    # standby retry and per-host poll timeout (their sum with a second poll timeout must fit in
    # residency_stale_s: coordinator/monitor/timing.py). ``monitor_unfenced`` is TEST-ONLY (it
    # switches the token compare off to show the takeover gate can fail) and is refused unless
    # ``allow_test_switches`` is set too.
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

    @property
    def store_outage_s(self) -> float:
        """How long the coordination store may go without answering before a request fails
        closed (``core/liveness.py``, ``store_outage_bound_s``): the failover bound."""
        return self.liveness_timing().store_outage_s

    def with_(self, **changes: Any) -> Settings:
        return replace(self, **changes)
