"""QPS decay under cache misses: fit ``QPS = QPS0 · exp(−k · CMR²)`` to a bypass-fraction sweep.

A sweep runs the target at its saturation point in stages, each with a controlled cache-miss rate
(CMR: a share of requests sent with ``Cache-Control: no-cache``, so they bypass the cache), and
measures the QPS each stage achieved. The model says throughput falls slowly while misses are rare
and steeply once they dominate; ``k`` is how steeply. The fit is scipy's Levenberg–Marquardt
(``curve_fit(method="lm")``); ``k``'s interval uses the fit's covariance and Student's t with
``n − 2`` degrees of freedom; residuals and R² say how well the model holds.

Input (:class:`DecayPoint`, one row per stage): a JSONL or CSV of ``cmr, qps``, or load run
directories: a run with stages gives one point per stage (CMR = share of the stage's records whose
``cache`` is ``MISS`` or ``BYPASS``; QPS = successful requests / the stage's duration), a run
without stages one point (over the whole run).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from pydantic import Field

from harness.analysis.references import FloatArray
from harness.common.errors import InputError
from harness.common.io import atomic_write, check_input_file, iter_jsonl
from harness.common.model import StrictModel

if TYPE_CHECKING:
    from harness.load.results import RequestRecord

MISS_STATUSES = frozenset({"MISS", "BYPASS"})


class DecayPoint(StrictModel):
    """One stage of a sweep: its cache-miss rate and the QPS it achieved."""

    cmr: float = Field(ge=0.0, le=1.0)
    """Measured cache-miss rate: share of the stage's requests the cache answered ``MISS``/``BYPASS``."""
    qps: float = Field(gt=0.0)
    source: str | None = None
    stage: str | None = None
    requests: int | None = None
    bypass_fraction: float | None = Field(default=None, ge=0.0, le=1.0)
    """The share of requests the stage asked to bypass the cache (a live sweep's setting), if known."""


class DecayFit(StrictModel):
    """The fitted model with ``k``'s confidence interval and the residuals."""

    qps0: float
    qps0_interval: tuple[float, float]
    k: float
    k_stderr: float
    k_interval: tuple[float, float]
    confidence: float
    n: int
    residuals: list[float]
    """Observed − fitted QPS, one per point in input order."""
    rmse: float
    r2: float
    points: list[DecayPoint]

    def predict(self, cmr: FloatArray) -> FloatArray:
        """Fitted QPS at each ``cmr``."""
        return decay_model(cmr, self.qps0, self.k)


def decay_model(cmr: FloatArray, qps0: float, k: float) -> FloatArray:
    """``QPS0 · exp(−k · CMR²)``."""
    out: FloatArray = qps0 * np.exp(-k * cmr**2)
    return out


def fit_decay(points: Sequence[DecayPoint], confidence: float = 0.95) -> DecayFit:
    """Levenberg–Marquardt fit of :func:`decay_model`; needs three points and two distinct CMRs."""
    from scipy.optimize import curve_fit
    from scipy.stats import t as student_t

    if len(points) < 3:
        raise InputError(f"a decay fit needs at least 3 stages, got {len(points)}", field="points")
    x = np.asarray([p.cmr for p in points], dtype=np.float64)
    y = np.asarray([p.qps for p in points], dtype=np.float64)
    if np.unique(x).size < 2:
        raise InputError("every stage has the same cache-miss rate; sweep the bypass fraction", field="cmr")
    # Start from the log-linear least squares (ln QPS = ln QPS0 − k·CMR²): LM then refines it.
    slope, intercept = np.polyfit(x**2, np.log(y), 1)
    p0 = (float(math.exp(intercept)), float(max(-slope, 0.0)))
    try:
        popt, pcov = curve_fit(decay_model, x, y, p0=p0, method="lm", maxfev=10_000)
    except RuntimeError as exc:
        raise InputError(f"the decay fit did not converge: {exc}", field="points") from None
    qps0, k = float(popt[0]), float(popt[1])
    dof = len(points) - 2
    se = np.sqrt(np.diag(pcov)) if np.all(np.isfinite(pcov)) else np.array([math.inf, math.inf])
    tq = float(student_t.ppf(0.5 + confidence / 2.0, dof))
    fitted = decay_model(x, qps0, k)
    resid = y - fitted
    ss_res = float(np.sum(resid**2))
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    return DecayFit(
        qps0=qps0,
        qps0_interval=(qps0 - tq * float(se[0]), qps0 + tq * float(se[0])),
        k=k,
        k_stderr=float(se[1]),
        k_interval=(k - tq * float(se[1]), k + tq * float(se[1])),
        confidence=confidence,
        n=len(points),
        residuals=[float(r) for r in resid],
        rmse=math.sqrt(ss_res / len(points)),
        r2=1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0,
        points=list(points),
    )


