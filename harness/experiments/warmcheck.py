"""Is the target warm? Each cache level checked in the seed's order, embedding → KV → response.

Before a paired run measures its warm phase it asks every level it can see, and calls the target
warm only when none of them is cold and the **warm rate** is not shown below the seed's 92 % by the
exact count test (:mod:`harness.gates.power`, from below, at the run's confidence) *and* the probes
were enough to catch a cache only 60 % warm with power 0.95 (20 probes are; 10 are not: too few
probes cannot call a target warm, they say so and how many would):

``embedding``
    the semantic (L3) index: ``GET /cache/stats`` says it is enabled, holds entries, and loaded
    consistently (no tenant dropped for a checksum or schema mismatch). Write-backs still in
    flight are waited for first (``POST /cache/drain``).
``kv``
    the engine's prefix cache: probe requests sent with ``Cache-Control: no-cache`` (past any
    response cache, and storing nothing there) report ``cached_tokens > 0``. A target that reports
    no ``cached_tokens`` but whose ``/metrics`` has prefix-cache counters (:mod:`harness.load.server_metrics`:
    vLLM without ``--enable-prompt-tokens-details``, SGLang) is probed one request at a time instead,
    its counters read before and after each: a request's hit tokens are the counter's growth during
    its probe (so no other traffic may reach the target meanwhile). The level's ``evidence`` says
    which signal was used: ``cached_tokens`` or ``server_counter``.
``response``
    the response cache: the same probe requests, sent normally, come back with ``x-cache: HIT-*``.

The probes are a seeded sample of the requests the warm phase will send, sent with the load stage's
own bytes. The warm rate is the gates' ``warm_rate`` metric over the sampled requests (a request is
warm when the response cache answered its probe or the engine's prefix cache held it when the KV
probe came; among requests where the target reports either), computed by the same code
(:data:`harness.gates.metrics.METRICS`), with its exact binomial interval. Each signal is the one
taken before a probe of that prompt could change it (see :func:`_warm_frame`). A level the target does
not expose (404, no ``x-cache`` header, no ``cached_tokens``) is *skipped* and named. A probe that
misses the response cache stores its answer like any request: the check warms what it finds cold,
but its verdict is taken before.

Level status: ``warm`` (its hit share reaches the minimum warm rate), ``partial`` (some hits, fewer
than that: reported, not refused — a KV pool smaller than the corpus evicts, and the response cache
in front still serves), ``cold`` (none: refused), ``skipped``.

**Errors.** A probe the target answered with an error (or did not answer) says nothing about warmth,
but it is the target's error rate: every failed probe is counted (:attr:`WarmCheck.errors`, the count
and share with its exact interval) and named in the reason, so a target that errors is reported as
erroring, not only as "not warm"; ``harness run`` judges its gate's ``error_rate`` limits on that
count. A target whose every probe failed cannot be told warm or cold, and the reason says why.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from pydantic import Field

from harness.common.errors import HarnessError
from harness.common.model import StrictModel
from harness.common.registry import Registry
from harness.experiments.capacity_result import ErrorCount
from harness.gates.measurement import Measurement, MetricContext
from harness.gates.metrics import METRICS, format_value
from harness.gates.power import CountTest, describe_need
from harness.gates.runs import RunFrame
from harness.load.arrivals import RequestSpec
from harness.load.server_metrics import normalise
from harness.load.target import NotExposed, ProbeResult, TargetClient
from harness.load.telemetry import SCRAPE_TIMEOUT_S

SEED_WARM_RATE = 0.92
"""The seed's baseline: at least 92 % of requests served warm."""
COLD_WARM_RATE = 0.60
"""A warm rate the check must be able to catch (the power asked for below): a cache that lost two
fifths of its warmth. Fewer probes than that takes cannot call the target warm."""
WARM_CHECK_POWER = 0.95

LevelStatus = Literal["warm", "partial", "cold", "skipped"]
Evidence = Literal["cached_tokens", "server_counter"]
"""What a KV verdict rests on: the probes' own ``cached_tokens``, or the server's prefix-hit counter."""


class Rate(StrictModel):
    """A share with its exact interval (``value`` is ``None`` when nothing could be counted)."""

    value: float | None
    lo: float | None
    hi: float | None
    n: int

    @classmethod
    def of(cls, m: Measurement) -> Rate:
        def fin(x: float) -> float | None:
            return None if math.isnan(x) else x

        return cls(value=fin(m.value), lo=fin(m.lo), hi=fin(m.hi), n=m.n)

    def text(self) -> str:
        if self.value is None:
            return "—"
        return f"{format_value(self.value, 'ratio')} of {self.n} [{self.lo:.0%}, {self.hi:.0%}]"


