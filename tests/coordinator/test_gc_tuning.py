"""The coordinator process's garbage collector settings (coordinator/server/gc_tuning.py); their
effect at 10,000 nodes is measured by ``python -m tools.bench.scale`` (docs/design.md "Scale")."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from coordinator.server import gc_tuning


@pytest.fixture
def restored_gc() -> Iterator[None]:
    thresholds, callbacks = gc.get_threshold(), list(gc.callbacks)
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)
    gc.callbacks[:] = callbacks
    gc_tuning.pauses.clear()


def test_tune_raises_the_thresholds_and_times_every_collection(restored_gc: None) -> None:
    seen: list[tuple[int, float]] = []
    gc_tuning.tune()
    gc_tuning.tune()  # idempotent: one callback
    gc_tuning.pauses.append(lambda generation, took: seen.append((generation, took)))
    assert gc.get_threshold() == gc_tuning.THRESHOLDS
    gc.collect(1)
    gc.collect()
    assert [g for g, _ in seen] == [1, 2]
    assert all(0 <= took < 5 for _, took in seen)


def test_freeze_startup_keeps_what_exists_out_of_later_scans(restored_gc: None) -> None:
    before = gc.get_freeze_count()
    gc_tuning.freeze_startup()
    assert gc.get_freeze_count() > before
    frozen = gc.get_freeze_count()
    gc.collect()
    assert gc.get_freeze_count() == frozen  # a full collection leaves them frozen
