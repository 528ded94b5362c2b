"""Shared pytest configuration. Fixtures live in tests/fixtures/, one module per concern."""

import logging
from collections.abc import Iterator

import pytest

from protocol.log_lines import is_root_handler

pytest_plugins = [
    "tests.fixtures.redis_server",
    "tests.fixtures.redis_cluster",
    "tests.fixtures.redis_sentinel",
    "tests.fixtures.coordination_backend",
    "tests.fixtures.trio_portal",
    "tests.fixtures.processes",
    "tests.fixtures.databases",
    "tests.fixtures.fake_servers",
]

#: The longest tests (CPU-bound sweeps, the load test smoke, ...), longest first. On several
#: workers (tools/run-tests.sh: pytest-xdist, ``--dist load`` hands out the first tests one per
#: worker) they then start at once and overlap the many short ones instead of running last.
LONGEST_FIRST = (
    "tests/e2e/test_loadtest_smoke.py",
    "tests/sim/test_simulator.py::test_a_sweep_of_40_seeds_is_green",
    "tests/e2e/test_rolling_restart.py",
    "tests/sim/test_simulator.py::test_a_sweep_with_stretched_heartbeats",
    "tests/e2e/test_audit.py",
    "tests/e2e/test_system_health_page.py",
    "tests/e2e/test_host_gate.py",
    "tests/sim/test_simulator.py::test_a_sweep_of_100_seeds_with_monitors",
    "tests/e2e/test_schemathesis.py",
    "tests/coordinator/test_lease_model.py",
    "tests/e2e/test_monitor_takeover.py",
    "tests/coordinator/test_bench_smoke.py",
    "tests/e2e/test_cli.py::test_every_subcommand_help_runs",
    "tests/sim/test_simulator.py::test_broken_variants_are_caught",
)


@pytest.fixture(autouse=True)
def _root_logging_restored() -> Iterator[None]:
    """Tests that run a command's ``main()`` in process install its log handler on the stderr
    pytest captured for them; left in place, every later record in that worker is a "Logging
    error" traceback (the stream is closed). The root logger is put back after each test."""
    root = logging.getLogger()
    before, level = set(root.handlers), root.level
    yield
    # Only ours: pytest adds and removes its own capture handlers around every phase.
    for handler in list(root.handlers):
        if handler not in before and is_root_handler(handler):
            root.removeHandler(handler)
    root.setLevel(level)


def pytest_collection_modifyitems(items: list) -> None:  # type: ignore[type-arg]
    def rank(item) -> int:  # type: ignore[no-untyped-def]
        for index, prefix in enumerate(LONGEST_FIRST):
            if item.nodeid.startswith(prefix):
                return index
        return len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: the rest keep their order
