"""The instance bus: one interface, three implementations, proven by one contract suite
(tests/coordinator/test_bus_contract.py).

base.py        the interface (``Bus``) and ``PubSubBus`` over either backend's pub/sub
streams.py     the bus over Redis streams (``StreamsBus``)
streams_scripts.py  its Lua scripts and the parsing of their replies
stall_watch.py the presence evidence by which it believes (or not) that a listener is gone
memory.py      the in-process bus (``MemoryBus``)
memory_hub.py  the hub the in-process buses of one process share
"""
