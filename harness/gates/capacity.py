"""``harness capacity``: the highest open-loop arrival rate at which a target meets its SLO.

A **probe** is one open-loop replay of the corpus at a constant rate ``r`` through the load stage's
pacer (:func:`harness.load.runner.run_locust`), kept as an ordinary run directory under
``OUT/probes/NN-<r>rps/`` so the gates and reports read it like any run. Each probe sends
``max(--probe-requests, r · --probe-seconds)`` requests.

**The SLO** (:func:`parse_slo`) is a comma-separated list of ``metric<=value`` terms:
``ttft_pXX`` and ``e2e_pXX`` (judged on ``ttft_from_intended_ms`` / ``e2e_from_intended_ms``: above
capacity an open-loop probe queues, and the wait is part of what a user sees), ``tpot_pXX`` and
``itl_pXX`` (as recorded), ``XX`` one of 50/90/95/99, values in ms; and ``error_rate``. A latency
value may be relative, ``ttft_p95<=3x``: three times that percentile on the **reference probe**
(the first, lowest-rate one, nearly unloaded), which makes an SLO that travels between machines.

**A probe's verdict** uses the gates' intervals at ``confidence``: a percentile with its
order-statistic interval (:func:`harness.common.stats.percentile_interval`), the error rate with its
Clopper–Pearson interval (:func:`harness.gates.metrics.rate_interval`). A term *passes* when its whole
interval is within the limit, *fails* when the whole interval is beyond it, and is *inconclusive*
otherwise; the probe fails if a term fails, is inconclusive if one is, and passes if every term
does. For every latency term the **SLO attainment** is recorded too: the share of requests that met
the limit (a failed request did not), with its Clopper–Pearson interval.

**The search** (:func:`search`, which takes the probe as a function, so it is tested without
Locust): from the start rate (``--min-rate``, or half of what one stream sustains, from a short
sequential calibration) the rate doubles until a probe does not pass, which brackets the knee; then
bisection (geometric mean) between the highest passing and the lowest not-passing rate until
``high / low ≤ 1 + resolution`` or ``--max-probes`` is spent. A monotone (isotonic) fit of each term
against the offered rate gives the interpolated crossing inside the bracket. **A cliff**: between the
last passing and the first failing rate some term jumps from comfortably within (≤ half its limit) to
far beyond (≥ 3× its limit; an error rate ≥ max(3× the limit, 10 %)).

The answer (:class:`CapacityResult`, ``OUT/capacity.json``): ``capacity_rps`` (the fitted crossing,
clamped into ``[low, high]``; ``low`` when no fit binds), ``low`` (highest passing rate), ``high``
(lowest not-passing rate; ``null`` when every probe passed). Exit codes (:attr:`CapacityResult.exit_code`):
0 a rate meets the SLO (``bounded: false`` when none failed up to ``--max-rate``: "at least"); 1 not
even the lowest rate does; 6 the lowest rate could not be judged (its interval straddles a limit).
"""

from __future__ import annotations

import math
import re
import shlex
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from harness.common import console as cons
from harness.common.errors import ConfigError, ExitCode, UnavailableError
from harness.common.io import write_json
from harness.common.model import StrictModel
from harness.common.stats import percentile, percentile_interval
from harness.gates.driver import (
    ERRORS_BY_CODE,
    Ui,
    check_out_dir,
    check_serve_args,
    clear_out_dir,
    log_tail,
    open_target,
    sigterm_interrupts,
)
from harness.gates.metrics import format_interval, format_value, min_samples_for_bound, rate_interval
from harness.gates.target import NotExposed, Target, flush_all
from harness.load.arrivals import RequestSpec
from harness.load.results import RECORDS_FILE, metric_values
from harness.load.runner import LoadSpec, run_locust

DEFAULT_SLO = "ttft_p95<=3x,error_rate<=0.05"
"""Default SLO: P95 TTFT (from intended send) at most 3× the nearly unloaded reference probe's, and
at most 5 % errors. Relative, so it holds on any machine; 5 % (not 1 %) because a probe of 100
requests can prove an error rate below 3.6 % at best (Clopper–Pearson, 95 %): a 1 % term needs 368."""
CAPACITY_FILE = "capacity.json"
PROBES_DIR = "probes"
SERVER_DIR = "server"
OUTPUTS = (PROBES_DIR, SERVER_DIR, CAPACITY_FILE)
"""Everything ``harness capacity`` writes under ``OUT`` (``--force`` removes exactly these)."""
PROBE_STAGE = "capacity"
"""``X-Traffic-Stage`` of probe requests."""
CLIFF_FACTOR = 3.0
"""A failing probe this many times beyond a limit, next to a passing one within half of it: a cliff."""
CLIFF_MIN_ERROR_RATE = 0.10
CLIENT_CPU_BOUND_PCT = 90.0
"""A failing probe whose client used more CPU than this cannot blame the target."""
MAX_AUTO_CONCURRENCY = 512