def mixture_model(cmr: FloatArray, qps_hit: float, qps_miss: float) -> FloatArray:
    """``1 / ((1 − CMR)/QPS_hit + CMR/QPS_miss)``: each request costs its path's time."""
    out: FloatArray = 1.0 / ((1.0 - cmr) / qps_hit + cmr / qps_miss)
    return out


class MixtureFit(StrictModel):
    """The cost-mixture model beside the seed's: a hit costs ``1/QPS_hit``, a miss ``1/QPS_miss``.

    A saturated server's throughput is the inverse of the mean cost of a request, so with a share
    ``CMR`` of misses ``1/QPS`` is linear in ``CMR``. It has as many parameters as the seed's model;
    comparing the residuals says which shape the measurements follow.
    """

    qps_hit: float
    qps_miss: float
    residuals: list[float]
    rmse: float
    r2: float

    def predict(self, cmr: FloatArray) -> FloatArray:
        return mixture_model(cmr, self.qps_hit, self.qps_miss)


def fit_mixture(points: Sequence[DecayPoint]) -> MixtureFit | None:
    """Levenberg–Marquardt fit of :func:`mixture_model` (from the linear fit of ``1/QPS``); ``None``
    when the points do not give positive costs for both paths or it does not converge."""
    from scipy.optimize import curve_fit

    x = np.asarray([p.cmr for p in points], dtype=np.float64)
    y = np.asarray([p.qps for p in points], dtype=np.float64)
    if len(points) < 3 or np.unique(x).size < 2:
        return None
    slope, intercept = np.polyfit(x, 1.0 / y, 1)
    a, b = float(intercept), float(intercept + slope)  # costs at CMR 0 and CMR 1
    if a <= 0 or b <= 0:
        return None

    def model(c: FloatArray, hit: float, miss: float) -> FloatArray:
        return mixture_model(c, hit, miss)

    try:
        popt, _ = curve_fit(model, x, y, p0=(1.0 / a, 1.0 / b), method="lm", maxfev=10_000)
    except RuntimeError:
        return None
    hit, miss = float(popt[0]), float(popt[1])
    if hit <= 0 or miss <= 0:
        return None
    resid = y - mixture_model(x, hit, miss)
    ss_res = float(np.sum(resid**2))
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    return MixtureFit(
        qps_hit=hit,
        qps_miss=miss,
        residuals=[float(r) for r in resid],
        rmse=math.sqrt(ss_res / len(points)),
        r2=1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0,
    )


# --------------------------------------------------------------------------- inputs


