"""Numba kernel of gradient-descent linear regression: one fused, parallel pass per epoch.

Each pass reads x and y once and accumulates the sums the epoch needs
(sum err^2, sum err*x_j for every feature j, sum err; each term times the
sample's weight when there are weights). One feature without weights runs
the original kernel (three sums kept in registers); any other problem runs
the general one, whose d + 2 sums per block live in a small array. The samples are cut into a fixed
number of blocks, whatever the thread count; every block sums into its own
slot and the slots are added in order, so the answer is the same on 1 or
64 threads (a deterministic two-stage reduction, no shared accumulator).

Two variants of the one kernel: ``numba:threads`` runs each epoch's pass
on every thread that has a block (at most one thread per block);
``numba:serial`` runs it on one thread. Every epoch is a
fork and a join, so a small problem can lose more to the join than the
threads win, and on a loaded machine one descheduled thread holds every
epoch's join for a scheduler tick (a 3,605-sample, 19-epoch run took
0.22 s on two threads, 0.3 ms on numpy, while other work loaded this
2-core VM). The cost model measures both and chooses.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from core.backends.numba_threads import jit, threads_at_most
from plugins.ml.linreg_numpy import outputs
from plugins.ml.linreg_problem import NUMBA_BLOCK as BLOCK
from plugins.ml.linreg_problem import LinRegProblem


@jit(parallel=True)
def _descend(x, y, learning_rate, n_epochs, w0, b0):
    n = x.shape[0]
    n_blocks = (n + BLOCK - 1) // BLOCK
    partial = np.empty((n_blocks, 3))
    losses = np.empty(n_epochs)
    w, b = w0, b0
    for epoch in range(n_epochs):
        for block in prange(n_blocks):
            start = block * BLOCK
            stop = min(start + BLOCK, n)
            sq, ex, e = 0.0, 0.0, 0.0
            for i in range(start, stop):
                err = w * x[i] + b - y[i]
                sq += err * err
                ex += err * x[i]
                e += err
            partial[block, 0] = sq
            partial[block, 1] = ex
            partial[block, 2] = e
        sq, ex, e = 0.0, 0.0, 0.0
        for block in range(n_blocks):
            sq += partial[block, 0]
            ex += partial[block, 1]
            e += partial[block, 2]
        losses[epoch] = sq / n
        w, b = w - learning_rate * 2.0 * ex / n, b - learning_rate * 2.0 * e / n
    return w, b, losses


@jit(parallel=True)
def _descend_general(x, y, weights, total, learning_rate, n_epochs, w0, b0):
    n, d = x.shape
    n_blocks = (n + BLOCK - 1) // BLOCK
    partial = np.empty((n_blocks, d + 2))  # per block: sum s err^2, sum s err x_j (d of them), sum s err
    losses = np.empty(n_epochs)
    w, b = w0.copy(), b0
    for epoch in range(n_epochs):
        for block in prange(n_blocks):
            start = block * BLOCK
            stop = min(start + BLOCK, n)
            sums = np.zeros(d + 2)
            for i in range(start, stop):
                predicted = 0.0
                for j in range(d):
                    predicted += w[j] * x[i, j]
                err = predicted + b - y[i]
                weighted = weights[i] * err
                sums[0] += weighted * err
                for j in range(d):
                    sums[1 + j] += weighted * x[i, j]
                sums[d + 1] += weighted
            partial[block, :] = sums
        sums = np.zeros(d + 2)
        for block in range(n_blocks):
            sums += partial[block, :]
        losses[epoch] = sums[0] / total
        for j in range(d):
            w[j] -= learning_rate * 2.0 * sums[1 + j] / total
        b = b - learning_rate * 2.0 * sums[d + 1] / total
    return w, b, losses


def solve_numba(problem: LinRegProblem, serial: bool = False) -> dict[str, np.ndarray]:
    X, y = problem.data()
    blocks = (len(X) + BLOCK - 1) // BLOCK
    with threads_at_most(1 if serial else blocks):  # a thread without a block would only join every epoch
        if problem.n_features == 1 and not problem.weighted:
            w, b, losses = _descend(X[:, 0], y, problem.learning_rate, problem.n_epochs, float(problem.coef0()[0]),
                                    problem.b0)
        else:  # no weights: every weight 1.0, which multiplies exactly, so the math is the unweighted one
            weights = problem.sample_weight if problem.weighted else np.ones(len(X))
            w, b, losses = _descend_general(X, y, weights, problem.weight_total(), problem.learning_rate,
                                            problem.n_epochs, problem.coef0(), problem.b0)
    return outputs(w, b, losses, problem.n_epochs)
