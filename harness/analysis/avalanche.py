"""Cache avalanche risk and recovery time (RTO).

**Avalanche.** Keys written together (a warmup, a deploy, one value tier) expire together, and the
requests for them all reach the engine at once. For each key class ``i`` (a value tier, a tenant,
or a class you describe), ``p_i`` is the share of its keys that expire within one critical window
``Δ`` (the time the backend needs to absorb a wave; default 60 s): measured as the largest share of
the class's expiry times inside any window of length ``Δ``, or, for a class described by its write
span ``S`` and TTL jitter ``J`` (expiries spread uniformly over ``S + J``), ``p_i = min(1, Δ/(S+J))``.
Treating classes as independent, the probability that at least one class avalanches is

    P = 1 − Π (1 − p_i)

and the advice is the jitter that brings every class to the per-class share ``p* = 1 − (1 − P*)^(1/m)``
needed for a target ``P*``: ``J_i = max(0, Δ/p* − S_i)``.

Measured expiry comes from the server's saved cache state (``<state_dir>/l3/<tenant>/meta.json``:
each entry's write time, ``expires_at`` and value tier) or from a live server (``/cache/stats`` TTLs
per tier and ``cache_writebacks_total{value_tier}`` from ``/metrics``, with a write span you give).

**RTO.** After ``N`` keys expire at once the engine must regenerate them while still serving the
normal misses. With a mean generation time ``g`` per request, ``s`` decode slots and a baseline
engine utilization ``ρ``, the rebuild needs at least ``W = N·g / (s·(1 − ρ))`` seconds of spare
capacity. The prediction is linear in it,

    RTO = c0 + c1 · W

with ``c0`` the fixed part (detection, failover) and ``c1`` the contention factor (1 for a perfect
rebuild). Both are calibrated from measured runs by non-negative least squares (:func:`calibrate`);
:func:`measure_rto` measures a run's RTO from its records (time until the windowed hit rate is back
to a share of its baseline).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import orjson
from pydantic import Field

from harness.common.errors import InputError
from harness.common.io import check_input_file, iter_jsonl
from harness.common.model import StrictModel
from harness.common.prometheus import parse_exposition
from harness.common.stats import Distribution


class KeyClass(StrictModel):
    """A class of keys described by how they were written (when expiry times are not measured)."""

    name: str
    keys: int = Field(ge=0)
    ttl_s: float = Field(gt=0.0)
    write_span_s: float = Field(default=0.0, ge=0.0)
    """Seconds over which the class's keys were written (a warmup's duration; 0: all at once)."""
    jitter_s: float = Field(default=0.0, ge=0.0)
    """Width of the uniform random TTL jitter, if any."""


class ClassRisk(StrictModel):
    name: str
    keys: int
    ttl_s: float | None
    spread_s: float
    """Over how long the class's expiries are spread."""
    p: float = Field(ge=0.0, le=1.0)
    """Share of the class's keys expiring within one window."""
    together: float
    """Keys expiring within one window: ``keys · p``."""
    jitter_s: float | None = None
    """TTL jitter that would bring this class to the per-class target share (with a target)."""
    source: str


class AvalancheReport(StrictModel):
    window_s: float
    probability: float
    """``P = 1 − Π(1 − p_i)``."""
    target: float | None = None
    per_class_target: float | None = None
    classes: list[ClassRisk]


def p_modelled(write_span_s: float, jitter_s: float, window_s: float) -> float:
    """``min(1, Δ/(S + J))``: expiries spread uniformly over ``S + J`` seconds (1 if not spread)."""
    spread = write_span_s + jitter_s
    return 1.0 if spread <= window_s else window_s / spread


def p_measured(expiries_s: Iterable[float], window_s: float) -> float:
    """The largest share of ``expiries_s`` inside any window of length ``window_s`` (sliding)."""
    e = np.sort(np.asarray(list(expiries_s), dtype=np.float64))
    if e.size == 0:
        return 0.0
    # For each expiry as a window start, how many fall in [e_i, e_i + Δ].
    ends = np.searchsorted(e, e + window_s, side="right")
    return float(np.max(ends - np.arange(e.size))) / e.size


def avalanche_probability(ps: Iterable[float]) -> float:
    """``1 − Π(1 − p_i)``."""
    q = 1.0
    for p in ps:
        q *= 1.0 - p
    return 1.0 - q


def per_class_target(target: float, classes: int) -> float:
    """The equal per-class share ``p*`` that gives ``P = target`` over ``classes`` classes."""
    return 1.0 - float((1.0 - target) ** (1.0 / max(1, classes)))


