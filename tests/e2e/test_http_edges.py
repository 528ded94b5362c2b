"""HTTP/1.1 edges Hypercorn gets wrong on its own (issue 13, items 6 and 9), against a real
``gemmanet serve`` over raw sockets: the workarounds live in coordinator/server/hypercorn_patches.py.

* A client that asks to close (``Connection: close``, or HTTP/1.0 without keep-alive) sees EOF
  right after the response, so reading to EOF does not hang; keep-alive still works.
* Requests Hypercorn refuses itself (a garbage request line, a 64 KiB header) get the same JSON
  error body as every other error, not an empty one."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import pytest

from tests.fixtures.processes import Coordinator, Processes

pytestmark = pytest.mark.e2e

#: how long a client may wait for EOF after the response; Hypercorn's keep-alive timeout is 5 s
EOF_WITHIN_S = 2.0


@pytest.fixture(scope="module")
def coord(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Coordinator]:
    procs = Processes(tmp_path_factory.mktemp("edges"))
    try:
        yield procs.coordinator()
    finally:
        procs.stop_all()


def address(coord: Coordinator) -> tuple[str, int]:
    host, port = coord.url.removeprefix("http://").split(":")
    return host, int(port)


def read_to_eof(coord: Coordinator, request: bytes) -> tuple[bytes, float]:
    """Send ``request`` and read until the server closes; the reply and the seconds it took.
    Fails if the server keeps the socket open longer than EOF_WITHIN_S."""
    with socket.create_connection(address(coord), timeout=EOF_WITHIN_S) as raw:
        started = time.monotonic()
        raw.sendall(request)
        reply = b""
        try:
            while chunk := raw.recv(65536):
                reply += chunk
        except TimeoutError:
            pytest.fail(f"no EOF within {EOF_WITHIN_S} s after {reply[:80]!r}")
        return reply, time.monotonic() - started


def split(reply: bytes) -> tuple[bytes, dict[str, str], bytes]:
    head, _, body = reply.partition(b"\r\n\r\n")
    status, *lines = head.split(b"\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.decode("latin1").partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers, body


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        b"GET /healthz HTTP/1.0\r\n\r\n",
        b"GET /api/v1/status HTTP/1.0\r\nHost: x\r\n\r\n",
    ],
    ids=["connection-close", "http-1.0", "http-1.0-status"],
)
def test_the_server_closes_when_the_client_asks(coord: Coordinator, request_bytes: bytes) -> None:
    reply, _ = read_to_eof(coord, request_bytes)
    status, headers, body = split(reply)
    assert status.startswith(b"HTTP/1.1 200 OK"), status
    assert headers["connection"].lower() == "close"
    assert len(body) == int(headers["content-length"])
    json.loads(body)


def test_keep_alive_still_serves_two_requests_on_one_socket(coord: Coordinator) -> None:
    with socket.create_connection(address(coord), timeout=5) as raw:
        replies = b""
        for sent in (1, 2):
            raw.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            while replies.count(b'{"ok":true}') < sent:
                replies += raw.recv(65536)
        assert replies.count(b"HTTP/1.1 200 OK") == 2, replies


@pytest.mark.parametrize(
    ("request_bytes", "status_line", "code"),
    [
        (b"GARBAGE\r\n\r\n", b"HTTP/1.1 400 Bad Request", "bad_request"),
        (
            b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: nope\r\n\r\n",
            b"HTTP/1.1 400",
            "bad_request",
        ),
        (
            b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 65536 + b"\r\n\r\n",
            b"HTTP/1.1 431 Request Header Fields Too Large",
            "headers_too_large",
        ),
    ],
    ids=["garbage-line", "bad-content-length", "64-KiB-header"],
)
def test_requests_hypercorn_refuses_get_a_json_error(
    coord: Coordinator, request_bytes: bytes, status_line: bytes, code: str
) -> None:
    reply, _ = read_to_eof(coord, request_bytes)
    status, headers, body = split(reply)
    assert status.startswith(status_line), status
    assert headers["content-type"] == "application/json"
    assert len(body) == int(headers["content-length"])
    error = json.loads(body)["error"]
    assert error["code"] == code and error["message"]
    assert coord.healthy()
