"""Django Channels' Redis pub/sub layer doing the same round trip as the cross-instance
benchmark's raw probe: the peer the hop is compared with (issue 11).

It runs in a process of its own (asyncio, where ``channels_redis`` lives), started by
``tools.bench.cross_instance`` at the same time as its own schedule, so both are measured in one
run under the same load: open loop at ``--rate`` laps/s, each lap ``send`` ping -> a second
layer's receiver sends it back -> received, timed from the scheduled send. Prints one JSON object:
``{"latencies_s": [...], "errors": {...}}``. Needs the ``bench`` extra
(``pip install -e '.[bench]'``); without it prints ``{"missing": "..."}``.

    python -m tools.bench.channels_probe --url redis://127.0.0.1:6379/0 --rate 25 --duration 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import Counter
from typing import Any

REQUEST_TIMEOUT_S = 10.0


async def measure(url: str, rate: float, warmup_s: float, duration_s: float) -> dict[str, Any]:
    from channels_redis.pubsub import RedisPubSubChannelLayer

    sender = RedisPubSubChannelLayer(hosts=[url])
    echoer = RedisPubSubChannelLayer(hosts=[url])
    ping = await echoer.new_channel()
    pong = await sender.new_channel()
    waiting: dict[int, asyncio.Future[float]] = {}
    loop = asyncio.get_running_loop()

    async def echo() -> None:
        while True:
            message = await echoer.receive(ping)
            await echoer.send(pong, message)

    async def collect() -> None:
        while True:
            message = await sender.receive(pong)
            future = waiting.pop(message["n"], None)
            if future is not None and not future.done():
                future.set_result(time.perf_counter())

    latencies: list[float] = []
    errors: Counter[str] = Counter()

    async def lap(n: int, scheduled: float, record: bool) -> None:
        future = waiting[n] = loop.create_future()
        try:
            await sender.send(ping, {"type": "ping", "n": n})
            received = await asyncio.wait_for(future, REQUEST_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - counted, the run goes on
            if record:
                errors[type(exc).__name__] += 1
            return
        finally:
            waiting.pop(n, None)
        if record:
            latencies.append(received - scheduled)

    tasks = [asyncio.create_task(echo()), asyncio.create_task(collect())]
    laps: set[asyncio.Task[None]] = set()
    start = time.perf_counter() + 0.05
    total = int((warmup_s + duration_s) * rate)
    for n in range(total):
        scheduled = start + n / rate
        await asyncio.sleep(max(0.0, scheduled - time.perf_counter()))
        task = asyncio.create_task(lap(n, scheduled, record=n >= warmup_s * rate))
        laps.add(task)
        task.add_done_callback(laps.discard)
    if laps:
        await asyncio.wait(laps, timeout=REQUEST_TIMEOUT_S + 1)
    for task in tasks:
        task.cancel()
    await sender.flush()
    await echoer.flush()
    return {"latencies_s": latencies, "errors": dict(errors)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.channels_probe")
    parser.add_argument("--url", required=True)
    parser.add_argument("--rate", type=float, default=25.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--duration", type=float, default=20.0)
    args = parser.parse_args(argv)
    try:
        import channels_redis.pubsub  # noqa: F401
    except ImportError as exc:
        print(json.dumps({"missing": str(exc)}))
        return 0
    result = asyncio.run(measure(args.url, args.rate, args.warmup, args.duration))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
