"""The Redis/Valkey backend: any number of instances share one Redis.

coordination.py  ``RedisCoordination``: keys, rate limits, presence, pub/sub
leases.py        its leases and queues (a mixin of RedisCoordination)
telemetry.py     its host telemetry histories (a mixin, with their scripts)
monitor.py       its monitor election and fenced facts (a mixin, with their scripts)
scripts.py       the Lua scripts of its compound operations
lease_scripts.py the Lua scripts of its leases and queues
subscription.py  one subscription's connection and pump (coredis; Cluster and Sentinel)
acl.py           the least ACL rights of one instance (gemmanet redis-acl)
connect/         its connections: lanes, timeouts, error mapping, Cluster, Sentinel, TLS
lean/            the lean pub/sub path: RESP parsed by hiredis over a trio socket
"""
