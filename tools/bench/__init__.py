"""Benchmarks of the coordinator (they print figures; they are not tests).

* ``python -m tools.bench.throughput`` — closed-loop ``POST /api/v1/request`` against ``GET
  /healthz`` on one instance, side by side.
* ``python -m tools.bench.cross_instance`` — open-loop latency of a request that crosses to
  another instance over the Redis bus against one served locally, side by side, on each Redis
  client of the bus (lean, coredis), with raw round trips for scale (``_probes.py``: pub/sub
  through either client, a bare socket PING, and Django Channels' Redis pub/sub layer in its own
  process, ``channels_probe.py``, when the ``bench`` extra is installed).

Both start their own coordinator, node agent and (for the second) ``redis-server`` processes on
free loopback ports, and kill them on exit (Ctrl-C included). The box they run on is usually
shared and noisy, so the figures that matter are ratios and differences of things measured in
alternating rounds of the same run.
"""
