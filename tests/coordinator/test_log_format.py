"""The JSON formatter and the redacting filter, through real ``logging`` calls into a stream.

Each test installs the production handler (``configure_logging``) on a private stream, logs
through ordinary loggers and reads back what a log collector would read."""

from __future__ import annotations

import io
import json
import logging
import sys
import threading
from collections.abc import Iterator

import pytest
import trio

from coordinator.errors import SettingsError
from coordinator.log_redaction import MASK, RedactingFilter, Redactor, register_secret
from coordinator.logging_setup import (
    JsonFormatter,
    configure_logging,
    iso_utc,
    log_format_from_env,
    register_startup_secrets,
)
from coordinator.runtime.log_context import bind_log_ids, current_log_ids

API_KEY = "gn_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8S9t0U1v"
NODE_TOKEN = "gnn_" + "Z9y8X7w6V5u4T3s2R1q0P9o8N7m6L5k4J3i2H1g0F9e"


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    """A stream for ``configure_logging(stream=...)``; its handler is removed afterwards."""
    stream = io.StringIO()
    root = logging.getLogger()
    level, hooks = root.level, (sys.excepthook, threading.excepthook)
    yield stream
    for handler in list(root.handlers):
        if type(handler).__name__ == "_GemmanetHandler":
            root.removeHandler(handler)
    root.setLevel(level)
    sys.excepthook, threading.excepthook = hooks
    logging.captureWarnings(False)


