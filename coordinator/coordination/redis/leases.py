"""The ``Leases`` role on Redis: capacity leases and admission queues over the scripts of
``lease_scripts.py``, one EVALSHA (one round trip) per call; the two of every request (the
admission and the release) on the link's lean pipeline (``lean/lane.py``), the rest on coredis.

This module's part is computing the Redis name of every key a script touches (``keys.py``;
Lua never builds key names, so the scripts stay correct under any key prefix) and turning the
scripts' flat replies into the types of ``leases.py``. Failures surface as
``CoordinationUnavailable`` through ``RedisLink.run_script``, like every other operation.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, ClassVar, cast

from coordinator.coordination.keys import (
    LEASE_FACTS,
    lease_active_key,
    lease_node_keys,
    lease_queue_keys,
    rate_limit_key,
)
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


def _us(seconds: float) -> str:
    return str(max(1, round(seconds * 1_000_000)))


def _gb(value: float) -> str:
    # repr is the shortest text that reads back as the same float, in Lua as in Python.
    return repr(float(value))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisLeases:
    """``Leases`` on the keys of one link's prefix."""

    #: a class attribute so that a test can run a deliberately broken variant (mutation check)
    admit_script: ClassVar[LuaScript] = ADMIT

    def __init__(self, link: RedisLink) -> None:
        self._link = link
        self._name = link.redis_key

    # -- key names ------------------------------------------------------------------------------

    def _node_keys(self, node_id: str) -> list[str]:
        return [self._name(key) for key in lease_node_keys(node_id)]

    def _queue_keys(self, model: str) -> list[str]:
        return [self._name(key) for key in lease_queue_keys(model)]

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
        await self._link.execute("HSET lease facts", b"HSET", self._name(LEASE_FACTS), *fields)

    async def node_facts(self, node_ids: Sequence[str]) -> dict[str, NodeFacts]:
        if not node_ids:
            return {}
        raw = await self._link.execute(
            "HMGET lease facts", b"HMGET", self._name(LEASE_FACTS), *node_ids
        )
        return {
            node_id: _facts_of(node_id, json.loads(record))
            for node_id, record in zip(node_ids, raw, strict=True)
            if record is not None
        }

    async def drop_node_facts(self, node_id: str, conn_id: str) -> None:
        await self._link.run_script(DROP_FACTS, [self._name(LEASE_FACTS)], [node_id, conn_id])

    # -- admission ------------------------------------------------------------------------------

    async def admit(self, ask: LeaseAsk, rules: AdmissionRules) -> Admission:
        keys = [
            self._name(rules.presence_registry),
            self._name(LEASE_FACTS),
            self._name(lease_active_key(ask.key_id)),
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
            "1" if ask.again else "0",
            rules.queue_policy,
            ask.key_id,
            str(int(ask.weight)),
        ]
        rate = ask.rate
        # The log's key is always named (Cluster: every key of a script is declared; all of
        # them share the prefix's hash tag), counted only with a rate ask.
        keys.append(self._name(rate.key if rate is not None else rate_limit_key(ask.key_id)))
        if rate is None:
            args += ["0", "0", ""]
        else:
            args += [str(int(rate.limit)), _us(rate.period_s), f"t:{rate.token}"]
        for node_id, conn_id in ask.candidates:
            keys += self._node_keys(node_id)
            args += [node_id, conn_id]
        reply = await self._link.run_script(self.admit_script, keys, args, lane="lean")
        outcome, node_id, conn_id, lease_id, position, flat, next_in_queue, head = reply
        if _text(outcome) == "rate_limited":
            return Admission("rate_limited", retry_after_s=int(position) / 1_000_000)
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
            head=_text(head),
        )

    async def renew_leases(self, leases: Sequence[tuple[str, str]], ttl_s: float) -> list[bool]:
        if not leases:
            return []
        keys: list[str] = []
        for node_id, _ in leases:
            keys += self._node_keys(node_id)
        reply = await self._link.run_script(
            RENEW, keys, [_us(ttl_s), *(lease for _, lease in leases)]
        )
        return [bool(int(flag)) for flag in reply]

    async def release(self, release: LeaseRelease, rules: AdmissionRules) -> list[tuple[str, str]]:
        lease = release.lease
        keys = [
            self._name(rules.presence_registry),
            *self._queue_keys(release.model),
            self._name(lease_active_key(release.key_id)),
        ]
        if lease is not None:
            keys += self._node_keys(lease[0])
        maybe = list(dict.fromkeys(release.maybe_leases))
        for node_id, _ in maybe:
            keys += self._node_keys(node_id)
        wake = list(dict.fromkeys(release.wake_models))
        for name in wake:
            keys += self._queue_keys(name)
        args = [
            release.request_id,
            "0" if lease is None else "1",
            "" if lease is None else lease[1],
            _us(rules.requester_stale_s),
            rules.queue_policy,
            str(len(maybe)),
            *(lease_id for _, lease_id in maybe),
            *wake,
        ]
        reply = await self._link.run_script(RELEASE, keys, args, lane="lean")
        return [(_text(reply[k]), _text(reply[k + 1])) for k in range(0, len(reply), 2)]

    # -- views ----------------------------------------------------------------------------------

    async def lease_usage(self, node_ids: Sequence[str]) -> dict[str, LeaseUsage]:
        if not node_ids:
            return {}
        keys = [self._name(LEASE_FACTS)]
        for node_id in node_ids:
            keys += self._node_keys(node_id)
        reply = await self._link.run_script(USAGE, keys, list(node_ids))
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
        reply = await self._link.run_script(
            QUEUE_DEPTHS, keys, [_us(rules.requester_stale_s), rules.queue_policy]
        )
        return {model: int(depth) for model, depth in zip(models, reply, strict=True)}


def _facts_of(node_id: str, record: dict[str, Any]) -> NodeFacts:
    """``_facts_record`` read back."""
    return NodeFacts(
        node_id=node_id,
        conn_id=record["conn"],
        instance_id=record["instance"],
        max_parallel=int(record["max_parallel"]),
        memory_gb=record.get("memory_gb"),
        resident={str(model): float(gb) for model, gb in record.get("resident") or []},
    )


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
