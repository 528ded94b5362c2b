"""Settings from GEMMANET_* environment variables (see INTERFACE.md and the README)."""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from coordinator.core.liveness import LivenessTiming
from coordinator.errors import SettingsError

_PERIODS = {"second": 1.0, "minute": 60.0, "hour": 3600.0, "day": 86400.0}


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


def _flag(env: Mapping[str, str], name: str, default: str) -> bool:
    value = env.get(name, default).strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise SettingsError(f"{name}={value!r} must be 0 or 1")


def _number(env: Mapping[str, str], name: str, default: float, *, minimum: float) -> float:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not a number") from None
    if not value >= minimum:
        raise SettingsError(f"{name}={raw!r} must be at least {minimum}")
    return value


@dataclass(frozen=True)
class Settings:
    database_url: str = "sqlite:///./gemmanet.db"
    redis_url: str | None = None
    redis_password_file: str | None = None
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
    max_body_bytes: int = 1024 * 1024
    # Multi-instance timing (see coordinator/runtime/membership.py): the instance heartbeat and
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

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        bus = env.get("GEMMANET_BUS", "pubsub").strip() or "pubsub"
        if bus not in ("pubsub", "streams"):
            raise SettingsError(f"GEMMANET_BUS={bus!r} must be 'pubsub' or 'streams'")
        prefix = env.get("GEMMANET_KEY_PREFIX", "gn").strip() or "gn"
        if not re.fullmatch(r"[A-Za-z0-9._:-]{1,64}", prefix):
            raise SettingsError(f"GEMMANET_KEY_PREFIX={prefix!r} may hold only [A-Za-z0-9._:-]")
        kwargs: dict[str, object] = {
            "database_url": env.get("GEMMANET_DATABASE_URL", "").strip() or cls.database_url,
            "redis_url": env.get("GEMMANET_REDIS_URL", "").strip() or None,
            "redis_password_file": env.get("GEMMANET_REDIS_PASSWORD_FILE", "").strip() or None,
            "multi_instance": _flag(env, "GEMMANET_MULTI_INSTANCE", "0"),
            "bus": bus,
            "key_prefix": prefix,
            "rate_limit": parse_rate_limit(env.get("GEMMANET_RATE_LIMIT", "60/minute")),
            "task_timeout_s": min(
                _number(env, "GEMMANET_TASK_TIMEOUT_S", 120.0, minimum=0.1), 3600.0
            ),
            "heartbeat_interval_s": min(
                _number(env, "GEMMANET_HEARTBEAT_S", 2.0, minimum=0.05), 60.0
            ),
            "alive_ttl_s": _number(env, "GEMMANET_ALIVE_TTL_S", cls.alive_ttl_s, minimum=0.1),
            "sweep_s": _number(env, "GEMMANET_SWEEP_S", cls.sweep_s, minimum=0.05),
        }
        instance_id = env.get("GEMMANET_INSTANCE_ID", "").strip()
        if instance_id:
            if not re.fullmatch(r"[A-Za-z0-9._:-]{1,64}", instance_id):
                raise SettingsError(
                    f"GEMMANET_INSTANCE_ID={instance_id!r} may hold only [A-Za-z0-9._:-]"
                )
            kwargs["instance_id"] = instance_id
        settings = cls(**kwargs)  # type: ignore[arg-type]
        settings.check()
        return settings

    def check(self) -> None:
        if self.multi_instance and not self.redis_url:
            raise SettingsError(
                "GEMMANET_MULTI_INSTANCE=1 needs GEMMANET_REDIS_URL: instances can only share "
                "nodes through Redis/Valkey"
            )

    def liveness_timing(self) -> LivenessTiming:
        return LivenessTiming(
            beat_s=self.beat_s,
            alive_ttl_s=self.alive_ttl_s,
            sweep_s=self.sweep_s,
            stall_slack_s=self.stall_slack_s,
            responsive_rtt_s=self.responsive_rtt_s,
        )

    def with_(self, **changes: object) -> Settings:
        return replace(self, **changes)  # type: ignore[arg-type]