def assess(
    risks: Sequence[ClassRisk],
    window_s: float,
    target: float | None = None,
    spans: dict[str, float] | None = None,
) -> AvalancheReport:
    """The report for classes already measured or modelled; with ``target``, the jitter advice."""
    probability = avalanche_probability(r.p for r in risks)
    pct = per_class_target(target, len(risks)) if target is not None else None
    out: list[ClassRisk] = []
    for r in risks:
        jitter = None
        if pct is not None and pct > 0:
            write_span = (spans or {}).get(r.name, r.spread_s)
            jitter = max(0.0, window_s / pct - write_span) if r.p > pct else 0.0
        out.append(r.model_copy(update={"jitter_s": jitter}))
    return AvalancheReport(
        window_s=window_s, probability=probability, target=target, per_class_target=pct, classes=out
    )


def risks_from_classes(classes: Sequence[KeyClass], window_s: float) -> list[ClassRisk]:
    """Modelled risk of described classes."""
    return [
        ClassRisk(
            name=c.name,
            keys=c.keys,
            ttl_s=c.ttl_s,
            spread_s=c.write_span_s + c.jitter_s,
            p=p_modelled(c.write_span_s, c.jitter_s, window_s) if c.keys else 0.0,
            together=c.keys * (p_modelled(c.write_span_s, c.jitter_s, window_s) if c.keys else 0.0),
            source="model",
        )
        for c in classes
    ]


def read_classes(path: str | Path) -> list[KeyClass]:
    """Key classes from a JSONL (one :class:`KeyClass` per line)."""
    return [c for _, c in iter_jsonl(path, KeyClass, expected="a key class")]


def risks_from_state(state_dir: str | Path, window_s: float, by: str = "tier") -> list[ClassRisk]:
    """Measured risk per value tier (``by="tier"``) or per tenant and tier (``"tenant-tier"``) from a
    saved cache state: every L3 entry's write time (``completion.created``) and ``expires_at``."""
    root = Path(state_dir)
    l3 = root / "l3" if (root / "l3").is_dir() else root
    metas = sorted(l3.glob("*/meta.json")) if l3.is_dir() else []
    if not metas:
        raise InputError("no saved cache state (expected l3/<tenant>/meta.json)", file=root)
    expiries: dict[str, list[float]] = {}
    ttls: dict[str, list[float]] = {}
    for meta in metas:
        try:
            doc = orjson.loads(meta.read_bytes())
            tenant = str(doc["tenant"])
            entries = list(doc["entries"])
        except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
            raise InputError(f"unreadable cache state ({exc})", file=meta) from None
        for e in entries:
            try:
                tier = str(e["value_tier"])
                exp = float(e["expires_at"])
                created = float(e["completion"]["created"])
            except (KeyError, TypeError, ValueError) as exc:
                raise InputError(f"an entry lacks {exc}", file=meta, field="entries") from None
            name = tier if by == "tier" else f"{tenant}/{tier}"
            expiries.setdefault(name, []).append(exp)
            ttls.setdefault(name, []).append(exp - created)
    out: list[ClassRisk] = []
    for name in sorted(expiries):
        e = expiries[name]
        p = p_measured(e, window_s)
        ttl = Distribution.of(ttls[name]).p50
        out.append(
            ClassRisk(
                name=name,
                keys=len(e),
                ttl_s=ttl,
                spread_s=max(e) - min(e),
                p=p,
                together=p * len(e),
                source="cache-state",
            )
        )
    return out


def classes_from_server(stats: dict[str, object], metrics_text: str, write_span_s: float) -> list[KeyClass]:
    """Key classes per value tier from ``GET /cache/stats`` (TTLs) and ``/metrics`` (write-backs)."""
    ttl = stats.get("ttl_s")
    if not isinstance(ttl, dict):
        raise InputError("cache stats carry no ttl_s", field="ttl_s")
    writes: dict[str, float] = {}
    for s in parse_exposition(metrics_text, ["cache_writebacks_total"]):
        tier = dict(s.labels).get("value_tier", "")
        writes[tier] = writes.get(tier, 0.0) + s.value
    return [
        KeyClass(name=t, keys=int(writes.get(t, 0)), ttl_s=float(v), write_span_s=write_span_s)
        for t, v in ttl.items()
        if isinstance(v, int | float)
    ]


# --------------------------------------------------------------------------- RTO


class RtoCoefficients(StrictModel):
    """``RTO = c0 + c1 · W`` (seconds); defaults: no fixed part, a perfect rebuild."""

    c0: float = Field(default=0.0, ge=0.0)
    c1: float = Field(default=1.0, ge=0.0)
    calibrated_on: int = 0
    """Measured runs the coefficients were fitted to (0: defaults)."""
    rmse_s: float | None = None


