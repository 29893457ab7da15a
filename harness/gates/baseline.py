"""The baseline file: what a CI gate compares a run against (YAML, versioned, unknown keys refused).

Example (``fixtures/baselines/example.yaml`` has a complete one)::

    schema_version: 1
    name: tiny-cpu
    confidence: 0.95
    gates:
      - {metric: tpot_p95, threshold: 4.2, rel_tolerance: 10%, min_samples: 200, phase: warm}
      - {metric: prefill_peak_bytes_max, threshold: 3.1e6, require_measured: true}
      - {metric: cold_start_p99, threshold: 850}        # seed SLO, applies to the run labelled cold
      - {metric: warm_rate, threshold: 0.92}            # seed SLO, applies to the run labelled warm

Each gate: ``metric`` (see ``harness baseline metrics``), ``threshold`` (the baseline value, in the
metric's unit: ms, bytes, bytes/token, or a ratio 0–1), ``direction`` (``at_most`` / ``at_least``,
default the metric's own), tolerances (the limit is ``threshold ± max(rel_tolerance·|threshold|,
abs_tolerance)``), ``min_samples``, and selectors: ``phase`` (the result-set label), ``scenario`` and
``stage`` (record fields). How a measurement is judged against the limit is in
:mod:`harness.gates.judge`.

:mod:`harness.gates.update` writes a baseline from runs (``harness baseline update``).
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import yaml
from pydantic import (
    BeforeValidator,
    Field,
    field_validator,
    model_validator,
)

from harness.common.errors import ConfigError
from harness.common.io import atomic_write, read_yaml
from harness.common.model import StrictModel
from harness.common.units import fraction
from harness.gates.fingerprints import BaselineFingerprint
from harness.gates.measurement import MetricContext
from harness.gates.metrics import METRICS, Direction, Metric
from harness.load.results import LATENCY_FIELDS

if TYPE_CHECKING:
    from pydantic_core import ErrorDetails

BASELINE_SCHEMA_VERSION: Literal[1] = 1


# So YAML may say rel_tolerance: 10% or 0.1.
Fraction = Annotated[float, BeforeValidator(fraction), Field(ge=0.0, allow_inf_nan=False)]


class Gate(StrictModel):
    """One line of the baseline: a metric, its baseline value and how far a run may drift from it."""

    metric: str
    threshold: float = Field(allow_inf_nan=False)
    """The baseline value in the metric's unit (ms, bytes, bytes/token; rates as 0–1)."""
    direction: Direction | None = None
    """``at_most`` or ``at_least``; defaults to the metric's natural direction."""
    rel_tolerance: Fraction = 0.0
    """Tolerated drift relative to ``threshold`` (``0.1`` or ``10%``)."""
    abs_tolerance: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)
    """Tolerated drift in the metric's unit; the larger of the two tolerances applies."""
    min_samples: int | None = Field(default=None, ge=1)
    """Fewer samples than this: the run cannot be judged (default: the fewest with which the metric
    can pass at all, e.g. 72 for a P95 at 95 % confidence)."""
    phase: str | None = None
    """The result-set label this gate applies to (``cold``, ``warm``); default: the metric's own
    (``cold_start_p99`` → cold, ``warm_rate`` → warm), else every result set given."""
    scenario: str | None = None
    """Only records of this scenario."""
    stage: str | None = None
    """Only records of this traffic stage (``replay``, ``cold``, ``warm``, a ladder stage)."""
    require_measured: bool | None = None
    """The prefill memory metrics only: refuse estimated values (default true): the peak measured on
    CUDA, the KV bytes counted by the engine's block manager (``prefill_kv_measured``)."""
    name: str | None = None
    """An id for reports and JUnit (default: metric plus selectors)."""
    blind: bool = False
    """Set by ``harness baseline calibrate`` where the runs' spread put an ``at_most`` latency limit
    at ≥ twice the fastest run's value: a 2× slower target would pass such a gate, so its pass
    proves nothing and is judged *cannot be judged* (:func:`harness.gates.judge.judge_gate`); a run
    beyond the limit still fails."""
    detect: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    """The regression this gate must be able to catch. A rate: the rate itself (``error_rate``: 0.05,
    a hit rate: 0.70). A latency percentile: a factor of the threshold (1.3: the percentile at 1.3×
    the baseline's). With it the gate is judged by the exact count test and passes only when it had
    ``power`` against this regression (:mod:`harness.gates.power`); without it, by the interval rule."""
    detect_share: float | None = Field(default=None, gt=0, le=1, allow_inf_nan=False)
    """Percentile gates with ``detect``: the share of requests above the limit under that regression
    (the runs the gate was made from, each scaled to ``detect ×`` the threshold; the smallest of them).
    The test's power at a run's size follows from it, before the run, as for a rate. Without it the
    judge takes the share from the run's own samples (plug-in)."""

    @field_validator("metric")
    @classmethod
    def _known_metric(cls, v: str) -> str:
        if v not in METRICS:
            raise ValueError(f"unknown metric {v!r}; known: {', '.join(METRICS.names())}")
        return v

    @model_validator(mode="after")
    def _options_fit_metric(self) -> Gate:
        if self.require_measured is not None and not self.spec.measured_option:
            raise ValueError(
                f"require_measured applies only to the prefill memory metrics, not {self.metric}"
            )
        if self.spec.unit == "ratio" and not 0.0 <= self.threshold <= 1.0:
            raise ValueError(f"{self.metric} is a ratio; its threshold must be within 0–1 (92 % is 0.92)")
        if self.detect is not None:
            self._check_detect(self.detect)
        if self.detect_share is not None and (self.detect is None or self.spec.kind != "percentile"):
            raise ValueError("detect_share goes with detect, on a percentile gate")
        return self

    def _check_detect(self, detect: float) -> None:
        kind, at_most = self.spec.kind, self.effective_direction == "at_most"
        if kind == "rate":
            if not 0.0 < detect < 1.0:
                raise ValueError(f"detect of {self.metric} is a rate in (0, 1), like 0.05")
            if (at_most and detect <= self.limit) or (not at_most and detect >= self.limit):
                side = "above" if at_most else "below"
                raise ValueError(
                    f"detect {detect:g} must lie {side} the limit {self.limit:g}: the regression to catch "
                    "is beyond what the gate allows"
                )
        elif kind in ("percentile", "pooled") and at_most:
            if detect <= 1.0:
                raise ValueError(f"detect of {self.metric} is a slowdown factor above 1, like 1.3")
        else:
            raise ValueError(f"detect applies to rates and at-most percentiles, not {self.metric}")

    @property
    def spec(self) -> Metric:
        return METRICS.get(self.metric)

    @property
    def effective_direction(self) -> Direction:
        return self.direction or self.spec.direction

    @property
    def effective_phase(self) -> str | None:
        return self.phase or self.spec.default_phase

    @property
    def tolerance(self) -> float:
        return max(self.rel_tolerance * abs(self.threshold), self.abs_tolerance)

    @property
    def limit(self) -> float:
        """The value a run must stay on the good side of."""
        if self.effective_direction == "at_most":
            return self.threshold + self.tolerance
        return self.threshold - self.tolerance

    def effective_min_samples(self, confidence: float) -> int:
        """``min_samples``, else the fewest the metric needs to be judged at all: for a percentile judged
        by the count test (``detect``) none beyond one, its power says whether the run was big enough."""
        if self.min_samples is not None:
            return self.min_samples
        if self.detect is not None and self.spec.kind == "percentile":
            return 1
        return self.spec.default_min_samples(confidence)

    def context(self, confidence: float) -> MetricContext:
        return MetricContext(
            confidence=confidence,
            require_measured=True if self.require_measured is None else self.require_measured,
        )

    @property
    def id(self) -> str:
        """``metric`` plus its selectors: ``tpot_p95[scenario=chat]``."""
        if self.name:
            return self.name
        sel = [f"{k}={v}" for k, v in (("scenario", self.scenario), ("stage", self.stage)) if v is not None]
        return self.metric + (f"[{','.join(sel)}]" if sel else "")


