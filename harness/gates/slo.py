"""The SLO of a capacity search and the verdict of one probe against it.

**The SLO** (:func:`parse_slo`) is a comma-separated list of ``metric<=value`` terms, each metric a
latency percentile of the gates' registry (:data:`harness.gates.metrics.METRICS`: one name, one
meaning everywhere), values in ms, and ``error_rate``. ``ttft_p95`` is the P95 TTFT from send, as in a
gate; ``ttft_from_intended_p95`` counts from the arrival's intended send (above capacity an
open-loop probe's client may send late, and that wait is part of what a user sees: the default SLO
judges it); ``tpot_pXX``, ``itl_pXX`` (every gap pooled), ``e2e_pXX`` likewise. A latency value may
be relative, ``ttft_from_intended_p95<=3x``: three times that percentile on the **reference probe**
(the first, lowest-rate one, nearly unloaded), which makes an SLO that travels between machines.

**A probe's verdict** uses the gates' intervals at ``confidence``: a percentile with its
order-statistic interval (:func:`harness.common.stats.percentile_interval`), the error rate with its
Clopper–Pearson interval (:func:`harness.gates.measurement.rate_interval`). A term *passes* when its
whole interval is within the limit, *fails* when the whole interval is beyond it, and is
*inconclusive* otherwise; the probe fails if a term fails, is inconclusive if one is, and passes if
every term does. For every latency term the **SLO attainment** is recorded too: the share of requests
that met the limit (a failed request did not), with its Clopper–Pearson interval.

The search that runs probes is :mod:`harness.experiments.capacity`; this module only judges.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

from harness.common.errors import ConfigError
from harness.common.model import StrictModel
from harness.common.stats import percentile, percentile_interval
from harness.gates.measurement import min_samples_for_bound, rate_interval
from harness.gates.metrics import METRICS, format_interval, format_value
from harness.load.results import RECORDS_FILE, metric_values

DEFAULT_SLO = "ttft_from_intended_p95<=3x,error_rate<=0.05"
"""Default SLO: P95 TTFT (from intended send) at most 3× the nearly unloaded reference probe's, and
at most 5 % errors. Relative, so it holds on any machine; 5 % (not 1 %) because a probe of 100
requests can prove an error rate below 3.6 % at best (Clopper–Pearson, 95 %): a 1 % term needs 368."""
CLIENT_CPU_BOUND_PCT = 90.0
"""A failing probe whose client used more CPU than this cannot blame the target."""

Verdict = Literal["pass", "fail", "inconclusive"]

# ------------------------------------------------------------------------------------------- SLO

_TERM = re.compile(r"^\s*([a-z_0-9]+)\s*<=\s*([^\s]+?)\s*$")


class SloTerm(StrictModel):
    """One ``metric<=value`` term of an SLO."""

    text: str
    """The term as written (``ttft_p95<=3x``)."""
    metric: str
    """``ttft_p95`` … or ``error_rate``."""
    kind: Literal["percentile", "rate"]
    column: str | None = None
    """The record field a percentile term ranks (``ttft_from_intended_ms``)."""
    q: int | None = None
    limit: float | None = None
    """Absolute limit (ms; a share for ``error_rate``); ``None`` for a relative term."""
    factor: float | None = None
    """Relative term: the limit is this times the reference probe's value."""

    @property
    def unit(self) -> str:
        return "ms" if self.kind == "percentile" else "ratio"


def parse_slo(text: str) -> list[SloTerm]:
    """``"ttft_p95<=300,tpot_p95<=50,error_rate<=0.01"`` → terms; a bad term is a :class:`ConfigError`
    naming it. Each metric may appear once."""
    terms: list[SloTerm] = []
    parts = [p for p in text.split(",")]
    if not text.strip():
        raise ConfigError("the SLO is empty", field="--slo", hint=f'--slo "{DEFAULT_SLO}"')
    for raw in parts:
        term = _parse_term(raw)
        if any(t.metric == term.metric for t in terms):
            raise ConfigError(f"{term.metric} is given twice in {text!r}", field="--slo")
        terms.append(term)
    return terms


