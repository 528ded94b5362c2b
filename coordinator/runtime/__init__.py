"""The trio shell around the pure core.

instance.py              one coordinator instance: the driver of the cluster machine
requests.py              its request side: start, end, rate and record its clients' tasks
instance_status.py       what the API reads of the cluster through it: status, nodes, telemetry
batched.py               group commit: store writes of callers arriving together, one bulk call
supervision.py           its periodic duties: ticks and liveness verdicts, ownership, ratings
membership.py            presence in the shared registry and the liveness judge's I/O
ownership.py             which instance speaks for each node identity (owner records)
bus_reader.py            reading this instance's inbox
bus_outbox.py            envelopes waiting to go out on the instance bus, in ordered lanes
node_heartbeats.py       our heartbeats to the nodes; each node's interval (GEMMANET_HEARTBEAT_RATE)
node_link.py             the outbox and close request of one node connection
node_socket.py           serving one node WebSocket (hello, auth, heartbeats, envelopes)
task_handle.py           what a request handler holds while its task runs
task_recorder.py         task records written in batches, off the request path
single_instance_lock.py  who may start: the lock, the mode check, one live process per id
rate_limit.py            the per-API-key rate limit, exact across instances
admission.py             capacity leases and the shared admission queue: reserve, wait, release
node_facts.py            our nodes' facts in the shared store (what leases are checked against)
metrics.py               the instance's Prometheus metrics (its own registry) and what they mean
log_context.py           the ids log lines carry (instance, task, node, request), in contextvars
task_log.py              the log lines about one task, with its task and node ids
node_telemetry.py        host telemetry from heartbeats: checked, paced, kept per node in the store
"""
