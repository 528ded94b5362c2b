"""Benchmarks of the coordinator (they print figures; they are not tests).

* ``python -m tools.bench.throughput`` — closed-loop ``POST /api/v1/request`` against ``GET
  /healthz`` on one instance, side by side: CPU per answer of each process (coordinator, node,
  client) and the coordinator's ratio; ``--redis`` on Redis coordination (a private
  ``redis-server``), ``--py-spy DIR`` profiles the coordinator and splits its CPU by category.
* ``python -m tools.bench.stream`` (= ``throughput --stream``) — the CPU of one streamed chunk
  (node -> coordinator -> SSE to the client) against a non-streamed request, side by side.
* ``python -m tools.bench.redis_commands`` — Redis commands (and scripts: round trips) per
  request, from the server's ``INFO commandstats``.
* ``python -m tools.bench.cross_instance`` — open-loop latency of a request that crosses to
  another instance over the Redis bus against one served locally, side by side, on each Redis
  client of the bus (lean, coredis), with raw round trips for scale (``_probes.py``: pub/sub
  through either client, a bare socket PING, and Django Channels' Redis pub/sub layer in its own
  process, ``channels_probe.py``, when the ``bench`` extra is installed); then the CPU of the two
  instances per cross-instance request against a local one, in closed-loop rounds (``--py-spy``).
* ``python -m tools.bench.scale`` — three instances with 200 to 10,000 light nodes
  (``scale_fleet.py``): idle CPU, Redis bytes/s, request latency, placement time, connect time;
  ``--py-spy DIR`` profiles each instance (``_profile.py``).
* ``python -m tools.bench.failover`` — ``kill -9`` of the instance running tasks, time until
  each client gets its 502.
* ``python -m tools.bench.revocation`` — a key revoked through one instance (or by another
  process), time until the other instance refuses it; a revoked node, time until its 4001.
* ``python -m tools.bench.affinity`` — prefix-affine placement against placement by load,
  side by side: chat conversations on echo nodes that model a KV cache (time to first token,
  prompt tokens the nodes read, the busiest node's share).
* ``python -m tools.bench.rolling_restart`` — every instance restarted in turn (SIGTERM, exit,
  start) under plain and streamed load: failures (none expected), retries, exit and
  reconnect times.

Each starts its own coordinator, node and ``redis-server`` processes on free loopback ports
(``_harness.py``), and kills them on exit (Ctrl-C included). The box they run on is usually
shared and noisy, so the figures that matter are ratios and differences of things measured in
alternating rounds of the same run.

throughput.py      closed-loop request against /healthz (or streamed chunks), side by side
stream.py          throughput --stream under its own name
redis_commands.py  Redis commands (and scripts: round trips) per request
cross_instance.py  the cross-instance hop against a local request, on each bus client
failover.py        how fast a client learns that its task's instance is gone (kill -9)
revocation.py      how fast a revocation reaches the other instance (keys and nodes)
affinity.py        prefix affinity on against off, on nodes modelling a prefix cache
rolling_restart.py a rolling restart under load: nothing lost, nodes back at once
scale.py           the cost of a cluster as its number of nodes grows
scale_fleet.py     thousands of light nodes in one process, for scale.py
channels_probe.py  Django Channels' Redis pub/sub layer doing the same round trip (the peer)
_harness.py        what the benchmarks share: their processes and a private redis-server
_closed_loop.py    closed-loop rounds and the CPU of each process over a round (throughput,
                   cross_instance's CPU rounds)
_throughput_report.py  throughput's figures, ratios and printed report
_cross_latency.py  cross_instance's open loop: the hop's latency beside the raw round trips
_cross_cpu.py      cross_instance's CPU rounds: A+B CPU per remote request against a local one
_probes.py         raw round trips timed for scale beside the hop
_profile.py        sampling profiles of running coordinators with py-spy, split by category
"""
