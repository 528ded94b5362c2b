"""The role Protocols of coordination/roles.py: small, together exactly ``Coordination``'s
methods (each in one role, with base.py's signature), and met by both backends."""

from __future__ import annotations

import inspect

import pytest

from coordinator.coordination import (
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
from coordinator.coordination.roles import ROLES

MAX_METHODS = 12


def _methods(cls: type) -> set[str]:
    # Only what the class itself defines: a Protocol's own members, or base.py's interface.
    return {n for n, v in vars(cls).items() if inspect.isfunction(v) and not n.startswith("_")}


def _every_role(backend: Coordination) -> None:
    # Never called: mypy --strict checks these assignments, which is what proves each backend
    # meets every role's exact signatures (isinstance below only sees that the names exist).
    roles: tuple[
        KeyValue, RateLimits, Presence, Leases, TelemetryStore, MonitorStore, PubSub, Lifecycle
    ] = (backend, backend, backend, backend, backend, backend, backend, backend)
    del roles


def _both_backends(memory: MemoryCoordination, redis: RedisCoordination) -> None:
    _every_role(memory)
    _every_role(redis)
    kv: KeyValue = redis
    leases: Leases = memory
    del kv, leases


@pytest.mark.parametrize("role", ROLES, ids=lambda r: r.__name__)
def test_every_role_is_small(role: type) -> None:
    assert 1 <= len(_methods(role)) <= MAX_METHODS


def test_every_method_of_the_interface_is_in_exactly_one_role() -> None:
    owners: dict[str, list[str]] = {}
    for role in ROLES:
        for name in _methods(role):
            owners.setdefault(name, []).append(role.__name__)
    overlapping = {n: o for n, o in owners.items() if len(o) > 1}
    assert not overlapping
    assert set(owners) == _methods(Coordination)


@pytest.mark.parametrize("role", ROLES, ids=lambda r: r.__name__)
def test_every_role_method_has_the_interfaces_signature(role: type) -> None:
    for name in _methods(role):
        assert inspect.signature(getattr(role, name)) == inspect.signature(
            getattr(Coordination, name)
        ), name


@pytest.mark.parametrize("role", ROLES, ids=lambda r: r.__name__)
@pytest.mark.parametrize("backend", [Coordination, MemoryCoordination, RedisCoordination])
def test_every_backend_is_every_role(backend: type, role: type) -> None:
    assert issubclass(backend, role)


def test_a_memory_backend_instance_is_every_role() -> None:
    coordination = MemoryCoordination()
    assert all(isinstance(coordination, role) for role in ROLES)
