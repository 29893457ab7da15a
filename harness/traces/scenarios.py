"""Cluster cold paths into k cold-start scenario classes (``harness traces scenarios``).

Features per cold path: one-hot service path signature, one-hot operation (the 50 most common; the
rest share one column), log latency, log input / output tokens, error flag; numeric columns are
standardized. k-means (scikit-learn, seeded) groups them; k is capped by the number of distinct
service paths (with a warning) because classes that differ only by noise make poor templates.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from harness.common.errors import InputError
from harness.common.stats import Distribution
from harness.traces.model import ColdPathRecord, ScenarioClass, ScenarioSet

MAX_OPERATIONS = 50
EXAMPLES = 5


def featurize(paths: Sequence[ColdPathRecord]) -> Any:
    import numpy as np

    signatures = sorted({" > ".join(p.service_path) for p in paths})
    sig_index = {s: i for i, s in enumerate(signatures)}
    ops = [op for op, _ in Counter(p.operation for p in paths).most_common(MAX_OPERATIONS)]
    op_index = {o: i for i, o in enumerate(ops)}
    n_num = 4
    x = np.zeros((len(paths), len(signatures) + len(ops) + 1 + n_num))
    for row, p in enumerate(paths):
        x[row, sig_index[" > ".join(p.service_path)]] = 1.0
        x[row, len(signatures) + op_index.get(p.operation, len(ops))] = 1.0
        base = len(signatures) + len(ops) + 1
        x[row, base] = np.log1p(p.latency_ms)
        x[row, base + 1] = np.log1p(p.input_tokens or 0)
        x[row, base + 2] = np.log1p(p.output_tokens or 0)
        x[row, base + 3] = 1.0 if p.error else 0.0
    num = x[:, -n_num:]
    std = num.std(axis=0)
    std[std == 0] = 1.0
    x[:, -n_num:] = (num - num.mean(axis=0)) / std
    return x


def build_scenarios(
    paths: Sequence[ColdPathRecord],
    *,
    k: int,
    threshold_ms: float,
    sources: Sequence[str] = (),
    seed: int = 0,
) -> tuple[ScenarioSet, list[str]]:
    """The :class:`ScenarioSet` of ``paths`` and the warnings raised while building it."""
    import numpy as np

    if not paths:
        raise InputError(
            "no cold paths to cluster", hint="lower --threshold-ms, or try --hops all / --protocol any"
        )
    warnings: list[str] = []
    distinct = len({tuple(p.service_path) for p in paths})
    k_eff = min(k, distinct, len(paths))
    if k_eff < k:
        warnings.append(
            f"k={k} capped to {k_eff}: only {distinct} distinct service path(s) in {len(paths)} cold paths"
        )
    if k_eff == 1:
        labels = np.zeros(len(paths), dtype=int)
    else:
        from sklearn.cluster import KMeans

        labels = KMeans(n_clusters=k_eff, n_init=10, random_state=seed).fit_predict(featurize(paths))
    groups: dict[int, list[ColdPathRecord]] = {}
    for label, p in zip(labels, paths, strict=True):
        groups.setdefault(int(label), []).append(p)
    ordered = sorted(groups.values(), key=lambda g: (-len(g), g[0].trace_id))
    classes: list[ScenarioClass] = []
    names: Counter[str] = Counter()
    for i, members in enumerate(ordered):
        path_counts = Counter(tuple(p.service_path) for p in members)
        op_counts = Counter(p.operation for p in members)
        top_path = list(path_counts.most_common(1)[0][0])
        top_op = op_counts.most_common(1)[0][0]
        name = f"{top_path[-1]}:{top_op}"
        names[name] += 1
        if names[name] > 1:
            name = f"{name}#{names[name]}"
        inputs = [p.input_tokens for p in members if p.input_tokens is not None]
        outputs = [p.output_tokens for p in members if p.output_tokens is not None]
        tags: dict[str, str] = {}
        models = Counter(p.model for p in members if p.model)
        if models:
            tags["gen_ai.request.model"] = models.most_common(1)[0][0]
        tags["protocol"] = Counter(p.protocol for p in members).most_common(1)[0][0]
        examples = list(dict.fromkeys(p.trace_id for p in members))[:EXAMPLES]
        classes.append(
            ScenarioClass(
                id=i,
                name=name,
                weight=len(members) / len(paths),
                size=len(members),
                service_path=top_path,
                operations={op: n / len(members) for op, n in op_counts.most_common()},
                latency_ms=Distribution.of([p.latency_ms for p in members]),
                input_tokens=Distribution.of(inputs) if inputs else None,
                output_tokens=Distribution.of(outputs) if outputs else None,
                error_rate=sum(p.error for p in members) / len(members),
                examples=examples,
                tags=tags,
            )
        )
    return ScenarioSet(k=k_eff, threshold_ms=threshold_ms, sources=list(sources), classes=classes), warnings