class LevelCheck(StrictModel):
    """One level's answer."""

    level: str
    status: LevelStatus
    detail: str
    rate: Rate | None = None
    evidence: Evidence | None = None
    """The KV level: which signal its rate was counted from."""


class ProbeRow(StrictModel):
    """One probe request as recorded in ``warm-check.json``."""

    id: str
    kind: Literal["kv", "response"]
    status: int
    cache: str | None
    cached_tokens: int | None
    prompt_tokens: int | None
    ttft_ms: float | None
    error: str | None
    server_hit_tokens: float | None = None
    """KV probes on a target without ``cached_tokens``: how much its prefix-hit counter grew during
    this probe."""


class WarmCheck(StrictModel):
    """``warm-check.json``: the levels, the warm rate and the verdict."""

    warm: bool
    """Whether the target may be called warm: no level cold and the warm rate at least the minimum."""
    reason: str
    """One sentence: why it is warm or why not."""
    min_warm_rate: float
    warm_rate: Rate
    levels: list[LevelCheck]
    probes: list[ProbeRow] = Field(default_factory=list)
    kv_evidence: Evidence | None = None
    """What the KV signal of the warm rate rests on (``None``: the target gave none)."""
    errors: ErrorCount | None = None
    """The probes that failed (KV and response probes together), with their share's interval."""


@dataclass
class CheckContext:
    """What the level checks share: the target, the probe sample, the probes' answers so far."""

    target: TargetClient
    sample: Sequence[RequestSpec]
    min_warm_rate: float
    confidence: float = 0.95
    concurrency: int = 4
    kv_probes: list[ProbeResult] = field(default_factory=list)
    response_probes: list[ProbeResult] = field(default_factory=list)
    kv_server_hits: list[float | None] | None = None
    """Per KV probe, the server's prefix-hit counter growth (``None``: its ``cached_tokens`` was used)."""

    def kv_cached(self) -> list[float | None]:
        """Each KV probe's hit tokens: ``cached_tokens``, or the server counter's growth."""
        if self.kv_server_hits is not None:
            return list(self.kv_server_hits)
        return [None if p.cached_tokens is None else float(p.cached_tokens) for p in self.kv_probes]


LevelFn = Callable[[CheckContext], LevelCheck]
WARM_LEVELS: Registry[LevelFn] = Registry("warm-check level")
"""The levels in the order they are checked (the seed's: embedding → KV → response)."""


def _frame(probes: Sequence[ProbeResult], hits: Sequence[float | None] | None = None) -> RunFrame:
    """The probes as records; ``hits`` replaces their ``cached_tokens`` (the server counter's evidence)."""
    given = hits if hits is not None else [p.cached_tokens for p in probes]
    ok = [(p, h) for p, h in zip(probes, given, strict=True) if p.ok]
    cached = np.array([np.nan if h is None else h for _, h in ok], dtype=np.float64)
    return RunFrame.from_columns(
        len(ok), floats={"cached_tokens": cached}, text={"cache": [p.cache for p, _ in ok]}
    )


def _warm_frame(ctx: CheckContext) -> RunFrame:
    """One row per sampled request, with the signal each level gave *before* a probe could change it.

    The response probes' own ``cached_tokens`` cannot be used: the KV probes just ran the same
    prompts through the engine. Their ``x-cache`` can (the KV probes bypassed the response cache and
    stored nothing), and so can the KV probes' ``cached_tokens`` (the first time each prompt was
    probed). A request is warm when either level already held it — the gates' ``warm_rate``."""
    n = len(ctx.sample)
    kv = ctx.kv_probes if len(ctx.kv_probes) == n else [None] * n
    kv_hits = ctx.kv_cached() if len(ctx.kv_probes) == n else [None] * n
    resp = ctx.response_probes if len(ctx.response_probes) == n else [None] * n
    cached: list[float] = []
    cache: list[str | None] = []
    for k, h, r in zip(kv, kv_hits, resp, strict=True):
        cached.append(h if k is not None and k.ok and h is not None else np.nan)
        cache.append(r.cache if r is not None and r.ok else None)
    return RunFrame.from_columns(n, floats={"cached_tokens": np.array(cached)}, text={"cache": cache})


def _rate(
    metric: str, probes: Sequence[ProbeResult], confidence: float, hits: Sequence[float | None] | None = None
) -> Rate:
    return Rate.of(METRICS.get(metric).compute(_frame(probes, hits), MetricContext(confidence=confidence)))


def _grade(level: str, probes: Sequence[ProbeResult], rate: Rate, what: str, minimum: float) -> LevelCheck:
    failed = [p for p in probes if not p.ok]
    if probes and len(failed) == len(probes):
        return LevelCheck(level=level, status="cold", detail=f"every probe failed; first: {failed[0].error}")
    errors = f"; {len(failed)} probe(s) failed, first: {failed[0].error}" if failed else ""
    if rate.value is None or rate.n == 0:
        return LevelCheck(level=level, status="skipped", detail=f"the target reports no {what}{errors}")
    status: LevelStatus = "warm" if rate.value >= minimum else "partial" if rate.value > 0 else "cold"
    return LevelCheck(level=level, status=status, detail=f"{what}: {rate.text()}{errors}", rate=rate)


