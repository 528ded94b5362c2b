"""Credentials inside a Redis or database URL: found (to refuse the URL at start) and hidden
(wherever a command shows a URL).

A secret in a URL ends up in shell history, process listings, unit files and every report
that prints the setting, so ``GEMMANET_REDIS_URL`` and ``GEMMANET_DATABASE_URL`` take none:
not a password after the user name (``user:secret@host``), and not a query parameter whose
name says it holds one (``?password=…``, ``?token=…``, ``?sslpassword=…``), which the Redis
and PostgreSQL clients would also read as credentials. A user name alone is no secret (the
Redis ACL user, the PostgreSQL role) and stays.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, unquote, urlsplit

__all__ = ["HOW_TO_PASS", "MASK", "credentials_in", "hide_credentials", "refusal"]

MASK = "***"
#: A query parameter named like a secret; ``passfile`` (libpq: the path of a password file)
#: is a path, not a secret, and does not match.
SECRET_PARAMETER = re.compile(
    r"(?i)password|passwd|^pass$|pwd|secret|token|credential|^auth|api_?key|access_?key"
)

#: Where each setting's secret goes instead, as the refusal says it.
HOW_TO_PASS = {
    "GEMMANET_REDIS_URL": "put the password in a file and set GEMMANET_REDIS_PASSWORD_FILE "
    "to its path",
    "GEMMANET_DATABASE_URL": "put the password in a PostgreSQL password file (~/.pgpass, or "
    "the path in PGPASSFILE) or in PGPASSWORD, which the driver reads",
}


def _netloc_password(netloc: str) -> bool:
    user_info, at, _ = netloc.rpartition("@")
    # Sentinel URLs list several hosts (``s1:26379,s2:26379``), so urlsplit's own parsing of
    # the port would fail there; the user information is all that matters here.
    return bool(at) and ":" in user_info


def credentials_in(url: str) -> list[str]:
    """What in ``url`` is a credential, named without its value: ``a password after the user
    name``, ``query parameter 'token'``. Empty: the URL carries none."""
    parts = urlsplit(url)
    found = ["a password after the user name"] if _netloc_password(parts.netloc) else []
    for name, _ in parse_qsl(parts.query, keep_blank_values=True):
        if SECRET_PARAMETER.search(name):
            found.append(f"query parameter {name!r}")
    return found


def refusal(setting: str, url: str) -> str | None:
    """The one line refusing ``url`` as the value of ``setting``, or None when it is clean."""
    found = credentials_in(url)
    if not found:
        return None
    how = HOW_TO_PASS.get(setting, "pass the secret outside the URL")
    return f"{setting} must not carry credentials ({', '.join(found)}): {how}"


def hide_credentials(url: str) -> str:
    """``url`` as a command may show it: a password and secret query values become ***."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if _netloc_password(netloc):
        user_info, _, hosts = netloc.rpartition("@")
        netloc = f"{user_info.partition(':')[0]}:{MASK}@{hosts}"
    pairs = [pair.partition("=") for pair in parts.query.split("&")] if parts.query else []
    query = "&".join(
        name + eq + (MASK if eq and SECRET_PARAMETER.search(unquote(name)) else value)
        for name, eq, value in pairs
    )
    # Put together by hand: urlunsplit drops the empty authority of sqlite:///path.
    shown = f"{parts.scheme}://{netloc}{parts.path}" if parts.scheme else netloc + parts.path
    return shown + (f"?{query}" if query else "") + (f"#{parts.fragment}" if parts.fragment else "")
