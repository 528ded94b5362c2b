"""The instance bus: one interface, three implementations, proven by one contract suite
(tests/coordinator/test_bus_contract.py).

base.py        the interface (``Bus``) and ``PubSubBus`` over either backend's pub/sub
streams.py     the bus over Redis streams (``StreamsBus``)
memory.py      the in-process bus (``MemoryBus``)
memory_hub.py  the hub the in-process buses of one process share
"""
