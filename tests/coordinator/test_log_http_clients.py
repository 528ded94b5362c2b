"""httpx's per-request INFO lines stay out of the logs unless ``-v``: a monitor polls each host
every 2 s and an agent checks its backend every 5 s, so otherwise each poll was a log line.

Real requests with the real httpx to a real local HTTP server, logged through the production
handler (``configure_logging``), and the node agent's own set-up in a fresh interpreter."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from coordinator.logging_setup import configure_logging
from protocol.log_lines import CHATTY_LOGGERS

ROOT = Path(__file__).resolve().parents[2]


class _Ok(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, format: str, *args: object) -> None:
        pass  # the server's own access lines are not what is measured


@pytest.fixture
def url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/api/tags"
    server.shutdown()
    server.server_close()


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    stream = io.StringIO()
    root = logging.getLogger()
    level = root.level
    yield stream
    for handler in list(root.handlers):
        if type(handler).__name__ == "_GemmanetHandler":
            root.removeHandler(handler)
    root.setLevel(level)
    for name in CHATTY_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET)


def test_a_request_is_not_a_log_line_at_info(url: str, captured: io.StringIO) -> None:
    configure_logging(stream=captured)
    assert httpx.get(url).status_code == 200
    logging.getLogger("gemmanet.monitor").info("our own line")
    assert "HTTP Request:" not in captured.getvalue()
    assert "our own line" in captured.getvalue()
    # a library's warning still gets through
    logging.getLogger("httpx").warning("a warning of httpx")
    assert "a warning of httpx" in captured.getvalue()


def test_verbose_shows_every_request(url: str, captured: io.StringIO) -> None:
    configure_logging(stream=captured)
    configure_logging(verbose=True, stream=captured)  # -v after a quiet set-up: loud again
    httpx.get(url)
    assert f"HTTP Request: GET {url}" in captured.getvalue()


def test_the_agent_alone_logs_no_request_either(url: str) -> None:
    program = (
        "import logging, httpx\n"
        "from tools.node_agent.logs import configure_logging_once\n"
        "configure_logging_once()\n"
        f"httpx.get({url!r})\n"
        "logging.getLogger('gemmanet.node').info('backend answers')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", program],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "backend answers" in done.stderr
    assert "HTTP Request:" not in done.stderr, done.stderr
