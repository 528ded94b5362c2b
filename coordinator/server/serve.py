"""Running the app on Hypercorn's trio worker (``gemmanet serve``).

The instance starts before the HTTP server, so a refusal to start (the single-instance lock is
held, Redis is unreachable) ends the command with one line instead of a lifespan traceback."""

from __future__ import annotations

import logging
import signal
from functools import partial

import trio
from hypercorn.config import Config
from hypercorn.trio import serve as hypercorn_serve

from coordinator.app import create_app, run_instance
from coordinator.core.liveness import FAILOVER_PROMISE_S, store_outage_problem
from coordinator.core.placement.fit import host_budget_problems, request_needs
from coordinator.errors import SettingsError, StartupRefused, StoreError
from coordinator.monitor.timing import check_monitor_bound
from coordinator.runtime.instance import Instance
from coordinator.runtime.log_context import bind_log_ids
from coordinator.server import gc_tuning, heap_trim
from coordinator.server.listen import check_port_free
from coordinator.settings import Settings
from protocol import MAX_FRAME_BYTES

#: after the drain, how long open HTTP connections get before Hypercorn closes them
HTTP_CLOSE_S = 1.0


def hypercorn_config(host: str, port: int) -> Config:
    config = Config()
    config.bind = [f"{host}:{port}"]
    config.websocket_max_message_size = MAX_FRAME_BYTES
    # What Hypercorn waits for once the drain (runtime/drain.py) is done: by then every task
    # request has ended, so this only bounds idle keep-alive connections (measured: Hypercorn
    # 0.18 left a client's idle one open until this ran out, 5 s, on every restart) and a
    # client slow to read its last bytes.
    config.graceful_timeout = HTTP_CLOSE_S
    # One access line per request only at debug level (-v): at INFO it would cost every
    # request a formatted line. Either way it goes through the root handler's format.
    debug = logging.getLogger().isEnabledFor(logging.DEBUG)
    config.accesslog = logging.getLogger("hypercorn.access") if debug else None
    # Hypercorn's own logger, handled by the root logger the CLI configures (a "-" target would
    # add a second handler and print every line twice).
    config.errorlog = logging.getLogger("hypercorn.error")
    return config


def _first(group: BaseExceptionGroup[BaseException]) -> BaseException:
    inner = group.exceptions[0]
    return _first(inner) if isinstance(inner, BaseExceptionGroup) else inner


def check_failover_bound(settings: Settings) -> None:
    """Refuse liveness settings that cannot keep the 3 s failover promise, in one line."""
    timing = settings.liveness_timing()
    problems = timing.problems()
    if timing.failover_bound_s > FAILOVER_PROMISE_S + 1e-9:
        problems.insert(
            0,
            f"failover bound {timing.bound_sum()} exceeds the promised "
            f"{FAILOVER_PROMISE_S:g} s (GEMMANET_ALIVE_TTL_S, GEMMANET_SWEEP_S)",
        )
    if problems:
        raise SettingsError("liveness settings refused: " + "; ".join(problems))


def check_store_outage_bound(settings: Settings) -> None:
    """Say in one line, at start, when the store outage bound (docs/redis.md "Redis failures") does
    not fit in a request's own budget: such requests fail sooner on a silent store. Not a
    refusal: a short queue timeout is a choice (fail fast rather than wait)."""
    budget = min(settings.queue_timeout_s, settings.task_timeout_s)
    problem = store_outage_problem(settings.store_outage_s, budget)
    if problem is not None and settings.redis_url:
        logging.getLogger("gemmanet.serve").warning("%s", problem)


def warn_hosts_too_small(settings: Settings) -> None:
    """Say at start which configured direct hosts could never hold a catalog model (a request
    for a model no serving node can hold is refused with model_never_fits)."""
    capacity = settings.capacity
    needs = request_needs({m: (c.resident_gb, c.kv_gb) for m, c in capacity.models.items()})
    budgets = {host_id: spec.memory_gb for host_id, spec in capacity.hosts.items()}
    for problem in host_budget_problems(budgets, needs):
        logging.getLogger("gemmanet.serve").warning("%s", problem)


def serve(settings: Settings, *, host: str, port: int) -> int:
    check_failover_bound(settings)
    check_monitor_bound(settings)
    check_store_outage_bound(settings)
    warn_hosts_too_small(settings)
    check_port_free(host, port)
    gc_tuning.tune()  # thousands of connections: see coordinator/server/gc_tuning.py
    heap_trim.one_arena()  # before any thread starts: see coordinator/server/heap_trim.py
    app = create_app(settings)
    config = hypercorn_config(host, port)

    async def main() -> None:
        # Every task of this process inherits it: Hypercorn's, the requests', the instance's.
        bind_log_ids(instance_id=settings.instance_id)
        shutdown = trio.Event()
        watching = trio.CancelScope()

        async def watch_signals(instance: Instance, nursery: trio.Nursery) -> None:
            # SIGTERM drains (docs/operations.md); SIGINT, or a second signal, stops at once
            # (what is still in flight ends with the shutdown error, never a silent cut).
            with watching, trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for signum in signals:
                    if instance.drain.started or signum == signal.SIGINT:
                        instance.drain.hurry()
                    else:
                        instance.drain.begin()
                    if not draining.is_set():
                        draining.set()
                        nursery.start_soon(drain_then_stop, instance)

        draining = trio.Event()

        async def drain_then_stop(instance: Instance) -> None:
            # Hypercorn serves on while draining: /readyz says 503, new requests are refused
            # with 503 instance_draining, the streams in flight run on.
            await instance.drain.run()
            shutdown.set()

        stop = trio.Event()
        trimming = trio.CancelScope()

        async def trim_heap() -> None:
            with trimming:
                await heap_trim.run()

        async with trio.open_nursery() as nursery:
            instance = await nursery.start(partial(run_instance, settings, stop=stop))
            app.config["GEMMANET_INSTANCE"] = instance
            # What start-up built is frozen out of the collector's scans from now on.
            gc_tuning.pauses.append(instance.metrics.gc_pause)
            gc_tuning.freeze_startup()
            nursery.start_soon(watch_signals, instance, nursery)
            # Free memory of the C heaps goes back to the OS (coordinator/server/heap_trim.py).
            nursery.start_soon(trim_heap)
            try:
                await hypercorn_serve(app, config, shutdown_trigger=shutdown.wait)
            except* OSError as group:
                # Hypercorn handles OSErrors of connections itself; one escaping is its bind.
                reason = _first(group)
                reason = getattr(reason, "strerror", None) or reason
                raise StartupRefused(f"cannot listen on {host}:{port}: {reason}") from None
            # A graceful stop: the instance leaves and releases its lock, within a bound.
            logging.getLogger("gemmanet.serve").info("HTTP server stopped; leaving the cluster")
            watching.cancel()
            trimming.cancel()
            stop.set()
            nursery.cancel_scope.deadline = trio.current_time() + 6

    # The reason the instance refused to start (a held lock, Redis or the database out of
    # reach) arrives wrapped in the exception groups of the task tree.
    refusal: str | None = None
    bad_setting: str | None = None
    try:
        trio.run(main)
    except* SettingsError as group:
        bad_setting = str(_first(group))
    except* StartupRefused as group:
        refusal = str(_first(group))
    except* StoreError as group:
        refusal = refusal or f"database: {_first(group)}"
    if bad_setting is not None:
        raise SettingsError(bad_setting)
    if refusal is not None:
        raise StartupRefused(refusal)
    return 0
