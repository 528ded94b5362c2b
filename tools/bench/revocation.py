"""How fast a revocation reaches the other instance: a key revoked through instance A (its
admin API) or by another process (the database, as ``gemmanet keys revoke`` does), time until
instance B, which has the key cached, refuses it; and a node connected to B revoked through A,
time until B closes its socket with 4001.

One cluster: instances A and B on a private ``redis-server`` and one SQLite database. Each
round makes a fresh key, uses it on B a few times, revokes it and then asks B every 5 ms until
it answers 401. ``--clients N`` keeps N other clients sending requests to B meanwhile (B
busy). The promise is 1 s (docs/keys-and-nodes.md); this prints the figures.

    python -m tools.bench.revocation [--rounds N] [--clients N] [--json FILE]
    python -m tools.bench.revocation --quick      # 3 rounds (smoke)
"""

from __future__ import annotations

import argparse
import os
import sys
from functools import partial
from typing import Any

import httpx
import trio
from trio_websocket import ConnectionClosed, open_websocket_url

from coordinator.store import Store
from protocol import Hello, decode_node, encode
from tools.bench._harness import (
    BenchError,
    Harness,
    cores,
    exit_code_for,
    header_line,
    install_signal_handlers,
    percentile,
    wait_until,
    write_json,
)

PROMISE_S = 1.0


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def until_refused(client: httpx.AsyncClient, key: str) -> float:
    start = trio.current_time()
    with trio.fail_after(60):
        while (await client.get("/api/v1/nodes", headers=bearer(key))).status_code != 401:
            await trio.sleep(0.005)
    return trio.current_time() - start


async def busy(client: httpx.AsyncClient, key: str, stop: trio.Event) -> None:
    while not stop.is_set():
        await client.get("/api/v1/nodes", headers=bearer(key))


async def key_rounds(
    harness: Harness, a_url: str, b_url: str, admin: str, args: argparse.Namespace
) -> dict[str, list[float]]:
    found: dict[str, list[float]] = {"api": [], "database": []}
    store = Store.open(harness.env["GEMMANET_DATABASE_URL"])
    stop = trio.Event()
    try:
        async with (
            httpx.AsyncClient(base_url=a_url, timeout=30) as on_a,
            httpx.AsyncClient(base_url=b_url, timeout=30) as on_b,
            trio.open_nursery() as nursery,
        ):
            for _ in range(args.clients):
                nursery.start_soon(busy, on_b, harness.probe_key, stop)
            for round_no in range(args.rounds):
                via = "api" if round_no % 2 == 0 else "database"
                record, key = store.create_api_key_sync(f"r{round_no}", actor="bench")
                for _ in range(3):
                    assert (await on_b.get("/api/v1/nodes", headers=bearer(key))).is_success
                if via == "api":
                    path = f"/api/v1/admin/keys/{record.key_id}/revoke"
                    answered = await on_a.post(path, headers=bearer(admin))
                    if answered.status_code != 200:
                        raise BenchError(f"revoke answered {answered.status_code}")
                else:
                    revoke = partial(store.lifecycle.revoke_key, record.key_id, actor="bench")
                    await trio.to_thread.run_sync(revoke)
                found[via].append(await until_refused(on_b, key))
            stop.set()
    finally:
        store.close()
    return found


async def node_round(harness: Harness, a_url: str, b_url: str, admin: str, i: int) -> float:
    node_id = f"bench-node-{i}"
    token = harness.enroll(node_id)
    ws_url = b_url.replace("http://", "ws://") + "/ws/node"
    async with (
        open_websocket_url(ws_url) as ws,
        httpx.AsyncClient(base_url=a_url, timeout=30) as on_a,
    ):
        await ws.send_message(encode(Hello(node_id=node_id, token=token, models=["x"])).decode())
        decode_node(await ws.get_message())  # the welcome
        await trio.sleep(0.6)  # the instance's watch has seen it
        answered = await on_a.post(f"/api/v1/admin/nodes/{node_id}/revoke", headers=bearer(admin))
        if answered.status_code != 200:
            raise BenchError(f"node revoke answered {answered.status_code}")
        start = trio.current_time()
        with trio.fail_after(30):
            try:
                while True:
                    await ws.get_message()
            except ConnectionClosed as closed:
                if closed.reason.code != 4001:
                    raise BenchError(f"node closed with {closed.reason.code}") from None
    return trio.current_time() - start


def run(args: argparse.Namespace) -> dict[str, Any]:
    with Harness() as harness:
        harness.env.update(
            GEMMANET_REDIS_URL=harness.redis(),
            GEMMANET_MULTI_INSTANCE="1",
            GEMMANET_KEY_PREFIX=f"rv{os.getpid()}",
        )
        with Store.open(harness.env["GEMMANET_DATABASE_URL"]) as store:
            admin = store.create_api_key_sync("bench-ops", admin=True)[1]
        a = harness.coordinator("instance-a", GEMMANET_INSTANCE_ID="A")
        b = harness.coordinator("instance-b", GEMMANET_INSTANCE_ID="B")
        wait_until(lambda: b.status()["instances"] == 2, "both instances to see each other")
        keys = trio.run(key_rounds, harness, a.url, b.url, admin, args)
        nodes = [
            trio.run(node_round, harness, a.url, b.url, admin, i)
            for i in range(max(1, args.rounds // 4))
        ]
    return {"key_via_api_s": keys["api"], "key_via_database_s": keys["database"], "node_s": nodes}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.bench.revocation", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--rounds", type=int, default=40, help="keys revoked (default 40)")
    parser.add_argument("--clients", type=int, default=4, help="busy clients on B (default 4)")
    parser.add_argument("--json", metavar="FILE", default=None, help="write the figures here")
    parser.add_argument("--quick", action="store_true", help="3 rounds, 1 busy client")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.clients = 3, 1
    if args.rounds < 2 or args.clients < 0:
        parser.error("--rounds must be at least 2 and --clients not negative")
    install_signal_handlers()
    try:
        found = run(args)
    except BaseException as exc:  # noqa: BLE001 - exit_code_for raises again what is not a failure or an interrupt
        return exit_code_for("revocation", exc)
    print(header_line())
    worst = 0.0
    figures: dict[str, Any] = {}
    for label, values in found.items():
        worst = max(worst, max(values))
        figures[label] = {"n": len(values), "p50": percentile(values, 50),
                          "p95": percentile(values, 95), "max": max(values)}  # fmt: skip
        print(
            f"{label:20} n={len(values):3}  p50 {figures[label]['p50']:.3f} s  "
            f"p95 {figures[label]['p95']:.3f} s  max {figures[label]['max']:.3f} s"
        )
    met = worst <= PROMISE_S
    print(
        f"promise {PROMISE_S:g} s: {'met' if met else 'MISSED'} ({args.clients} busy clients on B)"
    )
    write_json(args.json, {"benchmark": "revocation", "cores": cores(), **figures})
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