class RtoCase(StrictModel):
    """One avalanche to predict, or (with ``rto_s``) one measured run to calibrate on."""

    expired_keys: int = Field(ge=0)
    gen_s: float = Field(gt=0.0)
    """Mean generation time of one miss (E2E of an engine-served request)."""
    slots: int = Field(ge=1)
    """Requests the engine decodes together (``max_num_seqs``)."""
    utilization: float = Field(default=0.0, ge=0.0, lt=1.0)
    """Share of the engine busy with normal traffic while it rebuilds."""
    rto_s: float | None = Field(default=None, ge=0.0)
    """Measured recovery time (calibration only)."""

    @property
    def work_s(self) -> float:
        """``W = N·g / (s·(1 − ρ))``: the rebuild's duration on the spare capacity."""
        return self.expired_keys * self.gen_s / (self.slots * (1.0 - self.utilization))


def predict_rto(case: RtoCase, coef: RtoCoefficients) -> float:
    """``c0 + c1 · W``."""
    return coef.c0 + coef.c1 * case.work_s


def calibrate(cases: Sequence[RtoCase]) -> RtoCoefficients:
    """Non-negative least squares of measured ``rto_s`` on ``[1, W]``; needs two distinct ``W``."""
    from scipy.optimize import nnls

    measured = [c for c in cases if c.rto_s is not None]
    if len(measured) < 2 or len({c.work_s for c in measured}) < 2:
        raise InputError(
            "calibration needs at least two measured runs with different rebuild work", field="rto_s"
        )
    a = np.asarray([[1.0, c.work_s] for c in measured], dtype=np.float64)
    b = np.asarray([c.rto_s for c in measured], dtype=np.float64)
    x, _ = nnls(a, b)
    resid = a @ x - b
    return RtoCoefficients(
        c0=float(x[0]),
        c1=float(x[1]),
        calibrated_on=len(measured),
        rmse_s=float(math.sqrt(np.mean(resid**2))),
    )


def read_cases(path: str | Path) -> list[RtoCase]:
    return [c for _, c in iter_jsonl(path, RtoCase, expected="an RTO case")]


def read_coefficients(path: str | Path) -> RtoCoefficients:
    from pydantic import ValidationError

    from harness.common.io import validation_input_error

    p = check_input_file(path)
    try:
        return RtoCoefficients.model_validate_json(p.read_bytes())
    except ValidationError as exc:
        raise validation_input_error(exc, file=p, expected="RTO coefficients") from None


def measure_rto(
    sent_s: Sequence[float],
    hit: Sequence[bool],
    event_s: float,
    *,
    window_s: float = 10.0,
    recover: float = 0.95,
) -> float | None:
    """Seconds from ``event_s`` until the hit rate over a trailing ``window_s`` is back to ``recover``
    × its value before the event (``None``: it never recovered, or there was no hit rate before).

    ``sent_s`` and ``hit`` describe the requests of a run (any order).
    """
    t = np.asarray(sent_s, dtype=np.float64)
    h = np.asarray(hit, dtype=np.float64)
    order = np.argsort(t, kind="stable")
    t, h = t[order], h[order]
    before = h[t < event_s]
    if before.size == 0 or before.mean() <= 0:
        return None
    goal = recover * float(before.mean())
    after = np.flatnonzero(t >= event_s + window_s)
    csum = np.concatenate([[0.0], np.cumsum(h)])
    for i in after.tolist():
        lo = int(np.searchsorted(t, t[i] - window_s, side="right"))  # the window (t − W, t]
        n = i + 1 - lo
        if n and (csum[i + 1] - csum[lo]) / n >= goal:
            return float(t[i] - event_s)
    return None


def measure_rto_run(
    run_dir: str | Path, event_s: float, *, window_s: float = 10.0, recover: float = 0.95
) -> float | None:
    """:func:`measure_rto` over a load run's records that carry an ``x-cache`` status (a hit as the
    summary's hit rate counts one, :func:`harness.load.results.cache_hit`: any ``HIT-*``)."""
    from harness.load.results import cache_hit, read_records, record_columns

    told = [r for r in read_records(run_dir) if r.cache is not None]
    if not told:
        raise InputError("no record carries an x-cache status", file=run_dir, field="cache")
    statuses, _, _ = record_columns(told)
    hits = cache_hit(statuses).tolist()
    return measure_rto([r.sent_s for r in told], hits, event_s, window_s=window_s, recover=recover)
