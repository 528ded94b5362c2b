"""The least Redis ACL rights one coordinator instance needs (docs/redis.md "Redis identities and TLS").

Every command the Redis backend, the buses and their Lua scripts send, found by reading the
role modules of ``redis/`` (``key_value.py``, ``rate_limits.py``, ``presence.py``,
``leases.py``, ``telemetry.py``, ``monitor.py``, ``affinity.py``, ``pubsub.py``,
``subscription.py``), ``redis/connect/``, ``redis/lean/``, ``bus/streams.py`` and the scripts
(``redis.call`` inside a script is checked against the caller's rights too). Every key and channel is ``<prefix>:…``
(``keys.py``). A new command in the backend must be added here, or the ACL end-to-end test
fails with NOPERM.
"""

from __future__ import annotations

import re

__all__ = [
    "CLUSTER_COMMANDS",
    "INSTANCE_COMMANDS",
    "SENTINEL_COMMANDS",
    "SINCE_7_2",
    "instance_acl_rules",
    "parse_version",
    "setuser_line",
]

#: commands and subcommands (``parent|sub``) an instance runs, grouped by who sends them
INSTANCE_COMMANDS: tuple[str, ...] = (
    # connection handshake (coredis): HELLO 3 AUTH, SELECT for a db > 0
    "hello",
    "auth",
    "select",
    # the backend's own commands
    "ping",
    "get",
    "mget",
    "set",
    "del",
    "scan",
    "publish",
    "pubsub|numsub",
    "subscribe",
    "unsubscribe",
    "hset",
    "lrange",
    "pttl",
    "evalsha",
    "eval",
    # the streams bus: XREAD BLOCK on a dedicated, named connection
    "xread",
    "client|setname",
    # only inside the Lua scripts
    "exists",
    "hdel",
    "hexists",
    "hget",
    "hgetall",
    "hkeys",
    "hlen",
    "hmget",
    "incr",
    "incrby",
    "lindex",
    "lpop",
    "lrem",
    "ltrim",
    "pexpire",
    "rpush",
    "time",
    "xadd",
    "xinfo|stream",
    "zadd",
    "zcard",
    "zlexcount",
    "zrange",
    "zrangebylex",
    "zrangebyscore",
    "zrank",
    "zrem",
    "zremrangebyscore",
    "zscore",
)

#: on a Redis Cluster (redis+cluster://), instead of PUBLISH/SUBSCRIBE: the sharded pub/sub bus
#: and finding the master of the deployment's slot
CLUSTER_COMMANDS: tuple[str, ...] = (
    "spublish",
    "ssubscribe",
    "sunsubscribe",
    "pubsub|shardnumsub",
    "cluster|slots",
)

#: under Sentinel (redis+sentinel://): checking the named master is one, and waiting for a
#: replica to hold a new monitor epoch
SENTINEL_COMMANDS: tuple[str, ...] = ("role", "wait")

#: coredis also sends CLIENT SETINFO to Redis >= 7.2 (it shrugs off a refusal, but the refusal
#: fills the ACL log); Redis 7.0 rejects a rule naming it, so it is added by version.
SINCE_7_2: tuple[str, ...] = ("client|setinfo",)

_USER = re.compile(r"[A-Za-z0-9._-]{1,64}")


def parse_version(text: str) -> tuple[int, int]:
    """'7.2' or '7.2.4' -> (7, 2)."""
    match = re.fullmatch(r"(\d+)\.(\d+)(?:\.\d+)?", text.strip())
    if match is None:
        raise ValueError(f"Redis version {text!r} is not like 7.2 or 7.0.15")
    return int(match.group(1)), int(match.group(2))


def instance_acl_rules(
    prefix: str,
    redis_version: tuple[int, int] = (7, 0),
    *,
    cluster: bool = False,
    sentinel: bool = False,
) -> list[str]:
    """The ACL rules (without ``on`` and a password) of an instance using key prefix ``prefix``:
    its keys and channels only, and exactly the commands above (for that server version). On a
    cluster its names carry the hash tag (``{prefix}:…``, see ``redis_cluster``)."""
    if not re.fullmatch(r"[A-Za-z0-9._:-]{1,64}", prefix):
        raise ValueError(f"key prefix {prefix!r} may hold only [A-Za-z0-9._:-]")
    names = f"{{{prefix}}}:*" if cluster else f"{prefix}:*"
    # resetkeys/resetchannels/-@all first: the rules below are the whole of the user's rights.
    return [
        "reset",
        f"~{names}",
        f"&{names}",
        "-@all",
        *(f"+{command}" for command in INSTANCE_COMMANDS),
        *(f"+{command}" for command in CLUSTER_COMMANDS if cluster),
        *(f"+{command}" for command in SENTINEL_COMMANDS if sentinel),
        *(f"+{command}" for command in SINCE_7_2 if redis_version >= (7, 2)),
    ]


def setuser_line(
    user: str,
    prefix: str,
    password: str = "<password>",
    redis_version: tuple[int, int] = (7, 0),
    *,
    cluster: bool = False,
    sentinel: bool = False,
) -> str:
    """``ACL SETUSER`` for one instance (paste into redis-cli, with the real password, or drop
    the ``ACL SETUSER`` for an aclfile ``user`` line)."""
    if not _USER.fullmatch(user):
        raise ValueError(f"user name {user!r} may hold only [A-Za-z0-9._-], at most 64")
    rules = instance_acl_rules(prefix, redis_version, cluster=cluster, sentinel=sentinel)
    return " ".join(["ACL SETUSER", user, *rules, "on", f">{password}"])
