"""The work measures a model of one implementation is fitted on.

They are the solver's own features, plus, on a parallel backend, the span:
the share of the work that the busiest worker does,

    span = work * ceil(tasks / parallelism) / tasks

since a pool of W workers running T equal tasks waits for ceil(T / W) of
them in a row. An implementation whose kernels share T items among its
backend's threads (``SolverSpec.thread_items``) gets the same span, with
W the thread pool's size: a batch of 2 spectra on 16 threads costs about
what one spectrum costs, which no feature linear in the batch can say.
On a cluster each round of tasks also pays a scheduler round trip, so its
models have a ``rounds`` feature, ceil(T / W), as well. The core derives
W from the backend's ``parallelism()`` or ``threads()``, so a plugin
declares only how many tasks or items it splits into and which feature they
share, and never reads a pool's size.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from core.registry import get_registry
from core.solver import SolverSpec, backend_of

SPAN = "span"
ROUNDS = "rounds"
# backends whose every task pays a round trip worth a term of its own: a cluster's scheduler and network
# (measured: a few ms per dask task). A local pool's per-task cost is inside its fit's intercept and span.
PER_ROUND_BACKENDS = frozenset({"dask"})


def parallelism(implementation: str) -> int | None:
    """How many tasks the implementation's backend runs at once; None for a serial backend."""
    backend = get_registry().backends.get(backend_of(implementation))
    if backend is None or backend.parallelism is None or backend.map is None:
        return None
    return max(1, int(backend.parallelism()))


def threads(implementation: str) -> int | None:
    """The size of the thread pool the implementation's backend runs its kernels on; None if it has none."""
    backend = get_registry().backends.get(backend_of(implementation))
    if backend is None or backend.threads is None:
        return None
    return max(1, int(backend.threads()))


def model_features(spec: SolverSpec, problem: Any, implementation: str,
                   base: Mapping[str, float] | None = None) -> dict[str, float]:
    """The solver's features of ``problem``, with the implementation's own (``SolverSpec.implementation_features``)
    and the span on a parallel backend or a threaded implementation.

    ``base`` passes features already computed for this problem (planning
    computes them once for every implementation).
    """
    features = {name: float(value) for name, value in (base or spec.features(problem)).items()}
    own = spec.implementation_features.get(implementation)
    if own is not None:  # derived from the (expected or done) features, as the model is given them
        features.update((name, float(value)) for name, value in own(features).items())
    if spec.span_feature is None:
        return features
    workers = parallelism(implementation) if spec.parallel_tasks is not None else None
    if workers is not None:
        tasks = max(1.0, float(spec.parallel_tasks(problem)))
        features[SPAN] = _span(features[spec.span_feature], tasks, workers)
        if backend_of(implementation) in PER_ROUND_BACKENDS:
            features[ROUNDS] = float(math.ceil(tasks / workers))
    items = spec.thread_items.get(implementation)
    pool = threads(implementation) if items is not None else None
    if pool is not None:
        features[SPAN] = _span(features[spec.span_feature], max(1.0, float(items(problem))), pool)
    return features


def _span(work: float, tasks: float, workers: int) -> float:
    """The busiest worker's share of ``work`` split evenly into ``tasks`` run ``workers`` at a time."""
    return work * math.ceil(tasks / workers) / tasks


_names: dict[tuple, tuple[str, ...]] = {}


def feature_names(spec: SolverSpec, implementation: str) -> tuple[str, ...]:
    """The names a model of this implementation uses, in a fixed order (cached: plans ask often)."""
    key = (spec.name, spec.features, implementation)
    if key not in _names:
        _names[key] = tuple(sorted(model_features(spec, spec.default_problem(), implementation)))
    return _names[key]
