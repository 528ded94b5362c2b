"""One client process of tests/coordinator/test_lease_concurrency.py: for ``seconds`` it
admits requests on node n1 (retrying while queued), holds each granted lease a few
milliseconds while counted in the shared ``holders`` counter, then releases it. Prints
``{"peak": most holders seen at once, "grants": n}`` as JSON.

Variants (``no_parallel`` and ``check_then_act`` are deliberately broken, as mutation checks):

* ``ok`` — the real ``admit``;
* ``no_parallel`` — an ADMIT script without the parallel-budget check;
* ``check_then_act`` — the parallel budget checked in Python with ``lease_usage`` before
  admitting with that script: two round trips, the race an atomic script exists to avoid.

Usage: python -m tests.coordinator.lease_hammer URL PREFIX INSTANCE VARIANT SECONDS
"""

from __future__ import annotations

import json
import sys

import trio

from coordinator.coordination.leases import AdmissionRules, LeaseAsk, LeaseRelease
from coordinator.coordination.redis.coordination import RedisCoordination
from coordinator.coordination.redis.lease_scripts import ADMIT
from coordinator.coordination.redis.leases import RedisLeases
from coordinator.coordination.redis.scripts import LuaScript

REGISTRY = "instances"
RULES = AdmissionRules(REGISTRY, 60.0, 60.0, 60.0, queue_max=100)
PARALLEL_CHECK = b"  if redis.call('ZCARD', n) >= facts.max_parallel then return 'full' end\n"
assert PARALLEL_CHECK in ADMIT.source
ADMIT_WITHOUT_PARALLEL_CHECK = LuaScript("broken_admit", ADMIT.source.replace(PARALLEL_CHECK, b""))


class Broken(RedisLeases):
    admit_script = ADMIT_WITHOUT_PARALLEL_CHECK


async def hammer(url: str, prefix: str, me: str, variant: str, seconds: float) -> dict[str, int]:
    peak = grants = 0
    async with RedisCoordination(url, key_prefix=prefix) as c:
        if variant != "ok":
            c.leases = Broken(c.link)
        await c.presence.presence_beat(REGISTRY, me, b"", stall_after_s=60.0, forget_after_s=60.0)
        deadline = trio.current_time() + seconds
        for n in range(1_000_000):
            rid = f"{me}-{n}"
            lease_id = ""
            for attempt in range(1_000_000):
                if trio.current_time() > deadline:
                    break
                usage = await c.leases.lease_usage(["n1"]) if variant == "check_then_act" else None
                if usage is not None and usage["n1"].leases >= 2:
                    await trio.sleep(0.001)
                    continue
                ask = LeaseAsk(
                    rid, me, "key", "m", 4.0, 1.0, (("n1", "c1"),), f"{rid}.{attempt}", 60
                )
                admission = await c.leases.admit(ask, RULES)
                if admission.outcome == "granted":
                    lease_id = admission.lease_id
                    break
                await trio.sleep(0.001)
            if lease_id:
                peak = max(peak, await c.key_value.incr("holders"))
                await trio.sleep(0.003)
                await c.key_value.incr("holders", -1)
                grants += 1
            await c.leases.release(
                LeaseRelease(
                    request_id=rid,
                    key_id="key",
                    model="m",
                    lease=("n1", lease_id) if lease_id else None,
                    wake_models=[],
                ),
                RULES,
            )
            if trio.current_time() > deadline:
                break
    return {"peak": peak, "grants": grants}


def main() -> None:
    url, prefix, me, variant, seconds = sys.argv[1:6]
    print(json.dumps(trio.run(hammer, url, prefix, me, variant, float(seconds))))


if __name__ == "__main__":
    main()
