"""The monitor loop against real hosts over real sockets: the fake Ollama (``/api/ps`` and
``/api/tags``), the fake OpenAI server (``/v1/models``) and a port nobody listens on; facts
written with the primary's epoch and read back through ``host_facts``. Election between two
loops on a real redis-server, and a monitor inside an instance (``GEMMANET_MONITOR=1``) on the
embedded backend."""

from __future__ import annotations

from functools import partial

import pytest
import trio

from coordinator.app import run_instance
from coordinator.capacity import Capacity, HostSpec, parse_capacity
from coordinator.coordination import Coordination
from coordinator.coordination.redis.coordination import RedisCoordination
from coordinator.errors import SettingsError
from coordinator.monitor.loop import run_monitor
from coordinator.settings import Settings
from tests.fixtures.processes import free_port
from tests.fixtures.redis_server import RedisServer
from tools.fakes.ollama import FakeOllama
from tools.fakes.openai import FakeOpenAI

# The monitor's lease TTL is 1.5 s, not less: at 0.6 s a loaded machine sometimes delayed the
# primary's renewal past it, the standby took over early and "the standby waits" failed.
FAST = {
    "monitor_poll_s": 0.1,
    "monitor_ttl_s": 1.5,
    "monitor_retry_s": 0.1,
    "monitor_poll_timeout_s": 0.3,
}


async def wait_for_facts(coord: Coordination, host: str, epoch: int, timeout_s: float = 10):
    with trio.fail_after(timeout_s):
        while True:
            facts = (await coord.monitor.host_facts([host])).get(host)
            if facts is not None and facts.epoch == epoch:
                return facts
            await trio.sleep(0.05)


@pytest.fixture
async def hosts(nursery: trio.Nursery) -> Capacity:
    ollama = FakeOllama(models=["small:1b"], resident={"big:27b": 17_400_000_000})
    openai = FakeOpenAI(models=["served-a", "served-b"])
    ollama_url = await nursery.start(ollama.run)
    openai_url = await nursery.start(openai.run)
    return Capacity(
        hosts={
            "box-o": HostSpec(url=ollama_url, kind="ollama"),
            "box-v": HostSpec(url=openai_url, kind="openai"),
            "box-down": HostSpec(url=f"http://127.0.0.1:{free_port()}", kind="ollama"),
        }
    )


@pytest.mark.redis
async def test_the_primary_writes_each_hosts_facts_and_a_standby_takes_over(
    redis_server: RedisServer, hosts: Capacity
) -> None:
    settings = Settings(capacity=hosts, **FAST)  # type: ignore[arg-type]
    async with (
        RedisCoordination(redis_server.url, key_prefix="t") as reader,
        RedisCoordination(redis_server.url, key_prefix="t") as first,
        RedisCoordination(redis_server.url, key_prefix="t") as second,
        trio.open_nursery() as nursery,
    ):
        first_scope = trio.CancelScope()

        async def first_monitor(task_status: trio.TaskStatus[None]) -> None:
            with first_scope:
                await run_monitor(
                    first.monitor, first.telemetry, settings, "one", task_status=task_status
                )

        await nursery.start(first_monitor)
        # One poll round writes the hosts one by one: wait for all three, not only the first.
        for host in ("box-v", "box-down"):
            await wait_for_facts(reader, host, 1)
        facts = await wait_for_facts(reader, "box-o", 1)
        assert facts.reachable and facts.resident == {"big:27b": 17.4}
        assert facts.record["models"] == ["big:27b", "small:1b"]
        assert facts.record["kind"] == "ollama"
        all_facts = await reader.monitor.host_facts()
        assert all_facts["box-v"].reachable and all_facts["box-v"].record["models"] == [
            "served-a",
            "served-b",
        ]
        assert all_facts["box-v"].resident == {}
        down = all_facts["box-down"]
        assert not down.reachable and down.record["error"]
        # Rewritten every poll (0.1 s): fresher than the lease TTL even on a loaded machine.
        assert all(f.age_s < FAST["monitor_ttl_s"] for f in all_facts.values())

        await nursery.start(partial(run_monitor, second.monitor, second.telemetry, settings, "two"))
        await trio.sleep(0.4)
        status = await reader.monitor.monitor_status()
        assert (status.holder, status.epoch) == ("one", 1)  # the standby waits
        # The primary dies without resigning: the standby takes over after the TTL.
        first_scope.cancel()
        with trio.fail_after(5):
            await wait_for_facts(reader, "box-o", 2)
        assert (await reader.monitor.monitor_status()).holder == "two"
        nursery.cancel_scope.cancel()


async def test_a_monitor_inside_an_instance_on_the_embedded_backend(
    tmp_path: object, hosts: Capacity
) -> None:
    settings = Settings(
        database_url=f"sqlite:///{tmp_path}/db.sqlite",
        monitor=True,
        capacity=hosts,
        **FAST,  # type: ignore[arg-type]
    )
    async with trio.open_nursery() as nursery:
        instance = await nursery.start(partial(run_instance, settings))
        facts = await wait_for_facts(instance.coordination, "box-o", 1)
        assert facts.resident == {"big:27b": 17.4}
        assert (await instance.coordination.monitor.monitor_status()).holder == settings.instance_id
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('[hosts."h"]\nkind = "ollama"', "url is required"),
        ('[hosts."h"]\nurl = "ftp://x"\nkind = "ollama"', "http:// or https://"),
        ('[hosts."h"]\nurl = "http://x"\nkind = "vllm"', "must be 'ollama' or 'openai'"),
        ('[hosts."h"]\nurl = "http://x"\nkind = "openai"\nmax_parallel = 0', "whole number"),
        ('[hosts."h"]\nurl = "http://x"\nkind = "openai"\nweight = 0', "above 0"),
        ('[hosts."h"]\nurl = "http://x"\nkind = "openai"\nvram = 3', "unknown field"),
        ('[hosts."a b"]\nurl = "http://x"\nkind = "openai"', "host id"),
    ],
)
def test_bad_host_entries_are_refused(text: str, problem: str) -> None:
    with pytest.raises(SettingsError, match=problem):
        parse_capacity(text)


def test_a_host_entry_is_read() -> None:
    text = '[hosts."box-c"]\nurl = "http://box-c:11434/"\nkind = "ollama"\nmemory_gb = 24\n'
    text += "max_parallel = 2\nweight = 0.5\n"
    assert parse_capacity(text).hosts == {
        "box-c": HostSpec(
            url="http://box-c:11434", kind="ollama", memory_gb=24.0, max_parallel=2, weight=0.5
        )
    }
