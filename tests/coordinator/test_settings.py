"""GEMMANET_* variables: INTERFACE.md's defaults when unset, parsed and checked when set."""

from __future__ import annotations

import logging

import pytest

from coordinator.errors import SettingsError
from coordinator.settings import Settings


def test_unset_variables_give_the_documented_defaults() -> None:
    settings = Settings.from_env({})
    assert settings.database_url == "sqlite:///./gemmanet.db"
    assert settings.redis_url is None and settings.redis_password_file is None
    assert settings.multi_instance is False
    assert settings.bus == "pubsub"
    assert settings.key_prefix == "gn"
    assert settings.rate_limit == (60, 60.0)
    assert settings.task_timeout_s == 120.0
    assert settings.heartbeat_interval_s == 2.0
    assert settings.instance_id.startswith("i-")


def test_blank_variables_count_as_unset() -> None:
    blank = {
        name: "  "
        for name in (
            "GEMMANET_DATABASE_URL",
            "GEMMANET_BUS",
            "GEMMANET_KEY_PREFIX",
            "GEMMANET_RATE_LIMIT",
            "GEMMANET_TASK_TIMEOUT_S",
            "GEMMANET_MULTI_INSTANCE",
        )
    }
    defaults, from_blank = (
        Settings(instance_id="x"),
        Settings.from_env(blank).with_(instance_id="x"),
    )
    assert from_blank == defaults


def test_the_constructor_and_the_environment_agree() -> None:
    env = {
        "GEMMANET_DATABASE_URL": "sqlite:///tmp/x.db",
        "GEMMANET_REDIS_URL": "redis://r:6379/0",
        "GEMMANET_MULTI_INSTANCE": "1",
        "GEMMANET_BUS": "streams",
        "GEMMANET_KEY_PREFIX": "gn2",
        "GEMMANET_INSTANCE_ID": "inst-a",
        "GEMMANET_RATE_LIMIT": "5/30s",
        "GEMMANET_TASK_TIMEOUT_S": "9999",
        "GEMMANET_HEARTBEAT_S": "0.5",
    }
    assert Settings.from_env(env) == Settings(
        database_url="sqlite:///tmp/x.db",
        redis_url="redis://r:6379/0",
        multi_instance=True,
        bus="streams",
        key_prefix="gn2",
        instance_id="inst-a",
        rate_limit=(5, 30.0),
        task_timeout_s=3600.0,  # capped
        heartbeat_interval_s=0.5,
    )


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("GEMMANET_BUS", "kafka"),
        ("GEMMANET_KEY_PREFIX", "a b"),
        ("GEMMANET_INSTANCE_ID", "x/y"),
        ("GEMMANET_INSTANCE_ID", "i" * 129),
        ("GEMMANET_RATE_LIMIT", "lots"),
        ("GEMMANET_TASK_TIMEOUT_S", "soon"),
        ("GEMMANET_TASK_TIMEOUT_S", "nan"),
        ("GEMMANET_HEARTBEAT_S", "0"),
        ("GEMMANET_MULTI_INSTANCE", "maybe"),
        ("GEMMANET_AFFINITY", "maybe"),
        ("GEMMANET_AFFINITY_PREFIX_WEIGHT", "-1"),
        ("GEMMANET_AFFINITY_MAX_BLOCKS", "0"),
    ],
)
def test_a_bad_value_is_refused_naming_its_variable(name: str, value: str) -> None:
    with pytest.raises(SettingsError, match=name):
        Settings.from_env({name: value})


def test_multi_instance_without_redis_is_refused() -> None:
    with pytest.raises(SettingsError, match="GEMMANET_REDIS_URL"):
        Settings.from_env({"GEMMANET_MULTI_INSTANCE": "1"})


@pytest.mark.parametrize("value", ["lean", "coredis", "redis-py"])
def test_the_retired_bus_client_setting_starts_with_one_warning(
    value: str, caplog: pytest.LogCaptureFixture
) -> None:
    """GEMMANET_REDIS_BUS_CLIENT is no longer read (the pub/sub bus has one client): a
    deployment that still sets it, to any value, starts as without it, warned once."""
    env = {"GEMMANET_REDIS_URL": "redis://r:6379/0", "GEMMANET_REDIS_BUS_CLIENT": value}
    with caplog.at_level(logging.WARNING, logger="coordinator.settings"):
        settings = Settings.from_env(env)
    assert settings == Settings(redis_url="redis://r:6379/0", instance_id=settings.instance_id)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "GEMMANET_REDIS_BUS_CLIENT is set but no longer used" in warnings[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="coordinator.settings"):
        Settings.from_env({"GEMMANET_REDIS_URL": "redis://r:6379/0"})
    assert not caplog.records
