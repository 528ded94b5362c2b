"""How the Redis backend connects: lanes, timeouts, failures, Cluster, Sentinel, TLS.

link.py       its connections (``RedisLink``, what every role object holds): lanes, timeouts,
              error mapping, cluster routing, the key prefix
dedicated.py  a connection of its own for blocking commands (the Streams bus's XREAD BLOCK)
discovery.py  where a routed link connects: the slot's master, or the sentinels' master
operation.py  what the guard knows of an operation in flight (the connection it waits on)
errors.py     how it classifies and reports failures
cluster.py    Redis Cluster: the URL form, hash slots, the {prefix} tag
sentinel.py   Redis Sentinel: the URL form of the sentinels and the service
tls.py        rediss:// verified against a private CA (GEMMANET_REDIS_CA_FILE)
"""
