"""What every gate a written baseline holds must catch, and the limits a person can read.

``harness baseline update`` and ``harness baseline calibrate`` measure each metric on their runs and
then make it a gate by this policy (:class:`GatePolicy`, each option declared once):

- **error rate**: the limit is declared (``--max-error-rate``, default 1 %, raised to the worst run's
  rate if that is higher), and the gate must catch an error rate of ``--detect-errors`` (5 %);
- **session success rate** (``session_success_rate``): the error rate's, over sessions and mirrored:
  its failed sessions must stay within ``--max-error-rate`` and the gate must catch ``--detect-errors``;
- **hit rates** (``hit_rate_*``, ``warm_rate``): the limit is the worst run's rate less
  ``--max-hit-drop`` (5 points), and the gate must catch a cache that lost ``--detect-hit-loss`` of
  its hits (30 %: a rate of 0.7 × the worst run's);
- **percentiles** (latencies, prefill memory): the limit comes from the runs' spread (calibration)
  or one run's rerun margin (update), and the gate must catch a ``--detect-slowdown`` (2×): the
  smallest factor every run's own samples give the power asked for, if that is more. A latency
  gate's limit is then moved out as far as catching that slowdown still allows (``--drift-room``,
  :meth:`GatePolicy._room`): a machine drifts between runs more than the runs' spread shows.

A gate must have ``--power`` (0.95) against its regression at the size of the runs it was made from;
one that cannot (too few requests for the rates asked, a hit rate too small to lose 30 % of), is left
out, with the size it would need, rather than written to pass on too little.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BeforeValidator, Field

from harness.common.model import StrictModel
from harness.common.options import Flag
from harness.common.units import fraction
from harness.gates.baseline import Gate, _round
from harness.gates.measurement import rate_interval
from harness.gates.metrics import METRICS, Metric, format_value
from harness.gates.power import samples_for_power
from harness.gates.runs import FloatArray

POLICY_PANEL = "What each gate must catch"
FACTOR_GRID: tuple[float, ...] = tuple(round(1.05 + 0.05 * i, 2) for i in range(60))
"""The slowdown factors a percentile gate's reach is looked for among (1.05× … 4×)."""
LOOSE_ERROR_RATE = 0.10
"""An error-rate limit above this is looser than a user would set: written, but flagged."""
LOOSE_HIT_DROP = 0.20
RATE_RISK = 0.01
"""How far the runs' own luck may have flattered a rate: its one-sided exact bound at this risk (the
rate a rerun must not be proven below is never above what the runs could have come from)."""


def _factor(value: Any) -> Any:
    """``"1.3x"`` or ``"1.3"`` → 1.3 (a factor as a person writes it); numbers pass."""
    if isinstance(value, str):
        text = value.strip().lower().removesuffix("x").removesuffix("×")
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"{value!r} is not a factor like 1.3x") from None
    return value


Share = Annotated[float, BeforeValidator(fraction), Flag(text=True, panel=POLICY_PANEL)]


