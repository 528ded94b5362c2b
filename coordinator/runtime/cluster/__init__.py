"""The instance among the others: who is alive, who owns which node, the bus between them.

membership.py            presence in the shared registry and the liveness judge's I/O
ownership.py             which instance speaks for each node identity (owner records)
supervision.py           the periodic duties: ticks and liveness verdicts, ownership, ratings
bus_reader.py            reading this instance's inbox
bus_outbox.py            envelopes waiting to go out on the instance bus, in ordered lanes
assign_sender.py         an assign to its node's owner, sent again while the store is slow
single_instance_lock.py  who may start: the lock, the mode check, one live process per id
"""
