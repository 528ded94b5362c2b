"""Node connections as the instance serves them.

websocket.py   serving one node WebSocket (hello, auth, heartbeats, envelopes)
link.py        the outbox and close request of one node connection
heartbeats.py  our heartbeats to the nodes; each node's interval (GEMMANET_HEARTBEAT_RATE)
facts.py       our nodes' facts in the shared store (what leases are checked against)
telemetry.py   host telemetry from heartbeats: checked, paced, kept per node in the store
"""
