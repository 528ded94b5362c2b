"""The memory backend: the embedded default (one instance, the tests, the simulator).

coordination.py  its async facade (``MemoryCoordination``)
state.py         its synchronous state on an injected clock (``MemoryState``)
presence.py      its presence registries
leases.py        its leases and queues (the reference semantics)
telemetry.py     its host telemetry histories
monitor.py       its monitor election and fenced host facts
"""
