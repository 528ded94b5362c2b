"""Whether a model can ever fit on the nodes that serve it: a request that cannot is refused at
once (``model_never_fits``) instead of waiting out the admission queue for a lease no node can
grant.

A request for a catalog model needs, on a node with nothing else in use, the model's resident
size plus its per-request KV budget (the lease's memory check: ``coordination/leases.py``). A
node without a memory budget is checked on its parallel budget alone, so it always fits; a
model outside the catalog (or of size 0) fits everywhere. Pure: the ``InstanceMachine`` asks
with the budgets of the nodes serving the model, the shell logs ``budget_problem`` when a node
connects and at start for the configured hosts.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from coordinator.errors import ModelNeverFits

__all__ = [
    "UNLIMITED",
    "budget_of",
    "budget_problem",
    "fits",
    "fits_somewhere",
    "host_budget_problems",
    "largest",
    "never_fits",
    "request_needs",
]

#: the budget of a node without a memory budget
UNLIMITED = math.inf
# Sizes are GB from TOML and hellos: compare with a little slack, as the lease check does.
_EPSILON = 1e-9


def request_needs(models: Mapping[str, tuple[float, float]]) -> dict[str, float]:
    """Model -> GB one request of it needs on an empty node, from the catalog's (resident GB,
    KV GB); models that need nothing are left out."""
    needs = {model: resident + kv for model, (resident, kv) in models.items()}
    return {model: need for model, need in needs.items() if need > 0}


def budget_of(memory_gb: float | None) -> float:
    return UNLIMITED if memory_gb is None else memory_gb


def fits(need_gb: float, memory_gb: float | None) -> bool:
    return budget_of(memory_gb) + _EPSILON >= need_gb


def fits_somewhere(need_gb: float, budgets: Iterable[float | None]) -> bool:
    """Whether one of ``budgets`` holds ``need_gb`` (stops at the first that does)."""
    return any(fits(need_gb, memory_gb) for memory_gb in budgets)


def largest(budgets: Iterable[float | None]) -> float:
    """The largest of ``budgets`` (``UNLIMITED`` for a node without one; -inf for none)."""
    return max((budget_of(memory_gb) for memory_gb in budgets), default=-math.inf)


def never_fits(model: str, need_gb: float, largest_gb: float) -> ModelNeverFits:
    """The refusal of a request for ``model`` when the largest budget among the nodes serving
    it is ``largest_gb`` (smaller than ``need_gb``)."""
    return ModelNeverFits(
        f"model {model!r} needs {need_gb:g} GB (resident size and per-request KV in the model "
        f"catalog) but the largest memory budget among the nodes serving it is "
        f"{largest_gb:g} GB: no request for it can ever be placed"
    )


def budget_problem(
    who: str, memory_gb: float | None, models: Iterable[str], needs: Mapping[str, float]
) -> str | None:
    """The warning for ``who`` (``node box-1``, ``host box-c``) whose memory budget can never
    hold one of ``models`` (those it serves, or might), or None."""
    too_big = sorted(m for m in set(models) if m in needs and not fits(needs[m], memory_gb))
    if not too_big or memory_gb is None:
        return None
    listed = ", ".join(f"{m} ({needs[m]:g} GB)" for m in too_big)
    return (
        f"{who}: its memory budget of {memory_gb:g} GB can never hold {listed}; a request for "
        "a model that no serving node can hold is refused with model_never_fits (raise the "
        "budget with --vram-gb or the operator file's vram_gb / memory_gb, or fix the catalog)"
    )


def host_budget_problems(
    hosts: Mapping[str, float | None], needs: Mapping[str, float]
) -> list[str]:
    """At start: configured direct hosts whose budget is too small for a catalog model (which
    models a host serves is known only from the monitor's facts, so every catalog model)."""
    problems = (budget_problem(f"host {h}", gb, needs, needs) for h, gb in sorted(hosts.items()))
    return [problem for problem in problems if problem is not None]