def _parse_term(raw: str) -> SloTerm:
    def bad(why: str) -> ConfigError:
        return ConfigError(
            f"SLO term {raw.strip()!r}: {why}",
            field="--slo",
            hint="terms like ttft_p95<=300, e2e_p99<=3x, tpot_p95<=50, itl_p99<=80, error_rate<=0.05",
        )

    m = _TERM.match(raw)
    if m is None:
        raise bad("expected metric<=value")
    metric, value = m.group(1), m.group(2)
    if metric == "error_rate":
        if value.endswith("x"):
            raise bad("an error rate takes an absolute share (0.05), not a multiple")
        limit = _number(value, bad)
        if not 0 < limit < 1:
            raise bad("an error rate limit is a share in (0, 1), like 0.05")
        return SloTerm(text=raw.strip(), metric=metric, kind="rate", limit=limit)
    known = slo_metrics()
    if metric not in known:
        raise bad(f"unknown metric; known: {', '.join(sorted(known))}, error_rate")
    column, q = known[metric]
    if value.endswith("x"):
        factor = _number(value[:-1], bad)
        if factor < 1:
            raise bad("a relative limit is at least 1x the reference probe's value")
        return SloTerm(text=raw.strip(), metric=metric, kind="percentile", column=column, q=q, factor=factor)
    limit = _number(value.removesuffix("ms"), bad)
    if limit <= 0:
        raise bad("a latency limit is above 0 ms")
    return SloTerm(text=raw.strip(), metric=metric, kind="percentile", column=column, q=q, limit=limit)


@functools.cache
def slo_metrics() -> Mapping[str, tuple[str, int]]:
    """The metrics an SLO term may name: the gates' latency percentiles of one record field (ms),
    name → ``(field, quantile)``; read once (the registry is filled at import)."""
    out: dict[str, tuple[str, int]] = {}
    for name in METRICS.names():
        m = METRICS.get(name)
        # The client's own lateness is its health, not a level of the service.
        service = m.column not in (None, "lateness_ms")
        if m.kind in ("percentile", "pooled") and m.unit == "ms" and service and m.q is not None:
            assert m.column is not None
            out[name] = (m.column, int(m.q))
    return out