@WARM_LEVELS.register("embedding")
def _embedding(ctx: CheckContext) -> LevelCheck:
    try:
        ctx.target.cache_drain(60.0)
        stats = ctx.target.cache_stats()
    except NotExposed:
        return LevelCheck(level="embedding", status="skipped", detail="no /cache/stats: no response cache")
    l3: dict[str, Any] = ((stats or {}).get("tiers") or {}).get("l3") or {}
    if not l3.get("enabled", False):
        return LevelCheck(level="embedding", status="skipped", detail="the semantic cache (L3) is disabled")
    entries = int(l3.get("entries") or 0)
    consistency: dict[str, str] = l3.get("consistency") or {}
    dropped = {t: s for t, s in consistency.items() if s.startswith("dropped")}
    rebuilt = sorted(t for t, s in consistency.items() if s == "rebuilt")
    note = f"; rebuilt from its vectors on load: {', '.join(rebuilt)}" if rebuilt else ""
    if dropped:
        why = "; ".join(f"{t}: {s}" for t, s in dropped.items())
        return LevelCheck(level="embedding", status="cold", detail=f"semantic index inconsistent ({why})")
    if entries == 0:
        return LevelCheck(
            level="embedding",
            status="cold",
            detail="semantic index empty (prompts longer than HARNESS__CACHE__L3_MAX_CHARS skip L3; "
            "set HARNESS__CACHE__L3_ENABLED=false where that is every prompt)",
        )
    tenants = len(l3.get("tenants") or {})
    return LevelCheck(
        level="embedding",
        status="warm",
        detail=f"semantic index loaded: {entries} entries in {tenants} tenant index(es), consistent{note}",
    )


def server_prefix_hits(target: TargetClient) -> float | None:
    """The target's prefix-hit counter now (tokens, from its ``/metrics``); ``None`` when it has no
    ``/metrics``, refuses it, or reports no prefix-cache counters."""
    try:
        sample = normalise(target.metrics(timeout_s=SCRAPE_TIMEOUT_S), 0.0)
    except (HarnessError, ValueError):
        return None
    return sample.prefix_hits if sample.prefix_queries is not None else None


def _growth(before: float | None, after: float | None) -> float | None:
    """A counter's growth; ``None`` when a reading is missing or it went back (the server restarted)."""
    if before is None or after is None or after < before:
        return None
    return after - before


@WARM_LEVELS.register("kv")
def _kv(ctx: CheckContext) -> LevelCheck:
    before = server_prefix_hits(ctx.target)
    # The first probe alone: does the target report cached_tokens? Then the rest go in parallel.
    head = ctx.target.probe(ctx.sample[:1], no_cache=True, concurrency=1)
    reports = any(p.ok and p.cached_tokens is not None for p in head)
    if reports or before is None:
        ctx.kv_probes = head + ctx.target.probe(ctx.sample[1:], no_cache=True, concurrency=ctx.concurrency)
        rate = _rate("hit_rate_prefix", ctx.kv_probes, ctx.confidence)
        what = "prefix-cache hits (cached_tokens > 0, response cache bypassed)"
        check = _grade("kv", ctx.kv_probes, rate, what, ctx.min_warm_rate)
        return check.model_copy(update={"evidence": "cached_tokens"}) if rate.n else check
    # No cached_tokens, but the server counts its prefix hits: one probe at a time, read around each.
    after = server_prefix_hits(ctx.target)
    hits = [_growth(before, after)]
    probes = list(head)
    for spec in ctx.sample[1:]:
        before = after
        probes += ctx.target.probe([spec], no_cache=True, concurrency=1)
        after = server_prefix_hits(ctx.target)
        hits.append(_growth(before, after))
    ctx.kv_probes, ctx.kv_server_hits = probes, hits
    rate = _rate("hit_rate_prefix", probes, ctx.confidence, hits)
    what = (
        "prefix-cache hits by the server's own counter (its /metrics prefix hits grew during the probe; "
        "the target reports no cached_tokens; response cache bypassed)"
    )
    return _grade("kv", probes, rate, what, ctx.min_warm_rate).model_copy(
        update={"evidence": "server_counter"}
    )


