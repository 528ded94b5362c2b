"""Coordination backends: one interface (base.Coordination), two implementations.

``memory`` is the embedded default (single instance, tests, simulator); ``redis`` lets any
number of instances share one Redis/Valkey. Both honour the same semantics, proven by one
contract suite in tests/coordinator/test_coordination_contract.py.
"""

from coordinator.coordination.base import (
    Coordination,
    CoordinationUnavailable,
    RateDecision,
    Subscription,
)

__all__ = ["Coordination", "CoordinationUnavailable", "RateDecision", "Subscription"]
