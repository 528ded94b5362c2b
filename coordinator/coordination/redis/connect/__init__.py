"""How the Redis backend connects: lanes, timeouts, failures, Cluster, Sentinel, TLS.

link.py      its connections: lanes, timeouts, error mapping, cluster routing
errors.py    how it classifies and reports failures
cluster.py   Redis Cluster: the URL form, hash slots, the {prefix} tag
sentinel.py  Redis Sentinel: the URL form of the sentinels and the service
tls.py       rediss:// verified against a private CA (GEMMANET_REDIS_CA_FILE)
"""