@WARM_LEVELS.register("response")
def _response(ctx: CheckContext) -> LevelCheck:
    ctx.response_probes = ctx.target.probe(ctx.sample, concurrency=ctx.concurrency)
    told = {p.cache for p in ctx.response_probes if p.ok and p.cache is not None}
    if told == {"BYPASS"}:  # our server without --cache says BYPASS to everything
        return LevelCheck(
            level="response",
            status="skipped",
            detail="every probe bypassed the response cache (none in front)",
        )
    rate = _rate("hit_rate_any", ctx.response_probes, ctx.confidence)
    what = "response-cache hits (x-cache: HIT-*)"
    return _grade("response", ctx.response_probes, rate, what, ctx.min_warm_rate)


def check_warm(
    target: TargetClient,
    sample: Sequence[RequestSpec],
    *,
    min_warm_rate: float = SEED_WARM_RATE,
    confidence: float = 0.95,
    concurrency: int = 4,
) -> WarmCheck:
    """Check every level in :data:`WARM_LEVELS` order and decide whether the target is warm."""
    ctx = CheckContext(target, sample, min_warm_rate, confidence, concurrency)
    levels = [fn(ctx) for _, fn in WARM_LEVELS.items()]
    warm_rate = Rate.of(
        METRICS.get("warm_rate").compute(_warm_frame(ctx), MetricContext(confidence=confidence))
    )
    cold = [lv for lv in levels if lv.status == "cold"]
    # The exact count test, from below: not warm when the probes prove the warm rate under the minimum;
    # warm when they do not and they were enough to catch a cache at COLD_WARM_RATE.
    test = None
    if warm_rate.value is not None and warm_rate.n:
        hits = round(warm_rate.value * warm_rate.n)
        catch = min(COLD_WARM_RATE, 0.65 * min_warm_rate)
        test = CountTest(hits, warm_rate.n, min_warm_rate, catch, 1.0 - confidence, False, WARM_CHECK_POWER)
    shown = f"warm rate {format_value(warm_rate.value, 'ratio')} of {warm_rate.n} probes" if test else ""
    sent = [*ctx.kv_probes, *ctx.response_probes]
    failed = [p for p in sent if not p.ok]
    errors = ErrorCount.of(len(failed), len(sent), confidence)
    first = f" (first: {failed[0].error or f'HTTP {failed[0].status}'})" if failed else ""
    every_failed = bool(sent) and len(failed) == len(sent)
    if every_failed:
        # No probe was answered well: no level can be seen (not "cold"), and the errors are the finding.
        reason = f"cannot tell: every probe failed, the target answers errors: {errors.text()}{first}"
    elif cold:
        reason = "cold: " + "; ".join(f"{lv.level}: {lv.detail}" for lv in cold)
    elif test is None:
        reason = "cannot tell: the probes report neither x-cache nor cached_tokens, so no level is observable"
    elif test.failed:
        reason = (
            f"not warm: {shown} proves it below the minimum {format_value(min_warm_rate, 'ratio')} "
            f"(p = {test.p_value():.2g})"
        )
    elif not test.powered:
        reason = (
            f"cannot tell: {shown} is not below the minimum, but too few to catch a warm rate of "
            f"{format_value(test.p1 or 0.0, 'ratio')}: {describe_need(test)} (--probes)"
        )
    else:
        skipped = [lv.level for lv in levels if lv.status == "skipped"]
        reason = (
            f"warm: {shown}, not below {format_value(min_warm_rate, 'ratio')} (power {test.power:.2f})"
            + (f" (not observable here: {', '.join(skipped)})" if skipped else "")
        )
    if failed and not every_failed:
        reason += f"; the target answered errors to probes: {errors.text()}{first}"
    warm = not every_failed and not cold and test is not None and not test.failed and test.powered
    server_hits = ctx.kv_server_hits or [None] * len(ctx.kv_probes)
    rows = [_row(p, "kv", h) for p, h in zip(ctx.kv_probes, server_hits, strict=True)]
    rows += [_row(p, "response") for p in ctx.response_probes]
    kv_level = next((lv for lv in levels if lv.level == "kv"), None)
    kv_evidence = kv_level.evidence if kv_level is not None else None
    if kv_evidence == "server_counter":
        reason += " (KV evidence: the server's prefix-hit counter; the target reports no cached_tokens)"
    return WarmCheck(
        warm=warm,
        reason=reason,
        min_warm_rate=min_warm_rate,
        warm_rate=warm_rate,
        levels=levels,
        probes=rows,
        kv_evidence=kv_evidence,
        errors=errors,
    )


def _row(p: ProbeResult, kind: Literal["kv", "response"], server_hits: float | None = None) -> ProbeRow:
    return ProbeRow(
        server_hit_tokens=server_hits,
        id=p.id,
        kind=kind,
        status=p.status,
        cache=p.cache,
        cached_tokens=p.cached_tokens,
        prompt_tokens=p.prompt_tokens,
        ttft_ms=p.ttft_ms,
        error=p.error,
    )
