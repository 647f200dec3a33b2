"""Estimated times between measured shapes, for definitions whose spec asks for them (`Spec.estimate`).

A variant's time is smooth in the logs of the shape's sizes (tokens, sequences, the longest one), but
the coverage measures a few dozen shapes over a box of 2^15 x 2^8 x 2^15: the region tree's
thresholds, placed between measured neighbours, then fall far from where two kernels cross over.
Here each variant's log time at a query shape is a local-linear regression over its measured
workloads: least squares of log t = a + b . (log x - log q), each workload weighted by
exp(-|log x - log q|^2 / (2 h^2)); the estimate is a. Local-linear rather than a weighted mean, so that
a trend continues to the edge of the measured range instead of flattening towards the inside.

No estimate (NaN) where the variant failed or was not timed on a workload that weighs more than
`FAILED_NEAR` at the query (it is not trusted near a failure), where no measured workload weighs in,
or at a query shape its `supports` declines. A workload it declines is neither data nor a failure:
outside its domain, it says nothing of its times inside (the context-parallel prefill declines more
than 16 (sequence, head) pairs, and those batches withdrew its estimates from every one-prompt shape
near them: the hinted router sent 1 x 2,048 tokens at 8 value heads to FlashInfer, 66.0 us against
CP's 52.4, measured there; H200, 2026-12-01).
"""
from __future__ import annotations

import numpy as np

# a failed workload this near the query (its weight, 1 at the query itself) withdraws the variant
FAILED_NEAR = 0.3
RIDGE = 1e-3  # keeps the local fit solvable where the neighbours lie on a line


def log_times(X: np.ndarray, lat: np.ndarray, Q: np.ndarray, bandwidth: float, declined: np.ndarray | None = None,
              declines_query: np.ndarray | None = None) -> np.ndarray:
    """Estimated log latency [variants, queries] at the shapes Q [queries, features] from measured
    latencies lat [variants, workloads] (NaN: failed or not timed) at the shapes X [workloads,
    features]; X and Q are the logs of the features. `declined` [variants, workloads] and
    `declines_query` [variants, queries]: the shapes each variant's `supports` declines (none where
    not given)."""
    d2 = ((X[None, :, :] - Q[:, None, :]) ** 2).sum(axis=2)  # queries x workloads
    w = np.exp(-d2 / (2.0 * bandwidth ** 2))
    out = np.full((lat.shape[0], len(Q)), np.nan)
    eye = RIDGE * np.eye(X.shape[1] + 1)
    for j, row in enumerate(lat):
        timed = np.isfinite(row) & (row > 0)
        failed = ~timed if declined is None else ~timed & ~declined[j]
        near_failure = (w[:, failed] > FAILED_NEAR).any(axis=1)
        if declines_query is not None:
            near_failure = near_failure | declines_query[j]
        ww, y = w[:, timed], np.log(row[timed])
        if not y.size:
            continue
        # design [1, x - q] per query: queries x workloads x (features + 1)
        A = np.concatenate([np.ones((len(Q), y.size, 1)), X[timed][None, :, :] - Q[:, None, :]], axis=2)
        AtW = A.transpose(0, 2, 1) * ww[:, None, :]
        beta = np.linalg.solve(AtW @ A + eye, (AtW @ y)[..., None])[..., 0]
        out[j] = np.where(near_failure | (ww.sum(axis=1) < 1e-6), np.nan, beta[:, 0])
    return out
