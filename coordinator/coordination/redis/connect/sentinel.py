"""Redis Sentinel: the URL form and how to read the sentinels' answers (docs/redis.md "Redis Sentinel").

``redis+sentinel://host1:26379,host2:26379,host3:26379/mymaster`` names the sentinels and the
service. The backend asks them (``SENTINEL GET-MASTER-ADDR-BY-NAME``) for the master, checks
that it says ``ROLE`` master, and sends everything there; a lost connection, a timeout or a
``READONLY`` reply (a demoted master) makes it ask again on the next operation.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from coordinator.errors import SettingsError

__all__ = ["SENTINEL_SCHEMES", "SentinelTarget", "parse_sentinel_url"]

#: URL schemes that select Sentinel, mapped to the scheme of the master's connection
SENTINEL_SCHEMES = {"redis+sentinel": "redis", "rediss+sentinel": "rediss"}

_SERVICE = re.compile(r"[A-Za-z0-9._-]{1,64}")


@dataclass(frozen=True)
class SentinelTarget:
    #: (host, port) of each sentinel, in the URL's order
    sentinels: tuple[tuple[str, int], ...]
    #: the master's name in the sentinels' configuration
    service: str
    #: a plain URL for the connection settings (scheme, user, TLS parameters) of the master
    master_url: str

    @property
    def shown(self) -> str:
        """For messages: the sentinels and the service, without user or parameters."""
        hosts = ",".join(f"{host}:{port}" for host, port in self.sentinels)
        return f"redis+sentinel://{hosts}/{self.service}"


def parse_sentinel_url(url: str) -> SentinelTarget | None:
    """The sentinels and service of a ``redis+sentinel://`` URL; None for another scheme."""
    parts = urlsplit(url)
    scheme = SENTINEL_SCHEMES.get(parts.scheme)
    if scheme is None:
        return None
    user, _, hosts = parts.netloc.rpartition("@")
    sentinels = []
    for item in hosts.split(","):
        host, _, port = item.rpartition(":")
        if not host or not port.isdigit():
            raise SettingsError(
                "a Sentinel URL is redis+sentinel://host:port,host:port,…/service; "
                f"{item!r} is not host:port"
            )
        sentinels.append((host, int(port)))
    service = parts.path.strip("/")
    if not _SERVICE.fullmatch(service):
        raise SettingsError(
            "a Sentinel URL ends with the service name (/mymaster), of [A-Za-z0-9._-]"
        )
    netloc = f"{user}@{hosts.split(',')[0]}" if user else hosts.split(",")[0]
    master_url = urlunsplit((scheme, netloc, "/0", parts.query, ""))
    return SentinelTarget(tuple(sentinels), service, master_url)
