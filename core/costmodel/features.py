"""The work measures a model of one implementation is fitted on.

They are the solver's own features, plus, on a parallel backend, the span:
the share of the work that the busiest worker does,

    span = work * ceil(tasks / parallelism) / tasks

since a pool of W workers running T equal tasks waits for ceil(T / W) of
them in a row. On a cluster each of those rounds also pays a scheduler round
trip, so its models have a ``rounds`` feature, ceil(T / W), as well. The
core derives both from the backend's ``parallelism()``, so a plugin declares
only how many tasks it splits into and which feature they share, and never
reads a pool's size.
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


def model_features(spec: SolverSpec, problem: Any, implementation: str,
                   base: Mapping[str, float] | None = None) -> dict[str, float]:
    """The solver's features of ``problem``, with the span on a parallel backend.

    ``base`` passes features already computed for this problem (planning
    computes them once for every implementation).
    """
    features = {name: float(value) for name, value in (base or spec.features(problem)).items()}
    workers = parallelism(implementation) if spec.parallel_tasks is not None else None
    if workers is not None and spec.span_feature is not None:
        tasks = max(1.0, float(spec.parallel_tasks(problem)))
        rounds = math.ceil(tasks / workers)
        features[SPAN] = features[spec.span_feature] * rounds / tasks
        if backend_of(implementation) in PER_ROUND_BACKENDS:
            features[ROUNDS] = float(rounds)
    return features


_names: dict[tuple, tuple[str, ...]] = {}


def feature_names(spec: SolverSpec, implementation: str) -> tuple[str, ...]:
    """The names a model of this implementation uses, in a fixed order (cached: plans ask often)."""
    key = (spec.name, spec.features, implementation)
    if key not in _names:
        _names[key] = tuple(sorted(model_features(spec, spec.default_problem(), implementation)))
    return _names[key]