class GatePolicy(StrictModel):
    """The limits and the regressions to catch of every gate a written baseline holds."""

    max_error_rate: Share = Field(
        0.01,
        ge=0.0,
        lt=1.0,
        description="Error-rate limit (1% or 0.01; the worst run's rate if that is higher)",
    )
    detect_errors: Share = Field(
        0.05, gt=0.0, lt=1.0, description="The error rate every error gate must catch with --power (5%)"
    )
    max_hit_drop: Share = Field(
        0.05,
        ge=0.0,
        lt=1.0,
        description="How far a hit rate may fall below the worst run's (5% = five points)",
    )
    detect_hit_loss: Share = Field(
        0.30, gt=0.0, lt=1.0,
        description="The loss of hits every hit-rate gate must catch: a rate of (1 − this) × the worst run's",
    )  # fmt: skip
    detect_slowdown: Annotated[float, BeforeValidator(_factor), Flag(text=True, panel=POLICY_PANEL)] = Field(
        2.0, gt=1.0, le=10.0,
        description="The slowdown every latency and memory percentile gate must catch (2x; 1.3x asks more: "
        "gates that cannot reach it say what they catch)",
    )  # fmt: skip
    power: Annotated[float, Flag(panel=POLICY_PANEL)] = Field(
        0.95, gt=0.5, lt=1.0, description="The power each gate must have had against its regression to pass"
    )
    drift_room: Annotated[bool | None, Flag(("--drift-room/--no-drift-room",), panel=POLICY_PANEL)] = Field(
        None,
        description="Place each latency gate's limit as far out as catching --detect-slowdown at --power "
        "still allows (a machine's drift between runs then cannot fail an unchanged target); default: on "
        "for calibrate, off for update (one run's headroom is the user's)",
    )

    def applies(self, metric: Metric) -> bool:
        """Whether gates on ``metric`` are declared by this policy (rates and at-most percentiles)."""
        return metric.kind == "rate" or (
            metric.kind in ("percentile", "pooled") and metric.direction == "at_most"
        )

    def declare(
        self, gate: Gate, measured: Sequence[Measured], *, confidence: float
    ) -> tuple[Gate | None, list[str]]:
        """``gate`` (threshold and tolerance from the runs) with its declared limit and its regression to
        catch; ``None`` and why when the runs are too small for the power asked. The notes say what
        was written and what the file's reader should know (a loose limit, a weaker reach)."""
        spec = gate.spec
        alpha = 1.0 - confidence
        n_min = min(m.n for m in measured)
        values = [m.value for m in measured]
        k_all = round(sum(m.value * m.n for m in measured))
        n_all = sum(m.n for m in measured)
        if spec.kind == "rate" and (gate.effective_direction == "at_most" or spec.errors_complement):
            # A success rate is one minus an error rate: its failures get the error rate's limits.
            flip = spec.errors_complement
            errs = [1.0 - v for v in values] if flip else values
            k_err = n_all - k_all if flip else k_all
            # Where the runs erred, the rate they could have come from: never below what they showed.
            upper = rate_interval(k_err, n_all, 1.0 - 2 * RATE_RISK)[1] if k_err else 0.0
            limit = max(self.max_error_rate, *errs, upper)
            detect = self.detect_errors
            if detect <= limit:  # the runs' own rate is above the rate to catch: keep the same distance
                detect = min(0.99, limit + max(self.detect_errors - self.max_error_rate, 0.01))
            p0, p1 = (_round(1.0 - limit), _round(1.0 - detect)) if flip else (limit, detect)
            gate = gate.model_copy(
                update={"threshold": _round(p0), "rel_tolerance": 0.0, "abs_tolerance": 0.0,
                        "detect": _round(p1)}
            )  # fmt: skip
            notes = [f"limit {format_value(p0, 'ratio')}, to catch {format_value(p1, 'ratio')}"]
            if limit > LOOSE_ERROR_RATE:
                notes.append(f"LOOSE: an error-rate limit of {format_value(limit, 'ratio')} lets much fail")
            return self._powered(gate, p0, p1, alpha, n_min, upper=not flip, notes=notes)
        if spec.kind == "rate":
            # "No more than a drop below calibration", calibration being what the runs could have come
            # from: the worst run's rate, or the pooled rate's lower bound if the runs were lucky.
            worst = min(*values, rate_interval(k_all, n_all, 1.0 - 2 * RATE_RISK)[0])
            limit = worst - self.max_hit_drop
            detect = worst * (1.0 - self.detect_hit_loss)
            if limit <= 0 or detect >= limit:
                return None, [
                    f"a rate of {format_value(worst, 'ratio')} leaves no room between a drop of "
                    f"{format_value(self.max_hit_drop, 'ratio')} and a loss of {self.detect_hit_loss:.0%} "
                    "of it"
                ]
            gate = gate.model_copy(
                update={"threshold": _round(worst), "rel_tolerance": 0.0,
                        "abs_tolerance": _round(self.max_hit_drop), "detect": _round(detect)}
            )  # fmt: skip
            notes = [f"limit {format_value(gate.limit, 'ratio')}, to catch {format_value(detect, 'ratio')}"]
            if self.max_hit_drop > LOOSE_HIT_DROP:
                notes.append(f"LOOSE: a hit rate may drop {format_value(self.max_hit_drop, 'ratio')}")
            return self._powered(gate, gate.limit, detect, alpha, n_min, upper=False, notes=notes)
        if spec.kind == "pooled":
            return self._pooled(gate, measured)
        return self._percentile(gate, measured, alpha)

    def _pooled(self, gate: Gate, measured: Sequence[Measured]) -> tuple[Gate | None, list[str]]:
        """A pooled percentile passes when its interval's high end rules out ``detect ×`` the threshold:
        the smallest factor every run's interval was within, with a tenth more for a rerun's scatter."""
        his = [m.hi for m in measured]
        if not his or not all(math.isfinite(h) and h > 0 for h in his) or gate.threshold <= 0:
            return None, ["no interval to size it on"]
        reach = math.ceil(max(his) / gate.threshold * 1.1 * 20) / 20  # to 0.05 above
        detect = max(self.detect_slowdown, reach)
        notes = [f"catches {detect:g}× (its interval, resampling whole {gate.spec.per}, rules it out)"]
        if self.drift_room and gate.spec.unit == "ms" and gate.min_samples:
            # It fails a run whose interval's low end is beyond the limit. A run ``detect ×`` the fastest,
            # at min_samples requests (the half-width grows as 1/√n), has its low end about
            # ``detect × (v − w)``; two half-widths below that, it is caught about 97 % of the time.
            room = detect * min(
                m.value - 2 * (m.hi - m.value) * math.sqrt(m.n / gate.min_samples) for m in measured
            )
            if room > gate.limit * 1.001:
                gate = gate.model_copy(update={"abs_tolerance": _round(room - gate.threshold)})
                notes.insert(
                    0,
                    f"limit {format_value(gate.limit, 'ms')}: as far out as catching {detect:g}× the fastest "
                    f"run from {gate.min_samples:,} {gate.spec.per} allows (drift room)",
                )
        if reach > self.detect_slowdown:
            notes.append(f"not {self.detect_slowdown:g}× as asked: these runs reach {reach:g}×")
        return gate.model_copy(update={"detect": detect}), notes

    def _powered(
        self, gate: Gate, p0: float, p1: float, alpha: float, n_min: int, *, upper: bool, notes: list[str]
    ) -> tuple[Gate | None, list[str]]:
        need = samples_for_power(p0, p1, alpha, self.power, upper)
        if need is None or need > n_min:
            what = "no run size" if need is None else f"{need:,} {gate.spec.per} a phase"
            return None, [
                f"catching {format_value(p1, 'ratio')} against a limit of {format_value(p0, 'ratio')} at "
                f"power {self.power:.2f} needs {what}; these runs had {n_min:,}"
            ]
        notes.append(f"power {self.power:.2f} from {need:,} {gate.spec.per}")
        return gate, notes

    def _percentile(
        self, gate: Gate, measured: Sequence[Measured], alpha: float
    ) -> tuple[Gate | None, list[str]]:
        """The regression to catch: ``--detect-slowdown``, or the smallest factor these runs reach if that
        is more. At a factor ``f`` each run's samples are scaled so that its percentile sits at ``f ×``
        the threshold, and the share above the limit (plus its jitter) is what the test must catch; the
        smallest share over the runs, and the test must reach the power asked at the smallest run's
        size. The share is written (``detect_share``): a rerun's power is then known before it runs."""
        q = gate.spec.q
        assert q is not None
        usable = [m for m in measured if m.samples is not None and m.samples.size and m.value > 0]
        if not usable:
            return None, ["no samples to size the test on"]
        n_min = min(m.n for m in usable)
        p0 = 1.0 - q / 100.0

        def share(f: float) -> float:
            return min(
                float((m.samples * (f * gate.threshold / m.value) > gate.limit + m.jitter).mean())
                for m in usable
                if m.samples is not None
            )

        reach = None
        for f in FACTOR_GRID:
            s1 = share(f)
            need = samples_for_power(p0, s1, alpha, self.power) if s1 > p0 else None
            if need is not None and need <= n_min:
                reach = f
                break
        if reach is None:
            return None, [f"no slowdown up to {FACTOR_GRID[-1]:g}× would be caught at power {self.power:.2f}"]
        detect = max(self.detect_slowdown, reach)
        roomy = self._room(gate, usable, detect, p0, alpha) if self.drift_room else None
        if roomy is not None:
            gate = roomy
        s1 = share(detect)
        need = samples_for_power(p0, s1, alpha, self.power)
        per = gate.spec.per
        notes = [f"catches {detect:g}× ({s1:.0%} of {per} above the limit) from {need:,} {per}"]
        if roomy is not None:
            notes.insert(
                0,
                f"limit {format_value(gate.limit, gate.spec.unit)}: as far out as catching {detect:g}× "
                f"the fastest run at power {self.power:.2f} from {gate.min_samples:,} {gate.spec.per} allows "
                "(drift room)",
            )
        if reach > self.detect_slowdown:
            notes.append(f"not {self.detect_slowdown:g}× as asked: these runs reach {reach:g}×")
        return gate.model_copy(update={"detect": detect, "detect_share": _round(s1, 4)}), notes

    def _room(
        self, gate: Gate, usable: Sequence[Measured], detect: float, p0: float, alpha: float
    ) -> Gate | None:
        """``gate`` with its limit moved out to the loosest that still catches ``detect ×`` at the
        policy's power from ``min_samples`` requests, or ``None`` when that is no looser.

        The runs' spread says how far reruns scatter *between those runs*; a machine's speed also
        drifts over the hour (measured on a quiet 2-core VM: four runs back to back at 118–122 ms cold
        TTFT p50, half an hour later 127–149 ms), and a limit from the spread alone then fails an
        unchanged target. Any limit tighter than what catching the declared regression needs buys only
        false alarms, so latency gates take all the room the power allows. The regression is sized on
        the *fastest* run slowed ``detect ×`` (each run's own samples scaled, the smallest share above
        the limit over the runs): a slowdown on the machine's best day is the hardest to see, and the
        limit stays below ``detect ×`` that run's value, so the gate is never blind."""
        size = gate.min_samples
        if gate.spec.unit != "ms" or size is None:
            return None  # memory and the like do not drift with the machine: the runs' spread is right

        def caught(limit: float) -> bool:
            s = min(
                float((m.samples * detect > limit + m.jitter).mean()) for m in usable if m.samples is not None
            )
            need = samples_for_power(p0, s, alpha, self.power) if s > p0 else None
            return need is not None and need <= size

        lo, hi = gate.limit, detect * min(m.value for m in usable)
        if hi <= lo or not caught(lo):
            return None
        for _ in range(40):  # bisection: the share above the limit only falls as the limit rises
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if caught(mid) else (lo, mid)
        if lo <= gate.limit * 1.001:
            return None
        return gate.model_copy(update={"abs_tolerance": _round(lo - gate.threshold)})


