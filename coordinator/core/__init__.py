"""Pure decisions, no I/O and no ambient time: every function takes ``now`` as an argument.

    placement.py   which node gets a task
    node_table.py  which connection speaks for which node identity on this instance
    tracker.py     which tasks are pending, who may answer them, which must fail and why

The trio shell (coordinator/runtime/) feeds these events and carries out what they return;
the simulator (sim/) drives the very same objects on a virtual clock.
"""
