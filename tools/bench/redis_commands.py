"""Redis commands per ``POST /api/v1/request``: one coordinator on a private ``redis-server``,
one echo node, ``--requests`` requests one after another; ``INFO commandstats`` before and
after, divided by the requests. ``evalsha`` is the scripts called (each one round trip of the
coordinator's); the other commands include those the scripts ran inside. Background work
(beats, owner records) is in the figures too, a few hundredths per request at this pace.

    python -m tools.bench.redis_commands [--requests N]
"""

from __future__ import annotations

import argparse
import socket
import sys

import httpx

from tools.bench._harness import LOOPBACK, Harness, header_line, install_signal_handlers


def commandstats(port: int) -> dict[str, int]:
    """Calls per command name, as the server counts them."""
    with socket.create_connection((LOOPBACK, port), timeout=5) as sock:
        sock.sendall(b"INFO commandstats\r\n")
        data = b""
        while b"\r\n" not in data or len(data) < _reply_end(data):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    calls: dict[str, int] = {}
    for line in data.decode().splitlines():
        if line.startswith("cmdstat_"):
            name, fields = line[len("cmdstat_") :].split(":", 1)
            calls[name] = int(fields.split(",")[0].split("=")[1])
    return calls


def _reply_end(data: bytes) -> int:
    head = data.index(b"\r\n")
    return head + 2 + int(data[1:head]) + 2  # a bulk string: $<length>\r\n<body>\r\n


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.redis_commands")
    parser.add_argument("--requests", type=int, default=200, help="requests measured")
    args = parser.parse_args(argv)
    if args.requests < 1:
        parser.error("--requests must be positive")
    install_signal_handlers()
    body = {"model": "echo", "prompt": "p"}
    with Harness(GEMMANET_RATE_LIMIT="1000000/minute") as harness:
        url = harness.redis()
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        coord = harness.coordinator("coordinator", GEMMANET_REDIS_URL=url)
        harness.node(coord, "bench-echo", ["echo"])
        headers = {"Authorization": f"Bearer {harness.create_key('bench')}"}
        with httpx.Client(base_url=coord.url, headers=headers, timeout=30) as client:
            for _ in range(20):  # warm-up: scripts loaded, caches filled
                client.post("/api/v1/request", json=body).raise_for_status()
            before = commandstats(port)
            for _ in range(args.requests):
                client.post("/api/v1/request", json=body).raise_for_status()
            after = commandstats(port)
    per_request = {
        name: (after[name] - before.get(name, 0)) / args.requests for name in sorted(after)
    }
    print(header_line())
    print(f"Redis commands per POST /api/v1/request ({args.requests} requests, one at a time):")
    for name, count in per_request.items():
        if count >= 0.005:
            print(f"  {name:20s} {count:6.2f}")
    print(f"  {'scripts (evalsha)':20s} {per_request.get('evalsha', 0.0):6.2f}")
    print(f"  {'all':20s} {sum(per_request.values()):6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
