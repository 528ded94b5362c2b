"""Capacity leases and admission queues of the Redis backend: the ``Coordination`` methods
over the scripts of ``redis/lease_scripts.py``, one EVALSHA (one round trip) per call.

A mixin of ``RedisCoordination`` so that ``redis.py`` stays about the key-value, presence and
bus operations. This module's part is computing the Redis name of every key a script touches
(Lua never builds key names, so the scripts stay correct under any key prefix) and turning
the scripts' flat replies into the types of ``leases.py``. Failures surface as
``CoordinationUnavailable`` through ``RedisLink._eval``, like every other operation.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, cast

from coordinator.coordination.leases import (
    Admission,
    AdmissionRules,
    LeaseAsk,
    LeaseRelease,
    LeaseUsage,
    NodeFacts,
    Outcome,
    RefusalReason,
)
from coordinator.coordination.redis.connect.link import RedisLink
from coordinator.coordination.redis.lease_scripts import (
    ADMIT,
    DROP_FACTS,
    QUEUE_DEPTHS,
    RELEASE,
    RENEW,
    USAGE,
)
from coordinator.coordination.redis.scripts import LuaScript

__all__ = ["RedisLeases"]

_FACTS = "lease:facts"


def _us(seconds: float) -> str:
    return str(max(1, round(seconds * 1_000_000)))


def _gb(value: float) -> str:
    # repr is the shortest text that reads back as the same float, in Lua as in Python.
    return repr(float(value))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisLeases(RedisLink):
    """The lease half of ``RedisCoordination`` (which supplies ``_name``)."""

    #: a class attribute so that a test can run a deliberately broken variant (mutation check)
    admit_script: ClassVar[LuaScript] = ADMIT

    if TYPE_CHECKING:

        def _name(self, key: str) -> str: ...

    # -- key names ------------------------------------------------------------------------------

    def _node_keys(self, node_id: str) -> list[str]:
        return [self._name(f"lease:n:{node_id}"), self._name(f"lease:i:{node_id}")]

    def _queue_keys(self, model: str) -> list[str]:
        return [self._name(f"lease:q:{model}"), self._name(f"lease:qi:{model}")]

    # -- facts ----------------------------------------------------------------------------------

    async def put_node_facts(self, facts: NodeFacts) -> None:
        await self.put_many_node_facts([facts])

    async def put_many_node_facts(self, facts: Sequence[NodeFacts]) -> None:
        if not facts:
            return
        fields: list[str] = []
        for one in facts:
            fields += [one.node_id, _facts_record(one)]
        # One HSET replaces each node's record atomically; no script needed.
        await self._command("HSET lease facts", b"HSET", self._name(_FACTS), *fields)

    async def drop_node_facts(self, node_id: str, conn_id: str) -> None:
        await self._eval(DROP_FACTS, [self._name(_FACTS)], [node_id, conn_id])

    # -- admission ------------------------------------------------------------------------------

    async def admit(self, ask: LeaseAsk, rules: AdmissionRules) -> Admission:
        keys = [
            self._name(rules.presence_registry),
            self._name(_FACTS),
            self._name(f"lease:a:{ask.key_id}"),
            *self._queue_keys(ask.model),
        ]
        args = [
            ask.request_id,
            ask.instance_id,
            _gb(ask.model_gb),
            _gb(ask.kv_gb),
            ask.model,
            ask.lease_id,
            _us(ask.queue_entry_ttl_s),
            _us(rules.facts_stale_s),
            _us(rules.requester_stale_s),
            _us(rules.lease_ttl_s),
            str(int(rules.queue_max)),
            str(int(rules.max_active_per_key)),
        ]
        for node_id, conn_id in ask.candidates:
            keys += self._node_keys(node_id)
            args += [node_id, conn_id]
        reply = await self._eval(self.admit_script, keys, args)
        outcome, node_id, conn_id, lease_id, position, flat, next_in_queue = reply
        refusals = {
            _text(flat[k]): cast(RefusalReason, _text(flat[k + 1])) for k in range(0, len(flat), 2)
        }
        return Admission(
            cast(Outcome, _text(outcome)),
            node_id=_text(node_id),
            conn_id=_text(conn_id),
            lease_id=_text(lease_id),
            position=int(position),
            refusals=refusals,
            next_in_queue=_text(next_in_queue),
        )

    async def renew_leases(self, leases: Sequence[tuple[str, str]], ttl_s: float) -> list[bool]:
        if not leases:
            return []
        keys: list[str] = []
        for node_id, _ in leases:
            keys += self._node_keys(node_id)
        reply = await self._eval(RENEW, keys, [_us(ttl_s), *(lease for _, lease in leases)])
        return [bool(int(flag)) for flag in reply]

    async def release(self, release: LeaseRelease, rules: AdmissionRules) -> list[tuple[str, str]]:
        lease = release.lease
        keys = [
            self._name(rules.presence_registry),
            *self._queue_keys(release.model),
            self._name(f"lease:a:{release.key_id}"),
        ]
        if lease is not None:
            keys += self._node_keys(lease[0])
        wake = list(dict.fromkeys(release.wake_models))
        for name in wake:
            keys += self._queue_keys(name)
        args = [
            release.request_id,
            "0" if lease is None else "1",
            "" if lease is None else lease[1],
            _us(rules.requester_stale_s),
            *wake,
        ]
        reply = await self._eval(RELEASE, keys, args)
        return [(_text(reply[k]), _text(reply[k + 1])) for k in range(0, len(reply), 2)]

    # -- views ----------------------------------------------------------------------------------

    async def lease_usage(self, node_ids: Sequence[str]) -> dict[str, LeaseUsage]:
        if not node_ids:
            return {}
        keys = [self._name(_FACTS)]
        for node_id in node_ids:
            keys += self._node_keys(node_id)
        reply = await self._eval(USAGE, keys, list(node_ids))
        return {
            node_id: LeaseUsage(int(reply[2 * k]), float(_text(reply[2 * k + 1])))
            for k, node_id in enumerate(node_ids)
        }

    async def queue_depths(self, models: Sequence[str], rules: AdmissionRules) -> dict[str, int]:
        if not models:
            return {}
        keys = [self._name(rules.presence_registry)]
        for model in models:
            keys += self._queue_keys(model)
        reply = await self._eval(QUEUE_DEPTHS, keys, [_us(rules.requester_stale_s)])
        return {model: int(depth) for model, depth in zip(models, reply, strict=True)}


def _facts_record(facts: NodeFacts) -> str:
    """A node's facts as the lease scripts read them (JSON)."""
    record: dict[str, Any] = {
        "conn": facts.conn_id,
        "instance": facts.instance_id,
        "max_parallel": facts.max_parallel,
        "resident": [[model, float(gb)] for model, gb in facts.resident.items()],
    }
    if facts.memory_gb is not None:
        record["memory_gb"] = float(facts.memory_gb)
    return json.dumps(record)
