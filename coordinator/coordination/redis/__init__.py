"""The Redis/Valkey backend: any number of instances share one Redis.

coordination.py  its bundle (``RedisCoordination``): one link, one object per role on it
key_value.py     its keys: GET, SET, swaps, compare-and-set, counters, SCAN
rate_limits.py   its exact shared rate limit (a sliding-window log)
presence.py      its presence registries, on server TIME
leases.py        its leases and queues
lease_scripts.py the Lua scripts of its leases and queues
queue_lua.py     the Lua of a model's queue in its two orders (fifo, fair)
telemetry.py     its host telemetry histories (with their scripts)
monitor.py       its monitor election and fenced facts (with their scripts)
affinity.py      its prefix affinity: which nodes served which blocks (with its scripts)
pubsub.py        its PUBLISH and SUBSCRIBE (the lean client, at the link's master)
scripts.py       the Lua scripts of its compound operations
acl.py           the least ACL rights of one instance (gemmanet redis-acl)
connect/         its connections: lanes, timeouts, error mapping, Cluster, Sentinel, TLS
lean/            the lean pub/sub path: RESP parsed by hiredis over a trio socket
"""
