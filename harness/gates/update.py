"""Writing a baseline from runs: what ``harness baseline update`` (one run) and calibration (several,
:mod:`harness.gates.calibration`) consider, and the margins that keep an identical rerun passing.

:func:`candidates` measures every gateable metric of each result set; :func:`rerun_margin` says how
far an identical rerun may land; :func:`baseline_from_results` turns one run into a baseline.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache

import numpy as np

from harness import __version__
from harness.common.errors import ConfigError, InputError
from harness.common.stats import percentile
from harness.common.units import fraction
from harness.gates.baseline import (
    BASELINE_SCHEMA_VERSION,
    Baseline,
    Gate,
    Provenance,
    ResultProvenance,
    _round,
)
from harness.gates.fingerprints import fingerprint_from_results
from harness.gates.measurement import (
    REFERENCE_LABEL,
    Measurement,
    MetricContext,
    client_lateness,
    min_samples_for_bound,
    rate_interval,
    relative_confidence,
)
from harness.gates.metrics import METRICS, Metric, format_value
from harness.gates.policy import GatePolicy, Measured
from harness.gates.runs import FloatArray, ResultSet, RunFrame

UPDATE_METRICS: tuple[str, ...] = (
    "ttft_p50",
    "ttft_p95",
    "ttft_p99",
    "tpot_p50",
    "tpot_p95",
    "itl_p95",
    "e2e_p95",
    "lateness_p99",
    "error_rate",
    "prefill_kv_bytes_per_token_p95",
    "prefill_kv_bytes_p95",
    "prefill_peak_bytes_max",
    "hit_rate_any",
    "hit_rate_l1",
    "hit_rate_l2",
    "hit_rate_l3",
    "hit_rate_prefix",
    "session_makespan_p95",
    "session_success_rate",
)
"""What ``harness baseline update`` writes for every result set (those with data: the session
metrics only for runs of agent sessions), plus
``cold_start_p99`` for a set labelled ``cold`` and ``warm_rate`` for one labelled ``warm``. The
medians are there because they are gateable from a small run (20 samples at 95 %, where a P95 needs
230): a short CI job still gets a decode-latency gate that catches a slower typical request."""
PER_SCENARIO_METRICS: tuple[str, ...] = ("ttft_p95", "tpot_p95", "e2e_p95")
RELATIVE_METRICS: tuple[str, ...] = ("ttft_p95_rel", "tpot_p95_rel", "e2e_p95_rel")
"""Written for every result set but the reference when a set labelled ``reference`` is given."""

RERUN_RISK = 0.002
"""The chance, per gate, that ``harness baseline update`` accepts of an identical rerun not passing
(the margin of :func:`rerun_margin`); measured on reruns in docs/gates.md."""

Key = tuple[str, str | None]


def parse_headroom(text: str) -> float:
    """``"10%"`` or ``"0.1"`` → 0.1."""
    try:
        value = float(fraction(text))
    except (TypeError, ValueError):
        raise ConfigError(f"headroom {text!r} is not a fraction or a percentage like 10%") from None
    if not 0.0 <= value < 1.0:
        raise ConfigError(f"headroom {text!r} must be at least 0 % and below 100 %")
    return value


def _provenance(rs: ResultSet) -> ResultProvenance:
    s = rs.summary
    return ResultProvenance(
        label=rs.label,
        path=str(rs.path),
        requests=rs.frame.n,
        started_at=s.started_at if s else None,
        target=s.target.url if s else None,
        model=s.target.model if s else None,
        corpus_sha256=s.corpus.sha256 if s and s.corpus else None,
        schedule_sha256=s.schedule.sha256 if s and s.schedule else None,
    )


def _up_levels(n: int, q: float, confidence: float, risk: float) -> tuple[float, float] | None:
    """Quantile levels ``(low, high)``: this run's nearest-rank value at its lower ``risk/2`` level and a
    rerun's upper interval end at its upper ``risk/2`` level; ``None`` when the latter lies at or
    beyond the largest of ``n`` samples (the run cannot say how far a rerun's bound may reach)."""
    from scipy.stats import beta, binom

    alpha = 1.0 - confidence
    p = q / 100.0
    u = int(binom.ppf(1 - alpha / 2, n, p)) + 1  # 1-based rank of a rerun's upper bound
    k = max(1, math.ceil(p * n - 1e-9))  # 1-based rank of the nearest-rank value
    if u > n:
        return None
    level_hi = float(beta.ppf(1 - risk / 2, u, n + 1 - u))
    level_lo = float(beta.ppf(risk / 2, k, n + 1 - k))
    if math.ceil(level_hi * n - 1e-9) >= n:  # the sample's maximum: no evidence how far beyond
        return None
    return level_lo, level_hi


def _down_levels(n: int, q: float, confidence: float, risk: float) -> tuple[float, float] | None:
    """The mirror of :func:`_up_levels`: a rerun's lower interval end at its lower ``risk/2`` level and
    this run's value at its upper one; ``None`` when the former reaches the smallest sample."""
    from scipy.stats import beta, binom

    alpha = 1.0 - confidence
    p = q / 100.0
    low = int(binom.ppf(alpha / 2, n, p))  # 1-based rank of a rerun's lower bound
    k = max(1, math.ceil(p * n - 1e-9))
    if low < 1:
        return None
    level_lo = float(beta.ppf(risk / 2, low, n + 1 - low))
    level_hi = float(beta.ppf(1 - risk / 2, k, n + 1 - k))
    if math.ceil(level_lo * n - 1e-9) <= 1:
        return None
    return level_lo, level_hi


@lru_cache(maxsize=256)
def rerun_min_samples(q: float, confidence: float, risk: float = RERUN_RISK) -> int:
    """The fewest samples from which :func:`rerun_margin` can bound a ``q``-th percentile gate (so
    ``harness baseline update`` writes one): computed, the smallest ``n`` whose rerun bound lies
    below the largest sample (P95 at 95 %: 230, P99: 1,164 at the default risk)."""
    n = min_samples_for_bound(q, confidence)
    while _up_levels(n, q, confidence, risk) is None:
        n += 1
    return n


def _percentile_margin(values: FloatArray, q: float, confidence: float, risk: float, *, up: bool) -> float:
    n = int(values.size)
    if n == 0:
        return math.nan
    levels = (_up_levels if up else _down_levels)(n, q, confidence, risk)
    if levels is None:
        return math.inf
    level_lo, level_hi = levels
    return percentile(values, 100 * level_hi) - percentile(values, 100 * level_lo)


def _rerun_jitter(frame: RunFrame, p: float, risk: float) -> float:
    """How far a rerun's client jitter at quantile ``p`` (0–1) may reach, at ``risk / 2``."""
    from scipy.stats import binom

    own = np.sort(client_lateness(frame))
    if own.size == 0:
        return 0.0
    rank = min(int(own.size), int(binom.ppf(1 - risk / 2, own.size, p)) + 1)
    return float(own[rank - 1])


def rerun_margin(
    metric: Metric,
    frame: RunFrame,
    *,
    confidence: float,
    risk: float = RERUN_RISK,
    reference: RunFrame | None = None,
) -> float:
    """The tolerance a gate written from this run needs so that an identical rerun passes it.

    A rerun passes an ``at_most`` gate when its interval's upper end is within ``threshold +
    tolerance``, the threshold being this run's value. Two things push the rerun's upper end up: its
    interval's width, and this run's own luck (its value may sit below the truth). Taking the run's
    samples as the truth (plug-in), each is bounded at ``risk / 2``:

    - percentiles: the rerun's upper end is the order statistic ``x₍ᵤ₎`` (the rank
      :func:`~harness.common.stats.percentile_interval` uses), whose quantile level is
      ``Beta(u, n + 1 − u)``; this run's value is ``x₍ₖ₎`` at level ``Beta(k, n + 1 − k)``. The margin is
      the sample's percentile at the first's upper ``risk/2`` level minus that at the second's lower one.
      ``inf`` when that level lies beyond the largest sample (a P99 of a few hundred samples): the run
      cannot say how far a rerun's bound may reach;
    - rates: the truth may be as far off as this run's exact interval at ``1 − risk`` allows, and the
      rerun's count off that truth by its binomial ``risk/2`` quantile; the margin is the distance from
      this run's rate to the rerun's Clopper–Pearson bound at that count;
    - ratios (``*_rel``, with ``reference``): the phase's percentile margin upward and the reference's
      downward (the mirror rule), each at ``√confidence`` and ``risk / 2``; the margin is how far the
      ratio moves when both move that far;
    - maxima: 0 (a maximum has no interval; the relative headroom covers it).

    A client-timed percentile's interval is also widened by the client's own lateness at the same
    quantile (:func:`~harness.gates.measurement.client_jitter`). A rerun's jitter is bounded the same way
    (plug-in: the order statistic of this run's own lateness that a rerun's quantile exceeds with
    probability ``risk / 2``, at most its largest) and added to the margin, so a baseline made on a
    jittery client says how coarse it is.

    So a rerun of an unchanged system fails to pass with probability about ``risk`` per gate.
    """
    from scipy.stats import binom

    if metric.kind == "percentile" and metric.samples is not None and metric.q is not None:
        values, _ = metric.samples(frame)
        margin = _percentile_margin(values, metric.q, confidence, risk, up=True)
        jitter = _rerun_jitter(frame, metric.q / 100.0, risk) if metric.client_timed else 0.0
        return margin + jitter
    if metric.kind == "relative" and metric.samples is not None and metric.q is not None:
        if reference is None:
            return math.nan
        values, _ = metric.samples(frame)
        ref, _ = metric.samples(reference)
        if values.size == 0 or ref.size == 0:
            return math.nan
        c = relative_confidence(confidence)
        up = _percentile_margin(values, metric.q, c, risk / 2, up=True)
        down = _percentile_margin(ref, metric.q, c, risk / 2, up=False)
        p_phase, p_ref = percentile(values, metric.q), percentile(ref, metric.q)
        if not (math.isfinite(up) and math.isfinite(down)) or p_ref - down <= 0:
            return math.inf
        return (p_phase + up) / (p_ref - down) - p_phase / p_ref
    if metric.kind == "rate" and metric.counts is not None:
        k_obs, n = metric.counts(frame)
        if n == 0:
            return math.nan
        rate = k_obs / n
        # The truth as far off as the exact interval allows at 1 − risk (not the plug-in rate: a run
        # that saw 0 errors in 300 does not show an error rate of 0).
        truth_lo, truth_hi = rate_interval(k_obs, n, 1 - risk)
        if metric.direction == "at_least":
            k_rerun = int(binom.ppf(risk / 2, n, truth_lo))
            return rate - rate_interval(k_rerun, n, confidence)[0]
        k_rerun = int(binom.ppf(1 - risk / 2, n, truth_hi))
        return rate_interval(k_rerun, n, confidence)[1] - rate
    return 0.0


def needs_text(metric: Metric, confidence: float) -> str:
    """How many samples a gate on ``metric`` written from one run needs (``P99 needs ≥ 1222 samples``);
    empty for metrics with no such bound."""
    if metric.q is None or metric.kind not in ("percentile", "relative"):
        return ""
    if metric.kind == "relative":
        c = relative_confidence(confidence)
        return (
            f"P{metric.q:g} ratio needs ≥ {rerun_min_samples(metric.q, c, RERUN_RISK / 2)} samples in the "
            f"phase and ≥ {_rerun_min_samples_down(metric.q, c, RERUN_RISK / 2)} in the reference"
        )
    return f"P{metric.q:g} needs ≥ {rerun_min_samples(metric.q, confidence)} samples"


@lru_cache(maxsize=64)
def _rerun_min_samples_down(q: float, confidence: float, risk: float) -> int:
    n = min_samples_for_bound(q, confidence)
    while _down_levels(n, q, confidence, risk) is None:
        n += 1
    return n


def _gate_from(
    metric: Metric,
    m: Measurement,
    margin: float,
    *,
    headroom: float,
    confidence: float,
    phase: str | None,
    scenario: str | None,
    counted: bool = False,
    several: bool = False,
) -> tuple[Gate | None, str]:
    """A gate that this measurement's reruns pass, or why there is none. ``counted``: the gate will be
    judged by the exact count test (:class:`~harness.gates.policy.GatePolicy` declares it), which needs
    no interval of its own to pass; ``several``: one of several calibration runs, whose spread bounds
    the limit, so a percentile too noisy for one run's own margin is still a gate."""
    if m.n == 0 or not math.isfinite(m.value):
        return None, "no samples"
    if m.problems:
        return None, "; ".join(m.problems)
    floor = 1 if counted else metric.default_min_samples(confidence)
    needs = needs_text(metric, confidence)
    if m.n < floor:
        more = f"; a gate from one run: {needs}" if needs else ""
        return None, f"{m.n} samples, fewer than the {floor} it needs to be judged at all{more}"
    if counted and several and metric.kind == "percentile":
        margin = margin if math.isfinite(margin) else 0.0  # the spread of the runs bounds the limit
    elif math.isinf(margin) or (metric.direction == "at_most" and math.isinf(m.hi)):
        return None, (
            f"P{metric.q:g} of {m.n} samples is too noisy to gate on (a rerun's interval may reach past "
            f"the largest sample): {needs}, this run has {m.n}; record more requests"
        )
    noise = max(0.0, margin) if math.isfinite(margin) else 0.0
    abs_tol = max(metric.abs_tolerance_floor, noise)
    if metric.unit == "ratio":
        abs_tol = min(abs_tol, 1.0)
    gate = Gate(
        metric=metric.name,
        threshold=_round(m.value),
        direction=metric.direction,
        rel_tolerance=headroom,
        abs_tolerance=_round(abs_tol, 3),
        min_samples=max(floor, m.n // 2),
        phase=phase if phase != metric.default_phase else None,
        scenario=scenario,
    )
    if metric.direction == "at_least" and gate.limit <= 0:
        return None, f"{format_value(m.value, metric.unit)} leaves nothing to gate (the limit would be ≤ 0)"
    note = f"{format_value(m.value, metric.unit)} from n={m.n}"
    if abs_tol > headroom * abs(m.value):
        why = "reruns' noise" if noise >= metric.abs_tolerance_floor else "the metric's floor"
        if m.jitter > 0 and noise >= metric.abs_tolerance_floor:
            why += f" and the client's jitter (own P{metric.q:g} lateness {format_value(m.jitter, 'ms')})"
        note += f"; tolerance widened to {format_value(abs_tol, metric.unit)} by {why}"
    return gate, note


@dataclass(frozen=True)
class Candidate:
    """One metric of one result set that a baseline may gate: measured, with its rerun margin."""

    label: str
    metric: Metric
    scenario: str | None
    phase: str | None
    """The gate's ``phase`` (``None``: the metric's own, or the only result set)."""
    m: Measurement
    margin: float
    measured: bool
    """For the prefill peak: measured (CUDA), not estimated."""
    samples: FloatArray | None = None
    """Percentile metrics: the samples ranked (the policy's power is computed on them)."""

    def measurement(self) -> Measured:
        """What :class:`~harness.gates.policy.GatePolicy` needs of this run's measurement."""
        jitter = self.m.jitter if math.isfinite(self.m.jitter) else 0.0
        return Measured(self.m.value, self.m.n, self.samples, jitter, self.m.hi)

    @property
    def key(self) -> tuple[str, str, str | None]:
        return (self.label, self.metric.name, self.scenario)

    @property
    def where(self) -> str:
        return f"{self.label}: {self.metric.name}" + (f"[scenario={self.scenario}]" if self.scenario else "")


def candidates(
    result_sets: Sequence[ResultSet], *, confidence: float, per_scenario: bool = False
) -> Iterator[Candidate]:
    """Every metric ``harness baseline update`` considers, per result set, measured.

    :data:`UPDATE_METRICS` for every set, ``cold_start_p99`` for ``cold``, ``warm_rate`` for ``warm``,
    the ``*_rel`` ratios (:data:`RELATIVE_METRICS`) for every set but the reference when one labelled
    ``reference`` is given, and with ``per_scenario`` TTFT/TPOT/E2E P95 per scenario."""
    several = len(result_sets) > 1
    reference = next((rs for rs in result_sets if rs.label == REFERENCE_LABEL), None)
    for rs in result_sets:
        names = list(UPDATE_METRICS)
        if rs.label == "cold":
            names.append("cold_start_p99")
        if rs.label == "warm":
            names.append("warm_rate")
        if reference is not None and rs is not reference:
            names += RELATIVE_METRICS
        todo: list[Key] = [(n, None) for n in names]
        if per_scenario:
            todo += [(n, sc) for sc in rs.frame.values("scenario") for n in PER_SCENARIO_METRICS]
        for metric_name, scenario in todo:
            metric = METRICS.get(metric_name)
            frame = rs.frame.select(scenario=scenario)
            ref = reference.frame.select(scenario=scenario) if reference is not None else None
            ref = ref if metric.kind == "relative" else None
            m = metric.compute(
                frame, MetricContext(confidence=confidence, require_measured=True, reference=ref)
            )
            if metric.measured_option and any("estimated" in p for p in m.problems):
                # An estimated peak or KV count can still be a baseline (CPU peaks are); gates say so.
                m = metric.compute(frame, MetricContext(confidence=confidence, require_measured=False))
                measured = False
            else:
                measured = True
            phase = rs.label if several or rs.label == metric.default_phase else None
            margin = rerun_margin(metric, frame, confidence=confidence, reference=ref)
            samples = metric.samples(frame)[0] if metric.kind == "percentile" and metric.samples else None
            yield Candidate(rs.label, metric, scenario, phase, m, margin, measured, samples)


def baseline_from_results(
    result_sets: list[ResultSet],
    *,
    headroom: float,
    name: str = "baseline",
    confidence: float = 0.95,
    per_scenario: bool = False,
    policy: GatePolicy | None = None,
) -> tuple[Baseline, dict[int, str], list[str]]:
    """A baseline that these runs pass, and identical reruns of them pass too, with ``headroom`` (a
    fraction) as the relative tolerance; rate and percentile gates declared by ``policy`` (default
    :class:`GatePolicy`'s) with the regression each must catch.

    For every result set and metric with data: ``threshold`` is the measured value, ``rel_tolerance``
    the headroom, ``abs_tolerance`` the larger of the metric's floor and the noise margin of
    :func:`rerun_margin` (a small run is noisy; a gate tighter than its noise would call identical
    reruns inconclusive), ``min_samples`` half the recorded count (at least what the metric needs).
    With several result sets each gate gets ``phase: <label>``. Metrics a run cannot support (no
    data, too few samples to bound a P99 stably) are skipped, with the reason.

    Returns the baseline, a comment per gate index (the measured value and sample count) and the
    skipped metrics with reasons. Raises :class:`InputError` when a run cannot be judged (a baseline
    from an interrupted or client-bound run would be wrong) or nothing could be written.
    """
    for rs in result_sets:
        if rs.problems:
            raise InputError(f"cannot write a baseline from this run: {'; '.join(rs.problems)}", file=rs.path)
    policy = policy or GatePolicy()
    gates: list[Gate] = []
    comments: dict[int, str] = {}
    skipped: list[str] = []
    for c in candidates(result_sets, confidence=confidence, per_scenario=per_scenario):
        counted = policy.applies(c.metric)
        gate, note = _gate_from(
            c.metric, c.m, c.margin, headroom=headroom, confidence=confidence, phase=c.phase,
            scenario=c.scenario, counted=counted,
        )  # fmt: skip
        if gate is not None and counted:
            if c.metric.kind == "rate":  # the policy declares its limit: the run's noise did not set it
                note = f"{format_value(c.m.value, c.metric.unit)} from n={c.m.n}"
            gate, notes = policy.declare(gate, [c.measurement()], confidence=confidence)
            note = "; ".join([note, *notes]) if gate is not None else notes[0]
        if gate is None:
            skipped.append(f"{c.where}: {note}")
            continue
        if c.metric.measured_option:
            gate = gate.model_copy(update={"require_measured": c.measured})
            if not c.measured:
                note += "; values were estimated, so require_measured: false"
        comments[len(gates)] = note
        gates.append(gate)
    if not gates:
        raise InputError(
            "no metric of these runs has enough data for a gate", file=result_sets[0].path,
            hint="; ".join(skipped[:3]),
        )  # fmt: skip
    provenance = Provenance(
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        harness_version=__version__,
        headroom=headroom,
        results=[_provenance(rs) for rs in result_sets],
    )
    baseline = Baseline(
        schema_version=BASELINE_SCHEMA_VERSION,
        name=name,
        confidence=confidence,
        power=policy.power,
        gates=gates,
        provenance=provenance,
        fingerprint=fingerprint_from_results([result_sets]),
    )
    return baseline, comments, skipped