def read_points(path: str | Path) -> list[DecayPoint]:
    """Points from a JSONL (:class:`DecayPoint` per line) or a CSV with ``cmr`` and ``qps`` columns."""
    p = check_input_file(path)
    if p.suffix.lower() == ".csv":
        from pydantic import ValidationError

        from harness.common.io import validation_input_error

        out: list[DecayPoint] = []
        with p.open(newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            if not reader.fieldnames or not {"cmr", "qps"} <= set(reader.fieldnames):
                raise InputError("a CSV of stages needs 'cmr' and 'qps' columns", file=p, line=1)
            for row_no, row in enumerate(reader, start=1):
                try:
                    out.append(
                        DecayPoint.model_validate({k: v for k, v in row.items() if v not in (None, "")})
                    )
                except ValidationError as exc:
                    raise validation_input_error(exc, file=p, line=row_no, expected="a stage row") from None
        return out
    return [pt for _, pt in iter_jsonl(p, DecayPoint, expected="a decay point (cmr, qps)")]


def points_from_run(run_dir: str | Path) -> list[DecayPoint]:
    """One point per stage of a load run (or one for the run): CMR from records, QPS per duration."""
    from harness.load.results import read_records
    from harness.load.run_summary import read_summary

    summary = read_summary(run_dir)
    records = list(read_records(run_dir))
    if not any(r.cache is not None for r in records):
        raise InputError(
            "no record carries an x-cache status, so the cache-miss rate is unknown",
            file=run_dir,
            field="cache",
            hint="sweep a target with a response cache (harness serve --cache)",
        )
    groups: list[tuple[str | None, list[RequestRecord], float]] = []
    if summary.stages:
        for st in summary.stages:
            recs = [r for r in records if r.stage == st.name]
            groups.append((st.name, recs, st.ended_s - st.started_s))
    else:
        groups.append((None, list(records), summary.duration_s))
    out: list[DecayPoint] = []
    for name, recs, duration in groups:
        told = [r for r in recs if r.cache is not None]
        if not told or duration <= 0:
            continue
        misses = sum(r.cache in MISS_STATUSES for r in told)
        ok = sum(r.ok for r in recs)
        if ok == 0:
            continue
        out.append(
            DecayPoint(
                cmr=misses / len(told), qps=ok / duration, source=str(run_dir), stage=name, requests=len(recs)
            )
        )
    return out


# --------------------------------------------------------------------------- plot


def plot_decay(fit: DecayFit, path: str | Path, *, mixture: MixtureFit | None = None) -> None:
    """Points, fitted curve with the curves at ``k``'s interval ends, and residuals; PNG, atomically.

    With ``mixture``, its curve and residuals are drawn too (dashed, hollow markers)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = np.asarray([p.cmr for p in fit.points])
    y = np.asarray([p.qps for p in fit.points])
    grid = np.linspace(0.0, max(1.0, float(x.max())), 200)
    fig, (ax, ax_r) = plt.subplots(
        2, 1, figsize=(7, 6), sharex=True, gridspec_kw={"height_ratios": [3, 1]}, constrained_layout=True
    )
    lo, hi = fit.k_interval
    ax.fill_between(
        grid,
        decay_model(grid, fit.qps0, hi),
        decay_model(grid, fit.qps0, lo),
        alpha=0.2,
        label=f"k {int(fit.confidence * 100)} % interval",
    )
    ax.plot(grid, decay_model(grid, fit.qps0, fit.k), label=f"QPS0·exp(−k·CMR²), k = {fit.k:.3g}")
    if mixture is not None:
        ax.plot(
            grid,
            mixture.predict(grid),
            linestyle="--",
            label=f"1/((1−CMR)/{mixture.qps_hit:.3g} + CMR/{mixture.qps_miss:.3g}) (cost mixture)",
        )
    ax.scatter(x, y, color="black", zorder=3, label="stages")
    ax.set_ylabel("achieved QPS")
    ax.set_title(f"QPS decay under cache misses (exp(−k·CMR²) fit: R² = {fit.r2:.3f})")
    ax.legend()
    ax_r.axhline(0.0, color="grey", linewidth=0.8)
    ax_r.scatter(x, fit.residuals, color="black", label="exp(−k·CMR²)")
    if mixture is not None:
        ax_r.scatter(x, mixture.residuals, facecolors="none", edgecolors="C1", label="cost mixture")
        ax_r.legend(fontsize="small")
    ax_r.set_xlabel("cache-miss rate (CMR)")
    ax_r.set_ylabel("residual")
    with atomic_write(path, "wb", encoding=None) as fh:
        fig.savefig(fh, format="png", dpi=110)
    plt.close(fig)
