"""Pooled percentiles: one percentile of every inter-token gap of every request, and an interval that
resamples whole requests.

The gaps of one request are not independent draws: one slow engine step delays every token of every
request in it. So the interval is a percentile bootstrap over requests
(:func:`cluster_percentile_interval`), never over gaps, which would claim a precision the run does
not have.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from harness.gates.runs import FloatArray

POOLED_MIN_REQUESTS = 20
"""Fewer requests than this and a bootstrap over requests understates how wide the interval is."""
CLUSTER_RESAMPLES = 1000
"""Replicates of :func:`cluster_percentile_interval` (its ends move by well under a percent between seeds)."""


def cluster_percentile_interval(
    groups: Sequence[FloatArray],
    q: float,
    confidence: float,
    *,
    resamples: int = CLUSTER_RESAMPLES,
    seed: int = 0,
) -> tuple[float, float]:
    """A percentile-bootstrap interval of the nearest-rank ``q``-th percentile of every value of every
    group pooled, resampling whole groups (requests) with replacement: ``resamples`` replicates, each
    the percentile of the pooled values of as many groups drawn as there are, weighted by how often each
    was drawn. Seeded, so a run's interval is the same every time it is judged.

    Vectorised: the values are sorted once with their group, a replicate's draw counts become weights,
    and the weighted nearest rank is found on the cumulative weights (chunks of replicates keep memory
    at a few MB)."""
    sizes = np.asarray([len(g) for g in groups], dtype=np.int64)
    if sizes.sum() == 0:
        return (math.nan, math.nan)
    values = np.concatenate([np.asarray(g, dtype=np.float64) for g in groups if len(g)])
    owner = np.repeat(np.arange(sizes.size), sizes)
    order = np.argsort(values, kind="stable")
    ranked, owned = values[order], owner[order]
    rng = np.random.default_rng(seed)
    n = sizes.size
    reps: list[FloatArray] = []
    chunk = max(1, 2_000_000 // max(1, ranked.size))
    done = 0
    while done < resamples:
        b = min(chunk, resamples - done)
        counts = rng.multinomial(n, np.full(n, 1.0 / n), size=b)  # draws of each request, per replicate
        cum = np.cumsum(counts[:, owned], axis=1)
        total = cum[:, -1]
        rank = np.maximum(1, np.ceil(q / 100.0 * total - 1e-9))  # nearest rank, 1-based
        reps.append(ranked[np.argmax(cum >= rank[:, None], axis=1)])
        done += b
    draws = np.concatenate(reps)
    alpha = 1.0 - confidence
    return (
        float(np.quantile(draws, alpha / 2, method="inverted_cdf")),
        float(np.quantile(draws, 1.0 - alpha / 2, method="inverted_cdf")),
    )
