"""The memory backend: the embedded default (one instance, the tests, the simulator).

coordination.py  its bundle (``MemoryCoordination``): every role over one state
link.py          one client's link to the state (``MemoryLink``): what its role objects share
roles.py         its role objects: keys, rate limits, presence, leases, telemetry, monitor,
                 prefix affinity
pubsub.py        its pub/sub role and subscriptions
state.py         its synchronous state on an injected clock (``MemoryState``)
presence.py      its presence registries
leases.py        its leases and queues (the reference semantics)
queues.py        a model's admission queue in its two orders (fifo, fair)
telemetry.py     its host telemetry histories
monitor.py       its monitor election and fenced host facts
affinity.py      its prefix affinity tables: which nodes served which blocks
"""
