"""Where a request's candidate nodes come from: this instance's nodes and its peers' (``views``),
the direct hosts fresh at a given time (``host_views``), and, when many nodes serve a model, a
random sample of them (``sample``: placement among thousands without looking at each), joined
by the nodes a request's prefix prediction names (``named``). Pure;
the ``Requester`` asks it, the ``InstanceMachine`` provides the sources."""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Iterable

from coordinator.core.placement.affinity import PrefixPrediction, rank_by_affinity
from coordinator.core.placement.choose import SAMPLE_SIZE, NodeView, needs_full_scan

#: how many candidates one attempt at a lease tries, best first
MAX_CANDIDATES = 8


class Candidates:
    def __init__(
        self,
        views: Callable[[], list[NodeView]],
        *,
        rng: random.Random,
        host_views: Callable[[float], list[NodeView]] | None = None,
        serves: Callable[[str], bool] | None = None,
        sample: Callable[[str, int, random.Random], list[NodeView] | None] | None = None,
        named: Callable[[Iterable[str]], list[NodeView]] | None = None,
    ) -> None:
        self._views = views
        # Direct model hosts: candidates only while their facts are fresh, so at a given time.
        self._host_views = host_views
        # Whether any node serves a model, without building every view (one check per request;
        # without it, the views are scanned).
        self._serves = serves
        # A random sample of the nodes serving a model, when many do (None: rank them all).
        self._sample = sample
        # The nodes of the given ids (a sample joined by those a prefix prediction names).
        self._named = named
        self._rng = rng

    def any_serves(self, model: str, now: float | None) -> bool:
        """Whether a node (or, given ``now``, a direct host) serves ``model``."""
        if self._serves is None:
            return any(model in v.models for v in self._all(now))
        if self._serves(model):
            return True
        return any(model in v.models for v in self._hosts(now))

    def ranked(
        self,
        model: str,
        *,
        gone_conns: Collection[str],
        gone_instances: Collection[str],
        full: Collection[str],
        now: float | None,
        prediction: PrefixPrediction | None = None,
    ) -> list[NodeView]:
        """The first ``MAX_CANDIDATES`` to try for ``model``, best first (by load, or with
        ``prediction`` by load against predicted prefix, ``core/placement/affinity.py``): from a
        sample when many nodes serve it and the sample has a free one, else from all of them.
        Connections in ``full`` come last; those gone (or on instances gone) for this request
        not at all."""
        serving = None
        if self._sample is not None:
            sample = self._sample(model, SAMPLE_SIZE, self._rng)
            if sample is not None:
                sample += [v for v in self._hosts(now) if model in v.models]
                sample += self._predicted(model, sample, prediction)
                serving = _without(sample, gone_conns, gone_instances)
        if serving is None or needs_full_scan(serving, full):
            serving = self.serving(
                model, gone_conns=gone_conns, gone_instances=gone_instances, now=now
            )
        return rank_by_affinity(serving, prediction, rng=self._rng, last=full, limit=MAX_CANDIDATES)

    def _predicted(
        self, model: str, sample: list[NodeView], prediction: PrefixPrediction | None
    ) -> list[NodeView]:
        """The nodes ``prediction`` names that serve ``model`` and the sample missed."""
        if prediction is None or not prediction.held or self._named is None:
            return []
        drawn = {v.node_id for v in sample}
        missed = [n for n in prediction.held if n not in drawn]
        return [v for v in self._named(missed) if model in v.models]

    def serving(
        self,
        model: str,
        *,
        gone_conns: Collection[str],
        gone_instances: Collection[str],
        now: float | None,
    ) -> list[NodeView]:
        """Every node serving ``model`` that is not gone for the request."""
        views = [v for v in self._all(now) if model in v.models]
        return _without(views, gone_conns, gone_instances)

    def _hosts(self, now: float | None) -> list[NodeView]:
        return self._host_views(now) if now is not None and self._host_views is not None else []

    def _all(self, now: float | None) -> list[NodeView]:
        return self._views() + self._hosts(now)


def _without(
    views: list[NodeView], gone_conns: Collection[str], gone_instances: Collection[str]
) -> list[NodeView]:
    return [v for v in views if v.conn_id not in gone_conns and v.instance_id not in gone_instances]
