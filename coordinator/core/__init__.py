"""Pure decisions, no I/O and no ambient time: every function takes ``now`` as an argument.

    instance_machine.py  one instance's side of the cluster protocol (requester + owner)
    requests/            the requester: tasks this instance accepted from its clients, each
                         request's lifecycle, its placement attempts and candidate nodes
    owner.py             this instance's node connections and the tasks they run
    effects.py           what the machines ask the shell to do
    admission/           a request waiting for a lease: the machine, its decisions, its errors,
                         and when to make a store call again
    placement/           which node gets a task, which is predicted to hold a request's prefix,
                         and whether a model can ever fit on the nodes serving it
    hosts/               direct model hosts as candidates: the facts rule and the enablement gate
    drain.py             an instance's drain (SIGTERM): refuse, wait, end what remains, go
    node_table.py        which connection speaks for which node identity on this instance
    tracker.py           which tasks are pending, who may answer them, which must fail and why
    forwarding.py        the owner's table of tasks it runs for other instances
    registry.py          the shared registry as data: snapshots, keys, the cluster-wide view
    liveness.py          who is dead, from what was read; the failover bound
    cluster_view.py      what /api/v1/status and /api/v1/nodes report
    task_content.py      whether a task's content fits, and the assign for a node's version

The trio shell (coordinator/runtime/) feeds these events and carries out what they return;
the simulator (sim/) drives the very same objects on a virtual clock.
"""
