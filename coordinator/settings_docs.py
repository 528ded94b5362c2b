"""What each GEMMANET_* setting means, for the reference (docs/interface.md, "Settings").

The variable and its default come from ``coordinator/settings.py`` (``VARIABLES`` and the
fields of ``Settings``); this module holds only the meaning, in Markdown, grouped as the
reference shows them. ``python -m tools.docs_settings`` writes the tables between the markers
of docs/interface.md, and tests/test_docs_reference.py fails when they differ, when a setting
has no meaning here, or when one here is no setting. To add a setting: its field and
``VARIABLES`` entry in settings.py, its meaning here, then run the tool.

Links are relative to docs/ (the reference's folder).
"""

from __future__ import annotations

__all__ = ["EXTRA_VARIABLES", "GROUPS", "MEANINGS"]

#: Settings read outside ``Settings`` (variable -> (default as written, meaning)).
EXTRA_VARIABLES: dict[str, tuple[str, str]] = {
    "GEMMANET_LOG_FORMAT": (
        "text",
        (
            "every command's log on stderr: `text` (`<time> <LEVEL> <logger>: <message>`) or "
            "`json` (one object per line, see *Logs*). Anything else is refused with one line, "
            "exit 2"
        ),
    ),
}

#: Field of ``Settings`` (or a variable of ``EXTRA_VARIABLES``) -> its meaning.
MEANINGS: dict[str, str] = {
    "database_url": "API keys, node tokens, tasks, ratings. `postgresql://…` with the "
    "`postgres` extra (`pip install -e '.[postgres]'`, psycopg 3). A credential in the URL is "
    "refused (*Credentials in URLs* below): the PostgreSQL password goes in `~/.pgpass`, the "
    "file `PGPASSFILE` names, or `PGPASSWORD`. Without Redis, one process per database "
    "(*One process per embedded store* below)",
    "redis_url": "unset: embedded in-process coordination, one instance. `redis://[USER@]host:"
    "port/db`, `rediss://…` (TLS), `redis+cluster://host:port` (a Redis Cluster) or "
    "`redis+sentinel://s1:port,s2:port/SERVICE` (Sentinel): see *Redis URLs* below and the "
    "[Redis guide](redis.md). Another scheme, or a credential inside the URL (a password, a "
    "secret query parameter: *Credentials in URLs* below), is refused",
    "redis_password_file": "the Redis password is read from this file (surrounding whitespace "
    "stripped). A missing or unreadable file is refused at start",
    "redis_ca_file": "PEM file of the CA that signed the Redis server's certificate; with it the "
    "certificate is verified (`CERT_REQUIRED`) and must name the URL's host. Needs a "
    "`rediss://` URL; an unreadable or non-PEM file is refused at start in one line; a server "
    "signed by another CA: one line at start (`certificate verify failed`), "
    "`coordination_unavailable` later. Unset: coredis's `ssl_*` query parameters of the URL "
    "apply",
    "redis_cert_file": "PEM client certificate for mutual TLS (`tls-auth-clients yes`); goes "
    "with `GEMMANET_REDIS_KEY_FILE` (both or neither) and needs `GEMMANET_REDIS_CA_FILE`",
    "redis_key_file": "the private key of `GEMMANET_REDIS_CERT_FILE`",
    "multi_instance": "`1`: any number of instances share Redis. `0` with Redis: this instance "
    "holds the single-instance lock (`{prefix}:lock:single-instance`); a second instance "
    "refuses to start, and a graceful stop releases the lock at once. The two modes refuse to "
    "share one Redis and prefix, whichever starts first. `1` without Redis: refused",
    "bus": "cross-instance transport: `pubsub` or `streams` (Redis Streams: a lost inbox "
    "connection resumes with nothing lost; a killed instance is seen gone by senders within "
    "its 1 s presence TTL, its peers' tasks on it end within 1.9 s, where pub/sub knows at once)",
    "key_prefix": "prefix of every Redis key and channel (`[A-Za-z0-9._:-]`)",
    "instance_id": "this process's instance id (`[A-Za-z0-9._:-]`, at most 128 characters: it "
    "travels in envelopes)",
    "rate_limit": "per-API-key limit on every route that runs a task (`POST /api/v1/request`, "
    "`/v1/chat/completions`, `/v1/completions`, `/api/chat`, `/api/generate`: one budget), "
    "exact across instances. Also `10/second`, `1000/hour`, `5/30s`",
    "task_timeout_s": "upper bound of a task's lifetime (capped at 3600); a request's "
    "`timeout_s` can only shorten it",
    "heartbeat_interval_s": "node ↔ coordinator heartbeat interval (capped at 60); a node silent "
    "for 3 intervals is dropped",
    "heartbeat_rate": "most node heartbeats per second one instance asks for; past "
    "`GEMMANET_HEARTBEAT_S` × rate nodes, the instance's interval grows (nodes ÷ rate, in steps "
    "of a quarter at least, whole tenths of the base interval, at most 60 s): new nodes are "
    "told it in their welcome, connected ones in their next heartbeat (`interval_s`); each node "
    "is dropped after 3 missed intervals. When most nodes have left, new ones get the shorter "
    "interval again. `0`: every node gets `GEMMANET_HEARTBEAT_S`. Keeps idle CPU from growing "
    "with the node count ([design](design.md#scale))",
    "alive_ttl_s": "an instance silent in the presence registry this long (counting responsive "
    "time only) is dead; with `GEMMANET_SWEEP_S` it makes the failover bound, which must stay "
    "within 3 s ([design](design.md#liveness-and-failover))",
    "sweep_s": "how often each instance judges its peers' liveness",
    "capacity": "TOML operator file: per-node budgets, the model catalog, direct model hosts "
    "and telemetry agents ([capacity](capacity.md#the-operator-file), *Operator file* below). "
    "An unreadable or malformed file is refused at start with one line, and so is a table "
    "other than `[models]`, `[nodes]`, `[hosts]` and `[keys]` (or any other top-level key), by "
    "name",
    "queue_timeout_s": "how long a request may wait in the shared admission queue for a free "
    "node before `503 all_nodes_busy` with `Retry-After`; also the most it waits for a slow "
    "Redis: shorter than the store outage bound (2.9 s) is warned about at start",
    "queue_max": "waiting requests per model beyond which a request is refused at once "
    "(`503 all_nodes_busy`)",
    "queue_policy": "the order of a model's shared admission queue. `fair`: API keys take turns "
    "(weighted round robin by deficit counters, a key's weight its priority: `gemmanet keys "
    'create --priority N` or `[keys."name"] priority` in the operator file), each key\'s own '
    "requests first come first served; `fifo`: first come, first served across all keys. Every "
    "instance sharing a Redis must use the same; anything else is refused with one line, exit "
    "2. See [fair queuing](fair-queuing.md)",
    "max_active_per_key": "running + queued requests per API key across all instances; past it "
    "`429 too_many_active` with `Retry-After`",
    "residency_stale_s": "a node's facts (its budgets, resident models) are trusted while its "
    "owner instance beat within this window, a direct host's while the monitor wrote them "
    "within it; placement fails closed (`503 coordination_unavailable`) on stale facts",
    "lease_ttl_s": "the TTL of a capacity lease; running tasks renew theirs every third of it, a "
    "dead requester's lease heals by it",
    "metrics_port": "unset: `GET /metrics` is served on the API port; a port (1–65535): served "
    "only there (a second HTTP server in the same process), and the API port answers "
    "`404 not_found` for it. A port that cannot be bound refuses the start with one line",
    "metrics_host": "the address the metrics port binds (with `GEMMANET_METRICS_PORT`); "
    "`0.0.0.0` for a Prometheus on another machine",
    "telemetry_interval_s": "an owner instance stores at most one host telemetry sample per "
    "node this often (0.1–3600), in a history of the last 60 samples that expires "
    "`max(60, 2 × 60 × interval)` seconds after its last sample; the primary monitor polls "
    "telemetry agents this often",
    "monitor": "`1`: this instance runs a monitor candidate (any backend; on the embedded one "
    "its facts stay in this instance)",
    "monitor_poll_s": "the primary monitor polls every host this often (0.05–3600)",
    "monitor_ttl_s": "election TTL: the lease lapses this long after the primary's last "
    "renewal (0.1–3600); must exceed poll + poll timeout",
    "monitor_retry_s": "a standby tries the election this often (0.05–3600)",
    "monitor_poll_timeout_s": "one host's poll (all its requests) must answer within this "
    "(0.05–600), else the host is `reachable: false`",
    "monitor_unfenced": "**test only**: `1` makes fact writes skip the token compare (so "
    "`prove-takeover` fails); refused with one line unless `GEMMANET_ALLOW_TEST_SWITCHES=1`",
    "allow_test_switches": "permits the test-only switch above; never set it in production",
    "affinity": "`on` (or `1`) places each request with prefix affinity, `off` (or `0`) by "
    "load alone ([prefix affinity](affinity.md))",
    "affinity_prefix_weight": "the weight (0–1000) of the fraction of a request's prefix a "
    "node is predicted to hold",
    "affinity_load_weight": "the weight (0–1000) of a node's load (its share of busy slots, "
    "plus 1 when it has none free); at least the prefix weight, a node with a free slot always "
    "ranks before one without",
    "affinity_ttl_s": "how long (1–86400 s) a record that a node served a prefix predicts it "
    "still holds it; each new turn renews it",
    "affinity_max_blocks": "prefix blocks (256 characters each) kept per model in the shared "
    "store; past it the least recently recorded go first",
    "affinity_lookup_timeout_s": "how long (0.001–5 s) a request waits for the prediction; a "
    "slower or failing store places it by load alone, never fails it",
    "drain_s": "on SIGTERM, how long requests in flight get to end (0–3600; never past a "
    "task's own timeout) before what remains ends with `503 instance_shutting_down` "
    "([operations](operations.md))",
    "host_placement": "placement on the operator file's `[hosts]`. `gated`: only while the "
    "shared switch is on, which `gemmanet audit --enable` sets once every gate of the audit is "
    "green and `gemmanet audit --disable` clears (never set: off, so a new deployment places "
    "nothing on its hosts); every instance follows it within 0.5 s. `on`: as soon as a host's "
    "facts are fresh, switch or no switch (how a deployment from before the gate keeps its "
    "behaviour); needs `GEMMANET_REDIS_URL`, without it refused with one line, exit 2. `off`: "
    "never. Anything else is refused with one line, exit 2 "
    "([the runbook](direct-hosts.md#4-enable))",
    "GEMMANET_LOG_FORMAT": EXTRA_VARIABLES["GEMMANET_LOG_FORMAT"][1],
}

