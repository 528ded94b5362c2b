"""Redis Sentinel URLs (README "Redis Sentinel"). The failover itself, with the fencing token
across it, is tests/e2e/test_redis_sentinel_e2e.py (one sentinel group: they take seconds to
start)."""

from __future__ import annotations

import pytest

from coordinator.coordination.redis.connect.sentinel import parse_sentinel_url
from coordinator.errors import SettingsError
from coordinator.settings import Settings


def test_sentinel_urls() -> None:
    target = parse_sentinel_url("redis+sentinel://me@a:1,b:2,c:3/svc?ssl_cert_reqs=none")
    assert target is not None
    assert target.sentinels == (("a", 1), ("b", 2), ("c", 3)) and target.service == "svc"
    assert target.master_url == "redis://me@a:1/0?ssl_cert_reqs=none"
    assert target.shown == "redis+sentinel://a:1,b:2,c:3/svc"
    assert parse_sentinel_url("redis://a:1/0") is None
    for bad in ("redis+sentinel://a:1,b/svc", "redis+sentinel://a:1/", "redis+sentinel://a:x/s"):
        with pytest.raises(SettingsError):
            parse_sentinel_url(bad)
    url = "redis+sentinel://a:1,b:2/svc"
    assert Settings.from_env({"GEMMANET_REDIS_URL": url}).redis_url == url
    with pytest.raises(SettingsError, match="password"):
        Settings.from_env({"GEMMANET_REDIS_URL": "redis+sentinel://u:pw@a:1,b:2/svc"})
