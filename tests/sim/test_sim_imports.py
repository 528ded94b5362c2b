"""What a simulator process imports before its first seed: every ``gemmanet sim`` command and
every worker of ``sim sweep`` pays it. pytest (through ``trio.testing``), SQLAlchemy (the store,
for which the simulator has an in-memory stand-in) and httpx (direct hosts, and the monitors'
pollers, which only ``--monitors`` runs use) cost about 0.3 s of CPU between them, as much as a
seed. Checked in a fresh interpreter, where nothing else has been imported."""

from __future__ import annotations

import trio._core._mock_clock
import trio.testing

from sim.trio_hook import mock_clock
from tests.fixtures.fresh_imports import modules_after

NOT_AT_IMPORT = {"pytest", "_pytest", "sqlalchemy", "httpx"}


def test_importing_the_simulator_loads_neither_pytest_sqlalchemy_nor_httpx() -> None:
    modules = modules_after("import sim.world, sim.cli, sim.fairness")
    assert {"sim.world", "coordinator.runtime.instance"} <= modules  # the probe imported them
    loaded = {name.partition(".")[0] for name in modules} & NOT_AT_IMPORT
    assert not loaded, sorted(loaded)


def test_the_simulators_clock_is_trio_testings_mock_clock() -> None:
    # sim/trio_hook.py takes MockClock from trio._core._mock_clock, the module trio.testing
    # re-exports it from (trio.testing's own __init__ imports pytest): if a trio release moves
    # it, this says so.
    assert trio._core._mock_clock.MockClock is trio.testing.MockClock
    clock = mock_clock()
    assert isinstance(clock, trio.testing.MockClock)
    assert clock.autojump_threshold == 0
