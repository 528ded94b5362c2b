"""The trio shell around the pure core.

instance.py     one coordinator instance: its node connections, pending tasks, supervision
node_link.py    the outbox and close request of one node connection
node_socket.py  serving one node WebSocket (hello, auth, heartbeats, envelopes)
task_handle.py  what a request handler holds while its task runs
membership.py   presence in the shared registry and the liveness judge's I/O
cluster.py      cross-instance dispatch, node ownership, the sweeps
"""