def _number(text: str, bad: Callable[[str], ConfigError]) -> float:
    try:
        value = float(text)
    except ValueError:
        raise bad(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise bad(f"{text!r} is not a finite number")
    return value


def check_probe_size(terms: Sequence[SloTerm], requests: int, confidence: float) -> None:
    """Refuse an SLO that no probe of ``requests`` requests could ever pass at ``confidence`` (a
    percentile whose interval has no upper bound, an error rate below what 0 errors can prove)."""
    for t in terms:
        if t.kind == "percentile" and t.column != "itl_ms" and t.q is not None:
            need = min_samples_for_bound(t.q, confidence)
            if requests < need:
                raise ConfigError(
                    f"SLO term {t.text!r}: P{t.q} of {requests} samples has no upper bound at "
                    f"{confidence:.0%} confidence, so no probe could pass",
                    field="--probe-requests",
                    hint=f"--probe-requests {need} or more",
                )
        if t.kind == "rate" and t.limit is not None:
            best = rate_interval(0, requests, confidence)[1]
            if best > t.limit:
                alpha = 1.0 - confidence
                need = math.ceil(math.log(alpha / 2) / math.log(1.0 - t.limit))
                raise ConfigError(
                    f"SLO term {t.text!r}: with {requests} requests and no error at all a probe shows an "
                    f"error rate ≤ {best:.1%} at best ({confidence:.0%} confidence), above the limit",
                    field="--probe-requests",
                    hint=f"--probe-requests {need} or more, or a looser error_rate",
                )


def probe_min_requests(terms: Sequence[SloTerm], confidence: float) -> int:
    """The fewest requests with which a probe could pass every term (:func:`check_probe_size`'s
    bound): a percentile's finite upper bound, an error rate that zero errors can prove."""
    need = 1
    for t in terms:
        if t.kind == "percentile" and t.column != "itl_ms" and t.q is not None:
            need = max(need, min_samples_for_bound(t.q, confidence))
        if t.kind == "rate" and t.limit is not None and 0 < t.limit < 1:
            need = max(need, math.ceil(math.log((1.0 - confidence) / 2) / math.log(1.0 - t.limit)))
    return need


def precision_on(terms: Sequence[SloTerm]) -> str | None:
    """The load stage's ``--precision-on`` for an SLO's percentile terms (``ttft_from_intended_ms:95``)."""
    items = [f"{t.column}:{t.q}" for t in terms if t.kind == "percentile" and t.column and t.q is not None]
    return ",".join(items) or None


# ------------------------------------------------------------------------------------ measurement


@dataclass
class ProbeSamples:
    """What one probe measured: per-request columns (NaN where a record has no value), which requests
    succeeded, the pooled ITL gaps; and where it ran."""

    rate: float
    columns: dict[str, np.ndarray]
    ok: np.ndarray
    itl: np.ndarray
    dir: str = ""
    achieved_rate: float | None = None
    seconds: float | None = None
    client_cpu_pct: float | None = None
    client_bound: bool = False
    warnings: list[str] = field(default_factory=list)

    @property
    def requests(self) -> int:
        return int(self.ok.size)

    @property
    def errors(self) -> int:
        return int((~self.ok).sum())

    @classmethod
    def from_run(cls, rate: float, run_dir: Path, seconds: float | None = None) -> ProbeSamples:
        """Read a probe's run directory (``records.jsonl`` and, when there, ``summary.json``)."""
        from harness.load.results import read_records
        from harness.load.run_summary import SUMMARY_FILE, read_summary

        records = list(read_records(run_dir / RECORDS_FILE)) if (run_dir / RECORDS_FILE).exists() else []
        columns = {
            col: np.asarray(
                [np.nan if getattr(r, col) is None else float(getattr(r, col)) for r in records],
                dtype=np.float64,
            )
            for col in {c for c, _ in slo_metrics().values()}
            if col != "itl_ms"
        }
        ok = np.asarray([r.ok for r in records], dtype=bool)
        itl = np.asarray(metric_values(records, "itl_ms"), dtype=np.float64)
        out = cls(rate=rate, columns=columns, ok=ok, itl=itl, dir=str(run_dir), seconds=seconds)
        if (run_dir / SUMMARY_FILE).exists():
            s = read_summary(run_dir)
            out.achieved_rate = s.achieved_rate
            out.client_cpu_pct = s.client_cpu_pct
            out.client_bound = s.client_bound
            out.warnings = list(s.warnings)
        return out

    def samples(self, column: str) -> np.ndarray:
        if column == "itl_ms":
            return self.itl
        return self.columns[column]


class TermResult(StrictModel):
    """One SLO term on one probe."""

    term: str
    metric: str
    limit: float | None
    """The absolute limit judged against (a relative term's resolved one; ``None``: no reference value)."""
    value: float | None
    lo: float | None
    hi: float | None
    n: int
    verdict: Verdict
    attainment: float | None = None
    """Latency terms: share of requests that met the limit (a failed request did not)."""
    attainment_lo: float | None = None
    attainment_hi: float | None = None

    @property
    def unit(self) -> str:
        return "ratio" if self.metric == "error_rate" else "ms"


class ProbeResult(StrictModel):
    """One probe: its offered rate, what it sent, and each term's verdict."""

    index: int
    rate: float
    """Offered (intended) arrival rate, requests/s."""
    requests: int
    errors: int
    achieved_rate: float | None = None
    """Requests sent per second of the send window (``summary.json``)."""
    seconds: float | None = None
    terms: list[TermResult]
    verdict: Verdict
    note: str | None = None
    """Why the verdict is what it is, in one sentence."""
    client_cpu_pct: float | None = None
    client_bound: bool = False
    dir: str = ""


def judge_term(term: SloTerm, limit: float | None, probe: ProbeSamples, confidence: float) -> TermResult:
    """One term on one probe: value, interval, verdict and (latency terms) attainment."""
    if term.kind == "rate":
        k, n = probe.errors, probe.requests
        if n == 0 or limit is None:
            return TermResult(
                term=term.text,
                metric=term.metric,
                limit=limit,
                value=None,
                lo=None,
                hi=None,
                n=n,
                verdict="inconclusive",
            )
        lo, hi = rate_interval(k, n, confidence)
        verdict: Verdict = "pass" if hi <= limit else "fail" if lo > limit else "inconclusive"
        return TermResult(
            term=term.text, metric=term.metric, limit=limit, value=k / n, lo=lo, hi=hi, n=n, verdict=verdict
        )
    assert term.column is not None and term.q is not None
    raw = probe.samples(term.column)
    values = raw[np.isfinite(raw)]
    n = int(values.size)
    att = att_lo = att_hi = None
    if limit is not None:
        if term.column == "itl_ms":
            k, total = int((values <= limit).sum()), n
        else:
            has = np.isfinite(raw)
            total = int((has | ~probe.ok).sum())  # a failed request missed the SLO
            k = int((has & probe.ok & (raw <= limit)).sum())
        if total:
            att = k / total
            att_lo, att_hi = rate_interval(k, total, confidence)
    if n == 0:
        # Every request failed: none met the SLO. No request at all: nothing to judge.
        verdict = "fail" if probe.requests > 0 and limit is not None else "inconclusive"
        return TermResult(
            term=term.text,
            metric=term.metric,
            limit=limit,
            value=None,
            lo=None,
            hi=None,
            n=0,
            verdict=verdict,
            attainment=att,
            attainment_lo=att_lo,
            attainment_hi=att_hi,
        )
    value = percentile(values, term.q)
    lo, hi = percentile_interval(values, term.q, confidence)
    if limit is None:
        verdict = "inconclusive"
    else:
        verdict = "pass" if hi <= limit else "fail" if lo > limit else "inconclusive"
    return TermResult(
        term=term.text,
        metric=term.metric,
        limit=limit,
        value=value,
        lo=lo if math.isfinite(lo) else None,
        hi=hi if math.isfinite(hi) else None,
        n=n,
        verdict=verdict,
        attainment=att,
        attainment_lo=att_lo,
        attainment_hi=att_hi,
    )


def resolve_limits(terms: Sequence[SloTerm], reference: ProbeSamples) -> list[float | None]:
    """Absolute limits: a relative term's is its factor times the reference probe's point value."""
    out: list[float | None] = []
    for t in terms:
        if t.factor is None:
            out.append(t.limit)
            continue
        assert t.column is not None and t.q is not None
        raw = reference.samples(t.column)
        values = raw[np.isfinite(raw)]
        out.append(t.factor * percentile(values, t.q) if values.size else None)
    return out


def judge_probe(
    index: int,
    terms: Sequence[SloTerm],
    limits: Sequence[float | None],
    probe: ProbeSamples,
    confidence: float,
) -> ProbeResult:
    """Every term on one probe, and the probe's verdict (fail > inconclusive > pass)."""
    results = [judge_term(t, lim, probe, confidence) for t, lim in zip(terms, limits, strict=True)]
    failed = [r for r in results if r.verdict == "fail"]
    unsure = [r for r in results if r.verdict == "inconclusive"]
    verdict: Verdict
    if failed:
        verdict = "fail"
        note = "beyond the SLO: " + "; ".join(_beyond(r) for r in failed)
        cpu = probe.client_cpu_pct
        if cpu is not None and cpu > CLIENT_CPU_BOUND_PCT:
            # The client's CPU, not the target, may have made it late: lateness is in *_from_intended.
            verdict = "inconclusive"
            note = f"client-bound (client CPU {cpu:.0f} %), so a failure cannot be laid on the target; {note}"
    elif unsure:
        verdict = "inconclusive"
        note = "cannot tell: " + "; ".join(_straddles(r) for r in unsure)
    else:
        verdict = "pass"
        note = "every term's interval is within its limit"
    if probe.requests == 0:
        verdict, note = "inconclusive", "the probe sent no request"
    return ProbeResult(
        index=index,
        rate=probe.rate,
        requests=probe.requests,
        errors=probe.errors,
        achieved_rate=probe.achieved_rate,
        seconds=probe.seconds,
        terms=results,
        verdict=verdict,
        note=note,
        client_cpu_pct=probe.client_cpu_pct,
        client_bound=probe.client_bound,
        dir=probe.dir,
    )


def _beyond(r: TermResult) -> str:
    u = r.unit
    if r.value is None:
        return f"{r.metric}: no sample (every request failed)"
    return (
        f"{r.metric} {format_value(r.value, u)} {format_interval(r.lo, r.hi, u)} > {format_value(r.limit, u)}"
    )


def _straddles(r: TermResult) -> str:
    u = r.unit
    if r.limit is None:
        return f"{r.metric}: the reference probe gave no value to scale"
    if r.value is None:
        return f"{r.metric}: no sample"
    return f"{r.metric} {format_interval(r.lo, r.hi, u)} straddles {format_value(r.limit, u)}"