class ResultProvenance(StrictModel):
    label: str
    path: str
    requests: int
    started_at: str | None = None
    target: str | None = None
    model: str | None = None
    corpus_sha256: str | None = None
    schedule_sha256: str | None = None


class Provenance(StrictModel):
    """Where a baseline written by ``harness baseline update`` came from."""

    created_at: str
    harness_version: str
    headroom: float
    results: list[ResultProvenance]


class Baseline(StrictModel):
    """A baseline file."""

    schema_version: Literal[1]
    """Required: a file from a future harness is refused rather than half-understood."""
    name: str = "baseline"
    description: str | None = None
    confidence: float = Field(default=0.95, gt=0.5, lt=1.0)
    """Confidence of the intervals the gates decide on (two-sided); a gate with ``detect`` fails when its
    exact one-sided test rejects at ``1 − confidence``."""
    power: float = Field(default=0.95, gt=0.5, lt=1.0)
    """The power a gate with ``detect`` must have had against that regression to pass."""
    gates: list[Gate] = Field(min_length=1)
    provenance: Provenance | None = None
    fingerprint: BaselineFingerprint | None = None
    """Where it was calibrated (machine, target, recipes): on another, latency gates cannot be judged."""

    @model_validator(mode="after")
    def _unique_ids(self) -> Baseline:
        seen: set[tuple[str, str | None]] = set()
        for gate in self.gates:
            key = (gate.id, gate.effective_phase)
            if key in seen:
                where = f" (phase {gate.effective_phase})" if gate.effective_phase else ""
                raise ValueError(f"two gates named {gate.id!r}{where}; give one a distinct name")
            seen.add(key)
        return self


# ------------------------------------------------------------------------------------- reading


def _hint(err: ErrorDetails) -> str | None:
    loc = err.get("loc", ())
    if loc and loc[0] == "schema_version":
        return f"this harness reads baseline schema version {BASELINE_SCHEMA_VERSION}"
    if err.get("type") == "extra_forbidden":
        return "unknown keys are refused so that a typo cannot silently disable a gate"
    return None