def json_lines(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_format_setting_defaults_to_text_and_refuses_anything_else() -> None:
    assert log_format_from_env({}) == "text"
    assert log_format_from_env({"GEMMANET_LOG_FORMAT": " "}) == "text"
    assert log_format_from_env({"GEMMANET_LOG_FORMAT": "json"}) == "json"
    with pytest.raises(SettingsError, match="GEMMANET_LOG_FORMAT='JSON' must be 'text' or 'json'"):
        log_format_from_env({"GEMMANET_LOG_FORMAT": "JSON"})


def test_json_line_has_the_documented_fields(captured: io.StringIO) -> None:
    configure_logging(log_format="json", stream=captured)
    logging.getLogger("gemmanet.test").warning("two %s\nlines", "words")
    [entry] = json_lines(captured)
    assert set(entry) == {"ts", "level", "logger", "msg"}
    assert entry["level"] == "warning" and entry["logger"] == "gemmanet.test"
    assert entry["msg"] == "two words\nlines"  # one physical line: the newline is escaped
    assert captured.getvalue().count("\n") == 1
    assert iso_utc(0.5) == "1970-01-01T00:00:00.500Z"


def test_ids_come_from_the_context_of_each_task_and_extra_wins(captured: io.StringIO) -> None:
    configure_logging(log_format="json", verbose=True, stream=captured)
    log = logging.getLogger("gemmanet.test")

    async def request(n: int) -> None:
        bind_log_ids(request_id=f"r-{n}", task_id=f"t-{n}")
        await trio.sleep(0.01 * (2 - n))  # interleave the two tasks
        log.debug("in request %d", n)

    async def main() -> None:
        bind_log_ids(instance_id="A")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(request, 1)
            nursery.start_soon(request, 2)
        log.info("about another task", extra={"task_id": "t-9", "node_id": "box"})
        log.info("after the requests")

    trio.run(main)
    lines = {str(e["msg"]): e for e in json_lines(captured)}
    for n in (1, 2):
        entry = lines[f"in request {n}"]
        assert (entry["instance_id"], entry["request_id"], entry["task_id"]) == (
            "A",
            f"r-{n}",
            f"t-{n}",
        )
        assert "node_id" not in entry
    assert lines["about another task"]["task_id"] == "t-9"
    assert lines["about another task"]["node_id"] == "box"
    # The children's ids stayed in the children; the parent only has its own.
    assert {k: v for k, v in lines["after the requests"].items() if k.endswith("_id")} == {
        "instance_id": "A"
    }
    assert current_log_ids() == {}  # trio.run ran in a copy of this context


def test_a_traceback_is_one_string_in_exc(captured: io.StringIO) -> None:
    configure_logging(log_format="json", stream=captured)
    try:
        raise ValueError(f"connecting with {API_KEY}")
    except ValueError:
        logging.getLogger("gemmanet.test").exception("it failed")
    [entry] = json_lines(captured)
    exc = str(entry["exc"])
    assert exc.startswith("Traceback (most recent call last):")
    assert "ValueError: connecting with gn_" + MASK in exc and API_KEY not in exc


@pytest.mark.parametrize("log_format", ["json", "text"])
def test_no_secret_reaches_the_stream_at_any_level(captured: io.StringIO, log_format: str) -> None:
    register_secret("redis-file-secret-42")
    configure_logging(log_format=log_format, verbose=True, stream=captured)
    log = logging.getLogger("some.library")
    log.debug("connecting to redis://:redis-file-secret-42@cache:6379/0")
    log.debug("password is %s", "redis-file-secret-42")
    log.info("db postgresql://gemmanet:hunter2-pg@db/gemmanet up")
    log.warning("headers %r", [(b"authorization", b"Bearer " + API_KEY.encode())])
    log.error("hello %s", {"node_id": "box", "token": NODE_TOKEN})
    log.critical("key %s and token %s", API_KEY, NODE_TOKEN)
    log.info("proxy https://user:pa55word@proxy:8080 and https://tok3nvalue@example.org/x")
    log.info("config redis_password=s3cr3t-v4lue, basic dXNlcjpwYXNzd29yZA==")
    out = captured.getvalue()
    for secret in (
        "redis-file-secret-42",
        "hunter2-pg",
        API_KEY,
        NODE_TOKEN,
        "pa55word",
        "tok3nvalue",
        "s3cr3t-v4lue",
        "dXNlcjpwYXNzd29yZA",
    ):
        assert secret not in out, (secret, out)
    # What is not secret stays readable.
    assert "postgresql://gemmanet:***@db/gemmanet" in out
    assert "redis://:***@cache:6379/0" in out and "https://***@example.org/x" in out
    assert "gn_***" in out and "gnn_***" in out and "'node_id': 'box'" in out
    assert len(out.splitlines()) == 8  # nothing dropped


def test_redactor_leaves_ordinary_lines_alone_and_survives_bad_arguments() -> None:
    redactor = Redactor()
    redactor.register("abc")  # too short to mask without garbling every line
    redactor.register("a-long-secret")
    ordinary = (
        "task t-0123456789abcdef01234567 ended: ok (node box-1, key key_0123456789abcdef, "
        "a basic check, redis://cache:6379/0, token bucket refilled)"
    )
    assert redactor.redact(ordinary) == ordinary
    assert redactor.redact("x a-long-secret y") == f"x {MASK} y"
    record = logging.LogRecord("t", logging.INFO, __file__, 1, "%d items: %s", ("x",), None)
    assert RedactingFilter(redactor).filter(record) is True
    assert "unformattable log message" in record.getMessage()


def test_startup_secrets_come_from_the_password_file_and_the_database_url(
    captured: io.StringIO, tmp_path
) -> None:
    password_file = tmp_path / "redis-password"
    password_file.write_text("file-password-77\n")
    register_startup_secrets(
        database_url="postgresql+psycopg://gn:db-password-88@db/gn",
        redis_password_file=str(password_file),
    )
    configure_logging(log_format="json", stream=captured)
    logging.getLogger("t").info("raw values: file-password-77 db-password-88")
    [entry] = json_lines(captured)
    assert entry["msg"] == f"raw values: {MASK} {MASK}"


def test_warnings_and_uncaught_exceptions_become_json_lines(captured: io.StringIO) -> None:
    configure_logging(log_format="json", stream=captured)
    import warnings

    warnings.warn("a deprecated thing", DeprecationWarning, stacklevel=1)
    try:
        raise RuntimeError("boom")
    except RuntimeError as exc:
        sys.excepthook(type(exc), exc, exc.__traceback__)
    entries = json_lines(captured)
    assert [e["logger"] for e in entries] == ["py.warnings", "gemmanet"]
    assert "RuntimeError: boom" in str(entries[1]["exc"])


def test_formatter_alone_takes_ids_from_the_context() -> None:
    bind_log_ids(node_id="box-7")
    try:
        record = logging.LogRecord("n", logging.INFO, __file__, 1, "hi", None, None)
        assert json.loads(JsonFormatter().format(record))["node_id"] == "box-7"
    finally:
        bind_log_ids(node_id=None)
