"""The trio shell around the pure core, by what it serves: requests, nodes, the cluster.

instance.py         one coordinator instance: the driver of the cluster machine
instance_status.py  what the API reads of the cluster through it: status, nodes, telemetry
lifecycle.py        revocations honoured here (keys' cache, nodes' sockets), last used/seen
drain.py            SIGTERM's drain carried out: refusals, the window, the end of what remains
batched.py          group commit: store writes of callers arriving together, one bulk call
metrics.py          the instance's Prometheus metrics (its own registry) and what they mean
log_context.py      the ids log lines carry (instance, task, node, request), in contextvars
requests/           the request side: admission, rate limits, task handles, records, task logs
nodes/              node connections: the WebSocket, its link, heartbeats, facts, telemetry
cluster/            the instance among others: membership, ownership, the bus, supervision,
                    the single-instance lock
"""