@dataclass(frozen=True)
class Measured:
    """One run's measurement of a metric, as the policy needs it: the value, the sample count and, for
    percentiles, the samples and the client's jitter (ms; 0 where not client-timed)."""

    value: float
    n: int
    samples: FloatArray | None = None
    jitter: float = 0.0
    hi: float = math.nan
    """The run's interval's high end (pooled percentiles size their reach on it)."""


def loose_limit(metric: str, unit: str, direction: str, baseline: float, limit: float) -> str | None:
    """Why a gate's limit is looser than a user would set (``None``: it is not), for a report or a
    calibration to flag: an error-rate limit above 10 %, a hit rate allowed to fall more than 20 points."""
    if unit != "ratio":
        return None
    if direction == "at_most" and metric == "error_rate" and limit > LOOSE_ERROR_RATE:
        return (
            f"an error-rate limit of {format_value(limit, 'ratio')} lets one request in {1 / limit:.0f} fail"
        )
    if metric in METRICS and METRICS.get(metric).errors_complement:
        fail = 1.0 - limit if direction == "at_least" else limit
        if fail > LOOSE_ERROR_RATE:
            return f"{metric} ≥ {format_value(limit, 'ratio')} lets one in {1 / fail:.0f} fail"
        return None
    if direction == "at_least" and baseline - limit > LOOSE_HIT_DROP:
        return f"{metric} may fall {format_value(baseline - limit, 'ratio')} below its baseline"
    return None
