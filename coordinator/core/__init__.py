"""Pure decisions, no I/O and no ambient time: every function takes ``now`` as an argument.

    instance_machine.py  one instance's side of the cluster protocol (requester + owner)
    requests/            the requester: tasks this instance accepted from its clients, each
                         request's lifecycle, its placement attempts and candidate nodes
    owner.py             this instance's node connections and the tasks they run
    effects.py           what the machines ask the shell to do
    admission.py         a request waiting for a lease: ask again, wait, pass a wake, give up
    admission_decisions.py  what the admission machine decides (one class per decision)
    admission_errors.py  the errors a request waiting for a lease fails with
    drain.py             an instance's drain (SIGTERM): refuse, wait, end what remains, go
    retries.py           when to make a store call again (a timeout, a failed release), when not
    placement.py         which node gets a task
    fit.py               whether a model can ever fit on the nodes serving it
    affinity.py          which node is predicted to hold a request's prefix, and its worth
    node_table.py        which connection speaks for which node identity on this instance
    tracker.py           which tasks are pending, who may answer them, which must fail and why
    forwarding.py        the owner's table of tasks it runs for other instances
    registry.py          the shared registry as data: snapshots, keys, the cluster-wide view
    liveness.py          who is dead, from what was read; the failover bound
    cluster_view.py      what /api/v1/status and /api/v1/nodes report
    direct_hosts.py      whether a direct model host may be placed on now (fail closed)
    host_gate.py         whether placement on direct hosts is switched on (the enablement gate)
    task_content.py      whether a task's content fits, and the assign for a node's version

The trio shell (coordinator/runtime/) feeds these events and carries out what they return;
the simulator (sim/) drives the very same objects on a virtual clock.
"""