#: (heading, fields or extra variables), in the order the reference lists them.
GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "Storage and coordination",
        (
            "database_url",
            "redis_url",
            "redis_password_file",
            "redis_ca_file",
            "redis_cert_file",
            "redis_key_file",
            "multi_instance",
            "bus",
            "key_prefix",
            "instance_id",
        ),
    ),
    (
        "Requests and capacity",
        (
            "rate_limit",
            "task_timeout_s",
            "capacity",
            "queue_timeout_s",
            "queue_max",
            "queue_policy",
            "max_active_per_key",
            "residency_stale_s",
            "lease_ttl_s",
            "drain_s",
        ),
    ),
    (
        "Prefix affinity",
        (
            "affinity",
            "affinity_prefix_weight",
            "affinity_load_weight",
            "affinity_ttl_s",
            "affinity_max_blocks",
            "affinity_lookup_timeout_s",
        ),
    ),
    (
        "Nodes and liveness",
        ("heartbeat_interval_s", "heartbeat_rate", "alive_ttl_s", "sweep_s"),
    ),
    (
        "Monitor (direct model hosts)",
        (
            "host_placement",
            "monitor",
            "monitor_poll_s",
            "monitor_ttl_s",
            "monitor_retry_s",
            "monitor_poll_timeout_s",
            "monitor_unfenced",
            "allow_test_switches",
        ),
    ),
    (
        "Observability",
        ("metrics_port", "metrics_host", "telemetry_interval_s", "GEMMANET_LOG_FORMAT"),
    ),
)