def read_baseline(path: str | Path) -> Baseline:
    """Read and validate a baseline file; :class:`ConfigError` names the file, line and field."""
    return read_yaml(
        path, Baseline, expected="a baseline (schema_version, gates, …)", error=ConfigError, hint=_hint
    )


def baseline_sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


# ------------------------------------------------------------------------------------- writing


def _round(value: float, digits: int = 5) -> float | int:
    """``value`` to ``digits`` significant digits, so a written baseline reads like one a person wrote;
    whole numbers (byte counts) stay exact."""
    if not math.isfinite(value):
        return value
    if value.is_integer() and abs(value) < 2**53:
        return int(value)
    rounded = float(f"{value:.{digits}g}")
    return int(rounded) if rounded.is_integer() else rounded


def dump_baseline(
    baseline: Baseline, comments: dict[int, str] | None = None, header: list[str] | None = None
) -> str:
    """The baseline as YAML, one gate per line in flow style, each with an optional comment;
    ``header`` lines go first, as comments (how the file was made)."""
    comments = comments or {}
    head = baseline.model_dump(mode="json", exclude_none=True, exclude={"gates", "provenance", "fingerprint"})
    out = [
        *(f"# {line}".rstrip() for line in header or ()),
        "# Baseline for `harness gate` (docs/gates.md). One gate per line: the limit is",
        "# threshold ± max(rel_tolerance·|threshold|, abs_tolerance); units are the metric's",
        "# (`harness baseline metrics`).",
        yaml.safe_dump(head, sort_keys=False, allow_unicode=True).rstrip(),
        "gates:",
    ]
    for i, gate in enumerate(baseline.gates):
        row = gate.model_dump(mode="json", exclude_none=True)
        if not gate.blind:  # written only where calibration set it
            del row["blind"]
        for key in ("threshold", "abs_tolerance", "rel_tolerance"):
            if key in row:
                row[key] = _round(float(row[key]))
        line = yaml.safe_dump(row, default_flow_style=True, sort_keys=False, width=1 << 16).strip()
        out.append(f"  - {line}" + (f"  # {comments[i]}" if i in comments else ""))
    if baseline.provenance is not None:
        prov = {"provenance": baseline.provenance.model_dump(mode="json", exclude_none=True)}
        out.append(yaml.safe_dump(prov, sort_keys=False, allow_unicode=True).rstrip())
    if baseline.fingerprint is not None:
        fp = {"fingerprint": baseline.fingerprint.model_dump(mode="json", exclude_none=True)}
        out.append(yaml.safe_dump(fp, sort_keys=False, allow_unicode=True, width=1 << 16).rstrip())
    return "\n".join(out) + "\n"


def write_baseline(
    path: str | Path,
    baseline: Baseline,
    comments: dict[int, str] | None = None,
    header: list[str] | None = None,
) -> None:
    """Write ``baseline`` atomically; it reads back equal (checked: a file we cannot read is a bug)."""
    text = dump_baseline(baseline, comments, header)
    reread = Baseline.model_validate(yaml.safe_load(text))
    if len(reread.gates) != len(baseline.gates):  # pragma: no cover - guards dump_baseline itself
        raise AssertionError("baseline did not survive a YAML round trip")
    with atomic_write(path) as fh:
        fh.write(text)


# ------------------------------------------------------------------------------- runs until precision


def precision_targets(baseline: Baseline, phase: str | None = None) -> list[tuple[str, float]]:
    """The ``(record field, q)`` of every percentile gate of ``baseline`` that applies to ``phase``
    (``None``: every gate), for ``--until-precision`` to watch (``--precision-on``).

    Gates on derived samples (``prefill_kv_bytes_per_token_p95``) or on non-latency fields are left
    out: the load stage watches latency fields only. A gate's ``scenario`` / ``stage`` selector is
    not honoured: the run watches the percentile over all its records, so a gate on a small scenario
    may still need more samples than the run sent (its ``min_samples`` then says so).
    """
    out: list[tuple[str, float]] = []
    for gate in baseline.gates:
        spec = gate.spec
        if spec.kind != "percentile" or spec.q is None or spec.column not in LATENCY_FIELDS:
            continue
        if phase is not None and gate.effective_phase not in (None, phase):
            continue
        target = (spec.column, float(spec.q))
        if target not in out:
            out.append(target)
    return out


def precision_min_samples(baseline: Baseline, phase: str | None = None) -> int | None:
    """The largest explicit ``min_samples`` among the gates :func:`precision_targets` watches for
    ``phase``: a run that stopped below it would be precise enough yet unjudgeable."""
    found = [
        gate.min_samples
        for gate in baseline.gates
        if gate.min_samples is not None
        and gate.spec.kind == "percentile"
        and gate.spec.column in LATENCY_FIELDS
        and (phase is None or gate.effective_phase in (None, phase))
    ]
    return max(found) if found else None
