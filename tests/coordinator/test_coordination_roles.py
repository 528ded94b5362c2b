"""The role Protocols of coordination/roles.py are the interface: each is small, no two share a
method, each backend has one object per role that meets its Protocol, and every bundle
(``Coordination``) hands out every role."""

from __future__ import annotations

import inspect

import pytest

from coordinator.coordination import (
    ROLES,
    Coordination,
    KeyValue,
    Leases,
    Lifecycle,
    MemoryCoordination,
    MonitorStore,
    Presence,
    PubSub,
    RateLimits,
    TelemetryStore,
)
from coordinator.coordination.redis.coordination import RedisCoordination

MAX_METHODS = 12


def _methods(cls: type) -> set[str]:
    # Only what the class itself defines: a Protocol's own members, or a role object's.
    return {n for n, v in vars(cls).items() if inspect.isfunction(v) and not n.startswith("_")}


def _every_role(bundle: Coordination) -> None:
    # Never called: mypy --strict checks these assignments (what the bundle declares it hands
    # out), and the two below check each backend's own role classes against their Protocols.
    roles: tuple[
        KeyValue, RateLimits, Presence, Leases, TelemetryStore, MonitorStore, PubSub, Lifecycle
    ] = (
        bundle.key_value,
        bundle.rate_limits,
        bundle.presence,
        bundle.leases,
        bundle.telemetry,
        bundle.monitor,
        bundle.pubsub,
        bundle,
    )
    del roles


def _each_backend_meets_every_role(memory: MemoryCoordination, redis: RedisCoordination) -> None:
    # Never called, like ``_every_role``: the concrete role classes against their Protocols
    # (isinstance below only sees that the names exist).
    for bundle in (memory, redis):
        kv: KeyValue = bundle.key_value
        rates: RateLimits = bundle.rate_limits
        presence: Presence = bundle.presence
        leases: Leases = bundle.leases
        telemetry: TelemetryStore = bundle.telemetry
        monitor: MonitorStore = bundle.monitor
        pubsub: PubSub = bundle.pubsub
        lifecycle: Lifecycle = bundle
        del kv, rates, presence, leases, telemetry, monitor, pubsub, lifecycle


def _bundles() -> list[Coordination]:
    # Neither opens anything: the Redis one only parses its URL until it is entered.
    return [MemoryCoordination(), RedisCoordination("redis://127.0.0.1:1")]


@pytest.mark.parametrize("role", ROLES.values(), ids=lambda r: r.__name__)
def test_every_role_is_small(role: type) -> None:
    assert 1 <= len(_methods(role)) <= MAX_METHODS


def test_no_method_is_in_two_roles() -> None:
    owners: dict[str, list[str]] = {}
    for role in [*ROLES.values(), Lifecycle]:
        for name in _methods(role):
            owners.setdefault(name, []).append(role.__name__)
    assert not {n: o for n, o in owners.items() if len(o) > 1}


def test_the_bundle_declares_every_role_and_only_lifecycle_methods() -> None:
    declared = {name for name in Coordination.__annotations__ if name in ROLES}
    assert declared == set(ROLES)
    assert _methods(Coordination) == _methods(Lifecycle)


@pytest.mark.parametrize("bundle", _bundles(), ids=lambda b: type(b).__name__)
def test_every_bundle_hands_out_every_role(bundle: Coordination) -> None:
    assert isinstance(bundle, Lifecycle)
    for attribute, role in ROLES.items():
        handed = getattr(bundle, attribute)
        assert isinstance(handed, role), (attribute, type(handed).__name__)


@pytest.mark.parametrize("bundle", _bundles(), ids=lambda b: type(b).__name__)
def test_each_role_object_is_one_role(bundle: Coordination) -> None:
    """One class per role: a role object's public methods are exactly its Protocol's, and no
    two roles share an object."""
    objects = [getattr(bundle, attribute) for attribute in ROLES]
    assert len({id(o) for o in objects}) == len(ROLES)
    for attribute, role in ROLES.items():
        cls = type(getattr(bundle, attribute))
        assert _methods(cls) == _methods(role), (cls.__name__, _methods(cls) ^ _methods(role))
