"""How each GEMMANET_* variable's text becomes a value (``settings.VARIABLES`` names one of
these per setting): each takes the variable's name and its raw text and returns the value, or
raises ``SettingsError`` with one line that names the variable."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from coordinator import url_credentials
from coordinator.errors import SettingsError
from protocol.constraints import MAX_IDENTIFIER_LENGTH, is_identifier

PERIODS = {"second": 1.0, "minute": 60.0, "hour": 3600.0, "day": 86400.0}
_NAME = re.compile(r"[A-Za-z0-9._:-]{1,64}")


def parse_rate_limit(text: str) -> tuple[int, float]:
    """'60/minute' -> (60, 60.0). Also accepts '10/second', '1000/hour', '5/30s'."""
    match = re.fullmatch(
        r"\s*(\d+)\s*/\s*(?:(\d+(?:\.\d+)?)\s*s|(second|minute|hour|day)s?)\s*", text
    )
    if not match or int(match.group(1)) < 1:
        raise SettingsError(
            f"GEMMANET_RATE_LIMIT={text!r} is not a rate like '60/minute', '10/second' or '5/30s'"
        )
    period = float(match.group(2)) if match.group(2) else PERIODS[match.group(3)]
    if period <= 0:
        raise SettingsError(f"GEMMANET_RATE_LIMIT={text!r} has a zero period")
    return int(match.group(1)), period


def _flag(name: str, raw: str) -> bool:
    value = raw.lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise SettingsError(f"{name}={value!r} must be 0 or 1")


def _switch(name: str, raw: str) -> bool:
    """``on``/``off`` (or anything ``_flag`` takes), refused in those words."""
    try:
        return _flag(name, raw)
    except SettingsError:
        raise SettingsError(f"{name}={raw!r} must be on or off") from None


def _number(name: str, raw: str, *, minimum: float, maximum: float) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not a number") from None
    if not value >= minimum:
        raise SettingsError(f"{name}={raw!r} must be at least {minimum}")
    return min(value, maximum)


def _whole(name: str, raw: str, *, minimum: int) -> int:
    if not raw.isdigit() or int(raw) < minimum:
        raise SettingsError(f"{name}={raw!r} must be a whole number of at least {minimum}")
    return int(raw)


def _choice(name: str, raw: str, choices: tuple[str, ...]) -> str:
    if raw not in choices:
        raise SettingsError(f"{name}={raw!r} must be " + " or ".join(map(repr, choices)))
    return raw


# redis+cluster:// and rediss+cluster:// name a seed node of a Redis Cluster (README);
# redis+sentinel://s1:p1,s2:p2/service the sentinels of a master (checked above).
REDIS_SCHEMES = ("redis", "rediss", "redis+cluster", "rediss+cluster")


def _redis_url(name: str, raw: str) -> str:
    _refuse_credentials(name, raw)
    if raw.startswith(("redis+sentinel://", "rediss+sentinel://")):
        from coordinator.coordination.redis.connect.sentinel import parse_sentinel_url

        try:
            parse_sentinel_url(raw)
        except SettingsError as exc:
            raise SettingsError(f"{name}: {exc}") from None
        return raw
    try:
        parts = urlsplit(raw)
        parts.port  # noqa: B018 - raises ValueError on a port that is not a number
    except ValueError:
        raise SettingsError(f"{name} is not a URL like redis://host:6379/0") from None
    if parts.scheme not in REDIS_SCHEMES or not parts.hostname:
        # The URL is not echoed: it might carry a password.
        raise SettingsError(
            f"{name} must be redis://host:port/db, rediss://… (TLS) or redis+cluster://host:port, "
            f"not {parts.scheme + '://' if parts.scheme else 'a URL without a scheme'}"
        )
    if parts.scheme.endswith("+cluster") and parts.path not in ("", "/", "/0"):
        raise SettingsError(f"{name}: a Redis Cluster has only database 0, not {parts.path!r}")
    return raw


def _refuse_credentials(name: str, raw: str) -> None:
    # Checked before anything else reads the URL, so no message, log line or report shows it.
    problem = url_credentials.refusal(name, raw)
    if problem is not None:
        raise SettingsError(problem)


def _database_url(name: str, raw: str) -> str:
    _refuse_credentials(name, raw)
    return raw


def check_redis_tls(
    url: str | None, ca_file: str | None, cert_file: str | None, key_file: str | None
) -> None:
    """The TLS files only make sense together with a rediss:// URL, and cert with key."""
    if (cert_file is None) != (key_file is None):
        raise SettingsError(
            "GEMMANET_REDIS_CERT_FILE and GEMMANET_REDIS_KEY_FILE go together: set both or neither"
        )
    if cert_file and not ca_file:
        raise SettingsError("GEMMANET_REDIS_CERT_FILE needs GEMMANET_REDIS_CA_FILE")
    if ca_file and not (url or "").startswith(("rediss://", "rediss+cluster://")):
        raise SettingsError("GEMMANET_REDIS_CA_FILE needs a rediss:// GEMMANET_REDIS_URL")


def _readable_file(name: str, raw: str) -> str:
    try:
        with open(raw, encoding="utf-8") as handle:
            handle.read(1)
    except OSError as exc:
        raise SettingsError(f"{name}={raw!r}: cannot read the file: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise SettingsError(f"{name}={raw!r}: the file is not UTF-8 text") from None
    return raw


def _name(name: str, raw: str) -> str:
    if not _NAME.fullmatch(raw):
        raise SettingsError(f"{name}={raw!r} may hold only [A-Za-z0-9._:-]")
    return raw


def _identifier(name: str, raw: str) -> str:
    # The instance id travels in envelopes (welcome, bus.assign's reply_to): the wire's rule.
    if not is_identifier(raw):
        raise SettingsError(
            f"{name}={raw!r} may hold only [A-Za-z0-9._:-], at most {MAX_IDENTIFIER_LENGTH}"
        )
    return raw


def _port(name: str, raw: str) -> int:
    if not raw.isdigit() or not 1 <= int(raw) <= 65535:
        raise SettingsError(f"{name}={raw!r} must be a TCP port number from 1 to 65535")
    return int(raw)


#: Settings field -> (its GEMMANET_* variable, the parser that checks a value of it). The one
#: list of the variables: ``from_env`` reads it, and the commands' ``--help`` lists it
#: (``variables_help``).