Verdict = Literal["pass", "fail", "inconclusive"]

# ------------------------------------------------------------------------------------------- SLO

_COLUMNS: dict[str, str] = {
    "ttft": "ttft_from_intended_ms",
    "e2e": "e2e_from_intended_ms",
    "tpot": "tpot_ms",
    "itl": "itl_ms",
}
"""SLO metric → the record field it is judged on."""
_QUANTILES = (50, 90, 95, 99)
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
    name, _, q_text = metric.partition("_p")
    if name not in _COLUMNS or not q_text.isdigit() or int(q_text) not in _QUANTILES:
        raise bad(
            "unknown metric; known: "
            + ", ".join(f"{n}_p{{{'/'.join(map(str, _QUANTILES))}}}" for n in _COLUMNS)
            + ", error_rate"
        )
    q = int(q_text)
    if value.endswith("x"):
        factor = _number(value[:-1], bad)
        if factor < 1:
            raise bad("a relative limit is at least 1x the reference probe's value")
        return SloTerm(
            text=raw.strip(), metric=metric, kind="percentile", column=_COLUMNS[name], q=q, factor=factor
        )
    limit = _number(value.removesuffix("ms"), bad)
    if limit <= 0:
        raise bad("a latency limit is above 0 ms")
    return SloTerm(
        text=raw.strip(), metric=metric, kind="percentile", column=_COLUMNS[name], q=q, limit=limit
    )


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
        from harness.load.results import SUMMARY_FILE, read_records, read_summary

        records = list(read_records(run_dir / RECORDS_FILE)) if (run_dir / RECORDS_FILE).exists() else []
        columns = {
            col: np.asarray(
                [np.nan if getattr(r, col) is None else float(getattr(r, col)) for r in records],
                dtype=np.float64,
            )
            for col in _COLUMNS.values()
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


def _unit(r: TermResult) -> str:
    return "ratio" if r.metric == "error_rate" else "ms"


def _beyond(r: TermResult) -> str:
    u = _unit(r)
    if r.value is None:
        return f"{r.metric}: no sample (every request failed)"
    return (
        f"{r.metric} {format_value(r.value, u)} {format_interval(r.lo, r.hi, u)} > {format_value(r.limit, u)}"
    )


def _straddles(r: TermResult) -> str:
    u = _unit(r)
    if r.limit is None:
        return f"{r.metric}: the reference probe gave no value to scale"
    if r.value is None:
        return f"{r.metric}: no sample"
    return f"{r.metric} {format_interval(r.lo, r.hi, u)} straddles {format_value(r.limit, u)}"


# ------------------------------------------------------------------------------------------ fit


def isotonic_increasing(values: Sequence[float], weights: Sequence[float] | None = None) -> list[float]:
    """The non-decreasing sequence closest to ``values`` in weighted least squares (pool adjacent
    violators): latency and errors do not fall when the offered rate rises, so a dip is noise."""
    w = [1.0] * len(values) if weights is None else [float(x) for x in weights]
    blocks: list[list[float]] = []  # [mean, weight, count]
    for v, wt in zip(values, w, strict=True):
        blocks.append([float(v), wt, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            b = blocks.pop()
            a = blocks[-1]
            total = a[1] + b[1]
            a[0] = (a[0] * a[1] + b[0] * b[1]) / total
            a[1] = total
            a[2] += b[2]
    out: list[float] = []
    for mean, _, count in blocks:
        out += [mean] * int(count)
    return out


def crossing(
    rates: Sequence[float], values: Sequence[float], limit: float, low: float, high: float
) -> float | None:
    """Where the isotonic fit of ``values`` against ``rates`` crosses ``limit`` inside ``[low, high]``
    (linear between the fitted values at ``low`` and ``high``); ``None`` when it does not cross there
    (the term does not bind in the bracket)."""
    pts = sorted((r, v) for r, v in zip(rates, values, strict=True) if math.isfinite(v))
    if not pts:
        return None
    fitted = isotonic_increasing([v for _, v in pts])
    at = dict(zip([r for r, _ in pts], fitted, strict=True))
    if low not in at or high not in at:
        return None
    f_lo, f_hi = at[low], at[high]
    if f_hi <= limit:
        return None
    if f_lo >= limit:
        return low
    return low + (limit - f_lo) / (f_hi - f_lo) * (high - low)


# ------------------------------------------------------------------------------------------ result


class Calibration(StrictModel):
    """The sequential calibration that picked the start rate."""

    requests: int
    service_ms: float
    """Median time of one request sent alone."""
    start_rate: float


class CapacityResult(StrictModel):
    """``OUT/capacity.json`` (and ``--json``): the answer, its interval and every probe."""

    schema_version: int = 1
    capacity_rps: float
    """The highest rate that meets every SLO term: the fitted crossing clamped into ``[low, high]``,
    ``low`` when no fit binds there, 0 when not even the lowest rate does."""
    low: float
    """Highest rate whose probe passed (0 when none did)."""
    high: float | None
    """Lowest rate whose probe did not pass (``null``: every probe passed, up to ``--max-rate``)."""
    high_verdict: Verdict | None = None
    """Whether ``high``'s probe failed or was inconclusive."""
    bounded: bool
    """Whether a probe failed above ``low``: ``false`` means capacity is *at least* ``low``."""
    cliff: bool = False
    cliff_rates: list[float] | None = None
    """``[low, high]`` across which a term jumped from within half its limit to 3× beyond it."""
    cliff_term: str | None = None
    slo: str
    terms: list[SloTerm]
    limits: list[float | None]
    """Each term's absolute limit (relative terms resolved on the reference probe)."""
    confidence: float
    resolution: float
    probes: list[ProbeResult]
    reference: str | None
    """The reference probe's run directory (the first, lowest-rate probe)."""
    calibration: Calibration | None = None
    reason: str
    exit_code: int
    target: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    interrupted: bool = False


def search(
    measure: Callable[[float], ProbeSamples],
    terms: Sequence[SloTerm],
    *,
    start: float,
    max_rate: float | None = None,
    growth: float = 2.0,
    resolution: float = 0.10,
    max_probes: int = 12,
    confidence: float = 0.95,
    on_probe: Callable[[ProbeResult, list[ProbeResult]], None] | None = None,
    slo_text: str = "",
) -> CapacityResult:
    """Bracket the knee by growing the rate ×``growth``, then bisect it (see the module docstring).

    ``measure(rate)`` runs one probe; ``on_probe(result, so_far)`` is called after each (progress,
    ``capacity.json`` rewritten).
    """
    if start <= 0 or (max_rate is not None and start > max_rate):
        raise ConfigError(f"the start rate {start:g} must be in (0, --max-rate]", field="--min-rate")
    if growth <= 1:
        raise ConfigError("must be above 1", field="--growth")
    if resolution <= 0:
        raise ConfigError("must be above 0", field="--resolution")
    if max_probes < 1:
        raise ConfigError("at least one probe", field="--max-probes")
    probes: list[ProbeResult] = []
    limits: list[float | None] = []

    def run(rate: float) -> ProbeResult:
        nonlocal limits
        rate = float(f"{rate:.4g}")  # a rate a person can type again (and a probe directory's name)
        samples = measure(rate)
        if not probes:
            limits = resolve_limits(terms, samples)
        result = judge_probe(len(probes) + 1, terms, limits, samples, confidence)
        probes.append(result)
        if on_probe is not None:
            on_probe(result, probes)
        return result

    first = run(start)
    # Rates as the probes report them (rounded), so that a bracket end always names a probe.
    low: float | None = first.rate if first.verdict == "pass" else None
    high: ProbeResult | None = None if low is not None else first
    while low is not None and high is None and len(probes) < max_probes:
        if max_rate is not None and low >= max_rate:
            break
        rate = low * growth if max_rate is None else min(low * growth, max_rate)
        p = run(rate)
        if p.verdict == "pass":
            low = p.rate
        else:
            high = p
    while (
        low is not None and high is not None and high.rate / low > 1 + resolution and len(probes) < max_probes
    ):
        p = run(math.sqrt(low * high.rate))
        if p.verdict == "pass":
            low = p.rate
        else:
            high = p
    return _answer(
        terms,
        limits,
        probes,
        low,
        high,
        max_rate=max_rate,
        max_probes=max_probes,
        confidence=confidence,
        resolution=resolution,
        slo_text=slo_text,
    )


def _answer(
    terms: Sequence[SloTerm],
    limits: Sequence[float | None],
    probes: list[ProbeResult],
    low: float | None,
    high: ProbeResult | None,
    *,
    max_rate: float | None,
    max_probes: int,
    confidence: float,
    resolution: float,
    slo_text: str,
) -> CapacityResult:
    common = {
        "slo": slo_text or ",".join(t.text for t in terms),
        "terms": list(terms),
        "limits": list(limits),
        "confidence": confidence,
        "resolution": resolution,
        "probes": probes,
        "reference": probes[0].dir if probes else None,
    }
    if low is None:
        assert high is not None
        code = ExitCode.CHECK_FAILED if high.verdict == "fail" else ExitCode.UNJUDGEABLE
        what = "no rate meets the SLO" if high.verdict == "fail" else "the lowest rate cannot be judged"
        return CapacityResult(
            capacity_rps=0.0,
            low=0.0,
            high=high.rate,
            high_verdict=high.verdict,
            bounded=True,
            reason=f"{what}: at {high.rate:.4g} req/s (the lowest probed), {high.note}",
            exit_code=int(code),
            **common,
        )
    if high is None:
        why = (
            f"--max-rate {max_rate:.4g} req/s reached"
            if max_rate is not None and low >= max_rate
            else f"--max-probes {max_probes} spent"
        )
        return CapacityResult(
            capacity_rps=low,
            low=low,
            high=None,
            bounded=False,
            reason=f"every probe passed up to {low:.4g} req/s ({why}): capacity is at least that",
            exit_code=0,
            **common,
        )
    # The fitted crossing: the lowest of each term's, among those that bind inside the bracket.
    rates = [p.rate for p in probes]
    crossings: list[float] = []
    for i, lim in enumerate(limits):
        if lim is None:
            continue
        vals = [math.nan if (v := p.terms[i].value) is None else v for p in probes]
        c = crossing(rates, vals, lim, low, high.rate)
        if c is not None:
            crossings.append(c)
    capacity = min(max(min(crossings), low), high.rate) if crossings else low
    cliff_term = _cliff(probes, limits, low, high)
    narrow = high.rate / low <= 1 + resolution
    reason = (
        f"{low:.4g} req/s passes and {high.rate:.4g} req/s "
        + ("fails" if high.verdict == "fail" else "is inconclusive (counted as not passing)")
        + f" ({high.note})"
        + (
            ""
            if narrow
            else f"; --max-probes {max_probes} spent before the bracket narrowed to {resolution:.0%}"
        )
    )
    if cliff_term is not None:
        reason += f"; a cliff in {cliff_term} between them"
    return CapacityResult(
        capacity_rps=capacity,
        low=low,
        high=high.rate,
        high_verdict=high.verdict,
        bounded=True,
        cliff=cliff_term is not None,
        cliff_rates=[low, high.rate] if cliff_term is not None else None,
        cliff_term=cliff_term,
        reason=reason,
        exit_code=0,
        **common,
    )


def _cliff(
    probes: list[ProbeResult], limits: Sequence[float | None], low: float, high: ProbeResult
) -> str | None:
    """The term that jumps from within half its limit at ``low`` to far beyond it at ``high``."""
    if high.verdict != "fail":
        return None
    below = min(probes, key=lambda p: abs(p.rate - low))  # the passing probe at the bracket's low end
    for i, lim in enumerate(limits):
        if lim is None:
            continue
        a, b = below.terms[i], high.terms[i]
        far = (
            max(CLIFF_FACTOR * lim, CLIFF_MIN_ERROR_RATE) if b.metric == "error_rate" else CLIFF_FACTOR * lim
        )
        # No sample at all on the failing side (every request failed) is as far beyond as it gets.
        beyond = (b.value is None and b.verdict == "fail") or (b.value is not None and b.value >= far)
        if a.value is not None and a.value <= lim / 2 and beyond:
            return b.metric
    return None


# ------------------------------------------------------------------------------------------ output


def result_table(result: CapacityResult) -> Table:
    """One row per probe: rate, requests, each term's value with its interval, the verdict."""
    table = Table(title=f"capacity probes (SLO {result.slo}, {result.confidence:.0%} intervals)")
    table.add_column("#", justify="right")
    table.add_column("offered req/s", justify="right")
    table.add_column("achieved", justify="right")
    table.add_column("requests", justify="right")
    table.add_column("errors", justify="right")
    for t, lim in zip(result.terms, result.limits, strict=True):
        table.add_column(f"{t.metric} ≤ {format_value(lim, t.unit)}", justify="right")
    table.add_column("verdict")
    colours = {"pass": "green", "fail": "red", "inconclusive": "yellow"}
    for p in sorted(result.probes, key=lambda p: p.rate):
        cells = [
            str(p.index),
            f"{p.rate:.4g}",
            "—" if p.achieved_rate is None else f"{p.achieved_rate:.4g}",
            str(p.requests),
            str(p.errors),
        ]
        for r in p.terms:
            u = _unit(r)
            cells.append(f"{format_value(r.value, u)} {format_interval(r.lo, r.hi, u)}")
        cells.append(f"[{colours[p.verdict]}]{p.verdict}[/]")
        table.add_row(*cells)
    return table


def answer_line(result: CapacityResult) -> str:
    """One line: the capacity, its interval, and why."""
    if result.capacity_rps <= 0:
        return f"capacity: none — {result.reason}"
    if not result.bounded:
        return f"capacity: at least {result.low:.4g} req/s — {result.reason}"
    cliff = f", a cliff in {result.cliff_term}" if result.cliff else ""
    return (
        f"capacity: {result.capacity_rps:.4g} req/s (passes at {result.low:.4g}, not at {result.high:.4g}"
        f"{cliff}) under SLO {result.slo}"
    )


# ------------------------------------------------------------------------------------------ running


@dataclass
class CapacitySpec:
    """Everything ``harness capacity`` is configured with."""

    out: Path
    load: LoadSpec
    """Load options of every probe (corpus, caps, api …); host, results_dir, rate, duration,
    max_requests and stage are set per probe."""
    slo: str = DEFAULT_SLO
    serve_args: Sequence[str] | None = ("--preset", "tiny", "--cache")
    url: str | None = None
    min_rate: float | None = None
    """Start rate; ``None``: from a sequential calibration."""
    max_rate: float | None = None
    growth: float = 2.0
    resolution: float = 0.10
    max_probes: int = 12
    probe_requests: int = 100
    probe_seconds: float = 5.0
    until_precision: float | str | None = None
    """``--until-precision``: a probe stops sending once every percentile term's interval is this
    precise (the load stage's rule, ``harness.load.precision``), never before the fewest requests the
    SLO can pass with (:func:`probe_min_requests`); ``probe_requests`` stays its most."""
    """A probe lasts at least this long (more requests at high rates)."""
    confidence: float = 0.95
    calibration_requests: int = 4
    flush: bool = True
    """Empty the target's cache levels before each probe (where it exposes them)."""
    bypass_cache: bool = True
    """Send every probe request with ``Cache-Control: no-cache``: a response cache would otherwise
    answer repeats and the capacity measured would be the cache's."""
    force: bool = False
    probe_timeout_s: float | None = None
    """Seconds a probe may take (default: its send time + the drain timeout + 120 s)."""
    server_timeout_s: float = 300.0


def check_spec(spec: CapacitySpec) -> list[SloTerm]:
    """Check every option before a target starts; the parsed SLO."""
    terms = parse_slo(spec.slo)
    if not 0.5 <= spec.confidence < 1:
        raise ConfigError(f"must be in [0.5, 1), got {spec.confidence}", field="--confidence")
    if spec.probe_requests < 1:
        raise ConfigError("at least one request", field="--probe-requests")
    check_probe_size(terms, spec.probe_requests, spec.confidence)
    for name, value in (("--min-rate", spec.min_rate), ("--max-rate", spec.max_rate)):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise ConfigError(f"must be a positive rate, got {value}", field=name)
    if spec.min_rate is not None and spec.max_rate is not None and spec.min_rate > spec.max_rate:
        raise ConfigError("--min-rate is above --max-rate", field="--min-rate")
    if spec.growth <= 1:
        raise ConfigError("must be above 1", field="--growth")
    if spec.resolution <= 0:
        raise ConfigError("must be above 0", field="--resolution")
    if spec.max_probes < 1:
        raise ConfigError("at least one probe", field="--max-probes")
    if spec.calibration_requests < 2 and spec.min_rate is None:
        raise ConfigError("at least 2 (the first one is a warm-up)", field="--calibration-requests")
    return terms


class CapacityRunner:
    """Runs a :class:`CapacitySpec` against a target: calibrates, probes, searches, writes the answer."""

    def __init__(self, spec: CapacitySpec, console: Console | None = None, *, ui: Ui | None = None) -> None:
        self.spec = spec
        self.out = spec.out.resolve()
        # ``harness run`` passes its own progress display (rich allows one live display at a time).
        self.ui = ui or Ui(console or cons.err())
        self.terms = check_spec(spec)
        self.started_at = datetime.now(UTC).isoformat()
        self.result: CapacityResult | None = None
        self.probes: list[ProbeResult] = []

    # ---- the whole command ------------------------------------------------------------------------

    def run(self) -> CapacityResult:
        """Start (or reach) the target, search, stop it; ``capacity.json`` after every probe."""
        spec = self.spec
        check_out_dir(self.out, OUTPUTS, force=spec.force, holds="an earlier capacity search")
        # A bad load option (--until-precision included) is an error now, not in the first probe.
        spec.load.replace(rate=1.0, max_requests=1, until_precision=spec.until_precision)
        serve_args = None if spec.url is not None else check_serve_args(list(spec.serve_args or ()))
        if spec.force:
            clear_out_dir(self.out, OUTPUTS)
        self.out.mkdir(parents=True, exist_ok=True)
        with (
            sigterm_interrupts(),
            self.ui.progress,
            open_target(
                spec.url,
                serve_args,
                self.out / SERVER_DIR,
                self.ui,
                spec.server_timeout_s,
                credentials=spec.load.options.credentials(),
            ) as target,
        ):
            return self.measure(target)

    def measure(self, target: Target, *, requests: Sequence[RequestSpec] | None = None) -> CapacityResult:
        """The search against a target that is already up (``harness run --rate 50%`` calls this,
        handing on the ``requests`` it read already)."""
        spec = self.spec
        self.out.mkdir(parents=True, exist_ok=True)
        if requests is None:
            from harness.load.inputs import Inputs

            requests = Inputs.load(spec.load.options.evolve(rate=1.0, duration=1.0), ladder=False).requests
        calibration = None
        start = spec.min_rate
        if start is None:
            calibration = self._calibrate(target, requests)
            start = calibration.start_rate
            if spec.max_rate is not None:
                start = min(start, spec.max_rate)
        prober = _LocustProber(self, target)

        def progress(p: ProbeResult, so_far: list[ProbeResult]) -> None:
            colour = {"pass": "green", "fail": "red", "inconclusive": "yellow"}[p.verdict]
            self.ui.say(f"  [{colour}]{p.verdict:<12}[/] {p.rate:.4g} req/s: {escape(p.note or '')}")
            self.probes = list(so_far)
            self._save_partial(self.probes, calibration, target)

        try:
            result = search(
                prober,
                self.terms,
                start=start,
                max_rate=spec.max_rate,
                growth=spec.growth,
                resolution=spec.resolution,
                max_probes=spec.max_probes,
                confidence=spec.confidence,
                on_probe=progress,
                slo_text=spec.slo,
            )
        except KeyboardInterrupt:
            self._save_partial(self.probes, calibration, target, interrupted=True)
            raise
        result = result.model_copy(
            update={
                "calibration": calibration,
                "target": target.url,
                "started_at": self.started_at,
                "finished_at": datetime.now(UTC).isoformat(),
            }
        )
        write_json(self.out / CAPACITY_FILE, result.model_dump(mode="json"))
        self.result = result
        return result

    def _save_partial(
        self,
        probes: list[ProbeResult],
        calibration: Calibration | None,
        target: Target,
        *,
        interrupted: bool = False,
    ) -> None:
        """``capacity.json`` while the search runs (or after it was interrupted): the probes so far."""
        partial = {
            "schema_version": 1,
            "partial": True,
            "interrupted": interrupted,
            "slo": self.spec.slo,
            "target": target.url,
            "started_at": self.started_at,
            "calibration": calibration.model_dump(mode="json") if calibration else None,
            "probes": [p.model_dump(mode="json") for p in probes],
        }
        write_json(self.out / CAPACITY_FILE, partial)

    def _calibrate(self, target: Target, specs: Sequence[RequestSpec]) -> Calibration:
        """Send a few requests one at a time; the start rate is half of what one stream sustains."""
        n = self.spec.calibration_requests
        picked = [specs[i % len(specs)] for i in range(n)]
        times: list[float] = []
        with self.ui.step(f"calibrating: {n} requests one at a time"):
            for i, spec in enumerate(picked):
                t0 = time.perf_counter()
                try:
                    (res,) = target.probe([spec], no_cache=self.spec.bypass_cache, concurrency=1)
                except NotExposed as exc:  # pragma: no cover - probe does not raise it; defensive
                    raise UnavailableError(str(exc)) from None
                elapsed = time.perf_counter() - t0
                if not res.ok:
                    raise UnavailableError(
                        f"calibration request {i + 1} failed ({res.error}): the target does not serve",
                        hint="check the target, or give --min-rate to skip the calibration",
                    )
                if i > 0:  # the first one pays for connections, lazy loading, compilation
                    times.append(elapsed)
        service = float(np.median(times))
        start = 0.5 / service
        self.ui.say(
            f"[green]✓[/] one request alone takes {service * 1000:.0f} ms: starting at {start:.3g} req/s "
            "(half of what one stream sustains)"
        )
        return Calibration(requests=n, service_ms=service * 1000.0, start_rate=start)


class _LocustProber:
    """The real probe: a headless Locust replay at a constant rate into ``OUT/probes/NN-<r>rps``."""

    def __init__(self, runner: CapacityRunner, target: Target) -> None:
        self.runner = runner
        self.target = target
        self.count = 0

    def __call__(self, rate: float) -> ProbeSamples:
        spec = self.runner.spec
        ui = self.runner.ui
        self.count += 1
        index = self.count
        n = max(spec.probe_requests, math.ceil(rate * spec.probe_seconds))
        duration = n / rate
        results = self.runner.out / PROBES_DIR / f"{index:02d}-{rate:.4g}rps"
        if spec.flush:
            flushed = flush_all(self.target)
            if index == 1:
                for f in flushed:
                    mark = (
                        "[green]✓[/] flushed before each probe:" if f.status == "flushed" else "[yellow]–[/]"
                    )
                    ui.say(f"{mark} {escape(f.detail)}")
        given = spec.load.options
        concurrency = given.concurrency if given.is_set("concurrency") else min(n, MAX_AUTO_CONCURRENCY)
        load = spec.load.replace(
            host=self.target.url,
            results_dir=results,
            rate=rate,
            duration=duration,
            max_requests=n,
            stage=PROBE_STAGE,
            schedule=None,
            speedup=None,
            concurrency=concurrency,
            start_delay=given.start_delay if given.is_set("start_delay") else 1.0,
            bypass_fraction=1.0 if spec.bypass_cache else given.bypass_fraction,
        )
        watched = precision_on(self.runner.terms)
        if spec.until_precision is not None and watched is not None:
            load = load.replace(
                until_precision=spec.until_precision,
                precision_on=watched,
                precision_confidence=spec.confidence,
                precision_min_samples=probe_min_requests(self.runner.terms, spec.confidence),
            )
        timeout = spec.probe_timeout_s or duration + load.options.drain_timeout + 120.0
        ui.say(f"[dim]$ locust {escape(shlex.join(load.command()[3:]))}[/]")
        started = time.monotonic()
        with ui.phase(f"probe {index}: {rate:.4g} req/s", results / RECORDS_FILE, n):
            code = run_locust(load, timeout_s=timeout)
        seconds = round(time.monotonic() - started, 3)
        log = results / "locust.log"
        if code in ERRORS_BY_CODE:
            raise ERRORS_BY_CODE[code](f"probe {index} exited with {code}: {log_tail(log)}", file=log)
        if code == int(ExitCode.INTERRUPTED):
            raise UnavailableError(
                f"probe {index} did not end within {timeout:g} s and was stopped", file=log
            )
        if not (results / "summary.json").exists():
            raise UnavailableError(f"probe {index} wrote no summary (exit {code}): {log_tail(log)}", file=log)
        return ProbeSamples.from_run(rate, results, seconds)


def read_capacity(path: str | Path) -> CapacityResult:
    """A ``capacity.json`` written by ``harness capacity`` (a partial one, of an interrupted search, is
    refused: it holds no answer)."""
    from harness.common.io import read_json

    return read_json(path, CapacityResult, expected="a capacity result (harness capacity)")
