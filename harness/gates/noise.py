"""How often would an identical rerun be judged pass, fail or cannot-judge? A bootstrap estimate.

Each replicate draws every result set's records with replacement (as many as the run had, or ``n``)
and judges the replicate against the baseline with the same rule as ``harness gate``. The share of
replicates that fail is the gate's *false-alarm rate* on reruns of an unchanged system, the share that
are inconclusive its *cannot-judge rate*. ``harness baseline noise`` prints both per gate; bench/gates.py
uses the same function on synthetic and recorded runs for the numbers in docs/gates.md.

Caveat: a bootstrap treats the run's requests as independent draws from one distribution. Real runs
have slow drifts (a warming cache, a noisy neighbour) that it does not see, so the real rate can be
higher; and it cannot invent a tail the run never saw, so for a P99 of a few hundred samples it is
optimistic. Compare repeated real runs when you can (docs/gates.md).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from harness.common.errors import InputError
from harness.gates.baseline import Baseline
from harness.gates.judge import GateReport, judge
from harness.gates.runs import ResultSet


@dataclass
class NoiseEstimate:
    """Verdict counts over ``reps`` bootstrap replicates."""

    reps: int
    overall: Counter[str] = field(default_factory=Counter)
    """``pass`` / ``fail`` / ``unjudgeable`` of the whole gate run."""
    per_gate: dict[str, Counter[str]] = field(default_factory=dict)
    """``gate id@label`` → ``pass`` / ``fail`` / ``inconclusive`` / ``unjudgeable`` counts."""

    def add(self, report: GateReport) -> None:
        self.overall[report.verdict] += 1
        for g in report.gates:
            self.per_gate.setdefault(f"{g.id}@{g.label}" if g.label else g.id, Counter())[g.verdict] += 1

    def rate(self, verdict: str, gate: str | None = None) -> float:
        """Share of replicates with ``verdict`` (overall, or for one ``id@label``)."""
        counts = self.overall if gate is None else self.per_gate.get(gate, Counter())
        return counts[verdict] / self.reps if self.reps else float("nan")


def rerun_verdicts(
    baseline: Baseline,
    result_sets: Sequence[ResultSet],
    *,
    reps: int = 200,
    seed: int = 0,
    n: int | None = None,
) -> NoiseEstimate:
    """Judge ``reps`` bootstrap replicates of ``result_sets`` against ``baseline``.

    Raises :class:`InputError` for a run that cannot be judged itself (its problems would make every
    replicate unjudgeable and say nothing about noise).
    """
    for rs in result_sets:
        if rs.problems:
            raise InputError(f"cannot estimate noise from this run: {'; '.join(rs.problems)}", file=rs.path)
        if rs.frame.n == 0:
            raise InputError("cannot estimate noise from a run without records", file=rs.path)
    rng = np.random.default_rng(seed)
    est = NoiseEstimate(reps=reps)
    for _ in range(reps):
        replicate = [replace(rs, frame=rs.frame.sample(rng, n or rs.frame.n)) for rs in result_sets]
        est.add(judge(baseline, replicate))
    return est
