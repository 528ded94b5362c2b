"""Deterministic simulator: several real coordinator instances, many nodes and clients in one
process on virtual time (trio's MockClock), every choice drawn from one seed.

    world.py       builds the cluster, starts the clients and plays the faults; the entry point
    traffic.py     the simulated clients: requests to live instances, and what each one got
    faults.py      the fault plan drawn from the seed, and the wrappers that inject faults
    invariants.py  properties checked as the run goes (add one: a class and a list entry)
    invariant_base.py  what an invariant is (``Invariant``, ``Violation``)
    queue_invariants.py  the admission queue's: order per key (or model), no key starved
    trace.py       the event trace, its digest, trace files for replay
    actors.py      simulated nodes and the in-memory sockets they speak over
    stand_ins.py   the durable store stand-in (no threads, so no wall-clock nondeterminism)
    lease_observer.py  trace events of capacity leases and the admission queue
    monitors.py    elected residency monitors, the direct hosts they poll, the pause fault
    mutations.py   deliberately broken variants, to show the simulator catches real bugs
    cli.py         gemmanet sim run / replay / sweep
    bench.py       simulator speed (python -m sim.bench)
    fairness.py    the fair admission scenario, fair against fifo (python -m sim.fairness)
    trio_hook.py   the seed pins trio's scheduler, and the MockClock without trio.testing's
                   pytest (private API: the trio release is checked)

The instances are the production ``Instance`` class (the cluster machine and its trio
driver) over the memory coordination backend; only the edges (sockets, store, clients) are
simulated.
"""
