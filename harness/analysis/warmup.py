"""Warmup planning: what to preload before a cold start, and how to ramp traffic up afterwards.

1. **Predict reuse.** Every key (a prompt, or a KV block of a prefix) gets a predicted value from
   the history by a predictor from :data:`PREDICTORS`:

   * ``recent`` (default): the history ended just before the cold start (yesterday's log): a
     reference weighs ``exp(−(T − t)/τ)`` from the end ``T`` (an exponentially weighted request
     rate; ``τ`` defaults to the evaluation window's span);
   * ``frequency``: plain counts;
   * ``replay``: the history *is* the traffic about to come (the trace the load stage will replay):
     a reference at offset ``t`` from the start weighs ``exp(−t/τ)``. It only makes sense in
     sample (see 3).

2. **Pick the preload set.** The ``capacity`` best keys, in the trace's unit. For KV blocks the
   server can only be warmed by sending prompts, so the plan also picks the requests whose prompts
   cover the chosen blocks (each prompt brings its whole prefix chain).

3. **Judge it out of sample.** A plan is built from a history and meets the traffic *after* it, so
   that is how it is judged: by default the history's last 10 % is the evaluation window and the
   same procedure (predictor, capacity) plans from the requests before it (a backtest); with
   another trace as the window (``--eval``) the plan from the whole history is judged on it. The
   window is simulated from the preload under the target cache's replacement policy (LRU by
   default: L1, Redis ``allkeys-lru`` and the engine's prefix cache by default all are; every
   other simulator, e.g. the scan-resistant S3-FIFO and W-TinyLFU, is reported beside it, from the
   plan's preload and from the history ceiling's) and reported beside
   two ceilings: the **history ceiling** (MIN from the best preload of keys the history has seen,
   :func:`harness.analysis.sim.history_preload`: the best any plan from that history with any
   replacement policy can reach) and **Belady's** (MIN from the optimal preload, which knows the
   window). ``plan + MIN`` separates the plan's choice from the replacement policy's losses, and
   the report measures what limits the rest (:class:`Limits`). In sample (the window is the
   history's first 10 %, which the plan has seen) the numbers are an upper bound, labelled so.

4. **Outputs.** ``preload.jsonl`` in the format ``POST /cache/preload`` accepts (one OpenAI request
   body per line, the body the load stage sends for that record, optional ``tenant``; no
   ``completion``, so the server generates each answer, which also fills the engine's prefix
   cache), and the ladder plan for ``locustfiles/warmup.py`` in the load stage's own model
   (:class:`harness.load.plan.Plan`, written by :func:`harness.load.plan.write_plan`): stages with a
   target QPS, a duration and a tolerated failure rate, the rollback policy, and ``preload`` naming
   the preload file beside it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field

from harness.analysis.references import FloatArray, IntArray, RefTrace
from harness.analysis.sim import SIMULATORS, history_preload, optimal_preload, simulate
from harness.common.errors import InputError
from harness.common.io import write_jsonl
from harness.common.model import StrictModel
from harness.common.registry import Registry
from harness.common.stats import percentile
from harness.load.arrivals import ApiChoice, preload_line
from harness.load.plan import Plan, Policy, Stage

Predictor = Callable[[RefTrace, float], FloatArray]
"""(history, τ seconds) → predicted reuse per key id (``len(history.labels)`` values)."""
PREDICTORS: Registry[Predictor] = Registry("reuse predictor")


def _weighted(trace: RefTrace, weights: FloatArray) -> FloatArray:
    out: FloatArray = np.bincount(trace.keys, weights=weights, minlength=len(trace.labels)).astype(np.float64)
    return out


@PREDICTORS.register("replay")
def predict_replay(trace: RefTrace, tau_s: float) -> FloatArray:
    """References weighted by ``exp(−t/τ)`` from the start: soon and often first."""
    return _weighted(trace, np.exp(-trace.ref_times() / max(tau_s, 1e-9)))


@PREDICTORS.register("recent")
def predict_recent(trace: RefTrace, tau_s: float) -> FloatArray:
    """References weighted by ``exp(−(T − t)/τ)`` from the end ``T``: an exponentially weighted rate."""
    t = trace.ref_times()
    end = float(trace.arrival_s[-1]) if trace.n_requests else 0.0
    return _weighted(trace, np.exp(-(end - t) / max(tau_s, 1e-9)))


@PREDICTORS.register("frequency")
def predict_frequency(trace: RefTrace, tau_s: float) -> FloatArray:
    """Plain reference counts."""
    return _weighted(trace, np.ones(trace.n_refs, dtype=np.float64))


def rank_keys(history: RefTrace, predictor: str, tau_s: float) -> IntArray:
    """Key ids seen in ``history``, best predicted reuse first (ties: earlier first use first)."""
    scores = PREDICTORS.get(predictor)(history, tau_s)
    uniq, first = np.unique(history.keys, return_index=True)
    order = np.lexsort((first, -scores[uniq]))
    ranked: IntArray = uniq[order]
    return ranked


def ids_in(labels: Sequence[Hashable], trace: RefTrace) -> list[int]:
    """Map keys (by label) into ``trace``'s id space; keys it never saw get fresh, never-used ids."""
    index = {label: i for i, label in enumerate(trace.labels)}
    fresh = len(trace.labels)
    out: list[int] = []
    for label in labels:
        k = index.get(label)
        if k is None:
            k, fresh = fresh, fresh + 1
        out.append(k)
    return out


def covering_requests(history: RefTrace, chosen: Iterable[int]) -> list[int]:
    """Requests whose prompts bring the ``chosen`` keys into a cache, in the chosen keys' rank order.

    For each chosen key not yet covered, the first request that references it is taken (with a KV
    block, that request's prompt carries the block's whole prefix chain).
    """
    first_req: dict[int, int] = {}
    for k, r in zip(history.keys.tolist(), history.req.tolist(), strict=True):
        first_req.setdefault(k, r)
    by_req: dict[int, list[int]] = {}
    for k, r in zip(history.keys.tolist(), history.req.tolist(), strict=True):
        by_req.setdefault(r, []).append(k)
    covered: set[int] = set()
    out: list[int] = []
    for k in chosen:
        if k in covered or k not in first_req:
            continue
        r = first_req[k]
        out.append(r)
        covered.update(by_req[r])
    return out


# --------------------------------------------------------------------------- ladder plan


def arrival_rates(trace: RefTrace, bin_s: float = 10.0) -> list[float]:
    """Requests per second in consecutive ``bin_s`` bins over the trace's span."""
    if trace.n_requests == 0:
        return []
    span = float(trace.arrival_s[-1])
    bins = max(1, math.ceil(span / bin_s)) if span > 0 else 1
    counts = np.bincount(np.minimum((trace.arrival_s // bin_s).astype(np.int64), bins - 1), minlength=bins)
    return [float(c) / bin_s for c in counts.tolist()]


def ladder_plan(
    history: RefTrace,
    *,
    fractions: Sequence[float] = (0.1, 0.25, 0.5, 0.75, 1.0),
    peak_percentile: float = 95.0,
    stage_s: float = 60.0,
    max_failure_rate: float = 0.01,
    bin_s: float = 10.0,
    preload: str | None = None,
    policy: Policy | None = None,
) -> Plan:
    """The warmup ladder for ``locustfiles/warmup.py``: the load stage's :class:`~harness.load.plan.Plan`.

    Stages at ``fractions`` of the history's ``peak_percentile`` arrival rate (per ``bin_s`` bin),
    each held ``stage_s`` with ``max_failure_rate`` tolerated; ``preload`` names the preload JSONL
    beside the plan file. The default policy retries a failed stage once after holding the last
    stage that passed (the seed's plan does the same).
    """
    rates = arrival_rates(history, bin_s)
    peak = percentile(rates, peak_percentile) if rates else math.nan
    if not peak > 0:
        raise InputError("the history has no arrival rate to plan a ladder from", file=history.source)
    stages = [
        Stage(
            name=f"stage-{i + 1}",
            qps=round(max(f * peak, 1e-3), 4),
            duration_s=stage_s,
            max_failure_rate=max_failure_rate,
        )
        for i, f in enumerate(sorted(fractions))
    ]
    return Plan(
        name="warmup",
        preload=preload,
        policy=policy or Policy(on_failure="retry", max_retries=1),
        stages=stages,
    )


# --------------------------------------------------------------------------- the plan


Mode = Literal["out_of_sample", "in_sample"]


class Limits(StrictModel):
    """What keeps a plan from the history ceiling, measured on the evaluation window."""

    refs_unseen: float
    """Share of the window's references to keys the history never saw (new documents and
    conversations): no plan from this history can preload them."""
    refs_one_off: float
    """Share of the window's references to keys used once in the window and never before (one-off
    documents): a miss for every cache, and under LRU they push useful entries out."""
    preload_used: float
    """Share of the plan's preload the window references at all; the rest is popularity drift
    (keys hot in the history, cold after it)."""
    preload_overlap: float
    """Share of the history ceiling's preload the plan also chose."""
    ceiling_from_preload: float = 0.0
    """Share of the history ceiling's hits that are first window uses of its preloaded keys; the
    rest are reuses within the window, which a cold cache can reach too."""
    ceiling_after_scan: float = 0.0
    """Share of the history ceiling's hits that are first uses of preloaded keys after at least a
    capacity's worth of distinct newcomers (keys outside the preload): a policy that admits every
    missed key (LRU, FIFO) has pushed the whole untouched preload out by then, whatever its order,
    so only a scan-resistant or protecting policy can score them."""


class PlanReport(StrictModel):
    """``plan.json``: the preload set and its hit rate on the window after its history."""

    source: str
    unit: str
    capacity: int
    predictor: str
    tau_s: float
    policy: str
    """Replacement policy of the cache being warmed, used for the expected hit rate."""
    mode: Mode
    """``out_of_sample``: the evaluated plan never saw the window; ``in_sample``: the window is part
    of the history the plan was built from, so every figure is an upper bound."""
    history_requests: int
    """Requests the evaluated plan was built from."""
    window_requests: int
    window_refs: int
    window_distinct: int
    preload_keys: int
    preload_requests: int
    """Requests whose prompts carry the preload set (the lines of the preload JSONL)."""
    preload_lines_written: int = 0
    """Of those, lines written (a request needs a corpus record with its text)."""
    expected_hit_rate: float
    """The evaluation window simulated under ``policy`` from the evaluated plan's preload."""
    protected_hit_rate: float
    """The same preload protected until its first hit, then LRU (``lru-protect``): a tier that
    honours preload priorities."""
    plan_min_hit_rate: float
    """MIN from the plan's preload: what the preload allows with a perfect replacement policy."""
    history_ceiling: float
    """MIN from the best preload of keys the history has seen: the best any plan from this history
    and any policy can do here."""
    history_preload_hit_rate: float
    """The history ceiling's own preload under ``policy``: the best history preload, served by the
    real eviction."""
    ceiling: float
    """Belady: MIN from the optimal preload (knows the window): the best any warmup can do."""
    ratio: float
    """``expected_hit_rate / history_ceiling``: the goal measure."""
    ratio_belady: float
    """``expected_hit_rate / ceiling``."""
    cold: dict[str, float]
    """Hit rates from an empty cache under every simulator (``min``, ``lru``, ``lfu``, …)."""
    plan_by_policy: dict[str, float] = Field(default_factory=dict)
    """The window from the evaluated plan's preload under every simulator of
    :data:`~harness.analysis.sim.SIMULATORS` (``lru`` is ``expected_hit_rate`` when ``policy`` is
    LRU, ``min`` is ``plan_min_hit_rate``)."""
    history_by_policy: dict[str, float] = Field(default_factory=dict)
    """The same from the history ceiling's preload (``min`` is ``history_ceiling``)."""
    limits: Limits
    top: list[dict[str, Any]] = Field(default_factory=list)
    """The best keys of the written plan with their predicted reuse (at most 20), for people."""


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else 1.0


def _choose(history: RefTrace, capacity: int, predictor: str, tau: float) -> tuple[IntArray, FloatArray]:
    scores = PREDICTORS.get(predictor)(history, tau)
    return rank_keys(history, predictor, tau)[:capacity], scores


def plan_warmup(
    history: RefTrace,
    capacity: int,
    *,
    window: RefTrace | None = None,
    window_fraction: float = 0.1,
    in_sample: bool = False,
    predictor: str = "recent",
    tau_s: float | None = None,
    policy: str = "lru",
) -> tuple[PlanReport, list[int], list[int]]:
    """Plan a warmup from ``history``; returns the report, the preload key ids (best first) and the
    covering requests of the plan built from the whole history (what gets written).

    The evaluation (module doc, 3): ``window`` (another trace with the same kind of keys; labels
    are matched) judges the plan from the whole history; without it the last ``window_fraction`` of
    the history is the window and the plan judged on it is built from the requests before it. With
    ``in_sample`` the window is the first ``window_fraction`` of the history and the plan is built
    from all of it (an upper bound). ``tau_s`` defaults to the window's span (a tenth of it in
    sample, where ``replay`` weighs the window's own references), at least one second.
    """
    if capacity < 1:
        raise InputError(f"capacity must be at least 1, got {capacity}", field="capacity")
    if not 0.0 < window_fraction < 1.0:
        raise InputError(f"window fraction {window_fraction} is not in (0, 1)", field="window")
    past = history
    if window is not None:
        win = window
    elif in_sample:
        win = history.head(window_fraction)
    else:
        if history.n_requests < 2:
            raise InputError("a backtest needs at least two requests in the history", file=history.source)
        cut = history.n_requests - max(1, int(history.n_requests * window_fraction))
        past, win = history.window(0, cut), history.window(cut, history.n_requests)
    if win.n_refs == 0:
        raise InputError("the evaluation window has no references", file=win.source)
    span = float(win.arrival_s[-1]) if win.n_requests else 0.0
    tau = tau_s if tau_s is not None else max(span / 10.0 if in_sample else span, 1.0)
    judged, _ = _choose(past, capacity, predictor, tau)
    # LRU/LFU evict the front of the initial order first: least valuable first.
    initial = list(reversed(ids_in([past.labels[k] for k in judged.tolist()], win)))
    seen = np.asarray(ids_in(_seen_labels(past), win), dtype=np.int64)
    best_history = history_preload(win.keys, seen, capacity)
    expected = simulate(win, capacity, policy, initial=initial, warm="plan")
    protected = simulate(win, capacity, "lru-protect", initial=initial, warm="plan")
    plan_min = simulate(win, capacity, "min", initial=initial, warm="plan")
    hist_ceiling = simulate(win, capacity, "min", initial=best_history, warm="history")
    history_initial = list(reversed(best_history))  # least valuable (latest first use) first
    hist_policy = simulate(win, capacity, policy, initial=history_initial, warm="history")
    ceiling = simulate(win, capacity, "min", initial=optimal_preload(win.keys, capacity), warm="optimal")
    cold = {p: simulate(win, capacity, p).hit_rate for p in SIMULATORS.names()}
    plan_by = {p: simulate(win, capacity, p, initial=initial).hit_rate for p in SIMULATORS.names()}
    history_by = {p: simulate(win, capacity, p, initial=history_initial).hit_rate for p in SIMULATORS.names()}
    chosen, scores = _choose(history, capacity, predictor, tau)
    requests = covering_requests(history, chosen.tolist())
    report = PlanReport(
        source=history.source,
        unit=history.unit,
        capacity=capacity,
        predictor=predictor,
        tau_s=tau,
        policy=policy,
        mode="in_sample" if in_sample else "out_of_sample",
        history_requests=past.n_requests,
        window_requests=win.n_requests,
        window_refs=win.n_refs,
        window_distinct=win.distinct,
        preload_keys=len(chosen),
        preload_requests=len(requests),
        expected_hit_rate=expected.hit_rate,
        protected_hit_rate=protected.hit_rate,
        plan_min_hit_rate=plan_min.hit_rate,
        history_ceiling=hist_ceiling.hit_rate,
        history_preload_hit_rate=hist_policy.hit_rate,
        ceiling=ceiling.hit_rate,
        ratio=_ratio(expected.hit_rate, hist_ceiling.hit_rate),
        ratio_belady=_ratio(expected.hit_rate, ceiling.hit_rate),
        cold=cold,
        plan_by_policy=plan_by,
        history_by_policy=history_by,
        limits=limits(win, seen, initial, best_history, capacity),
        top=[
            {"key": _label_json(history.labels[k]), "score": float(scores[k])} for k in chosen[:20].tolist()
        ],
    )
    return report, chosen.tolist(), requests


def _seen_labels(trace: RefTrace) -> list[Hashable]:
    return [trace.labels[k] for k in np.unique(trace.keys).tolist()]


def limits(
    window: RefTrace, seen: IntArray, preload: Sequence[int], best: Sequence[int], capacity: int
) -> Limits:
    """:class:`Limits` of a preload (ids in ``window``'s space) against the history ceiling's
    (``best``, the MIN preload at ``capacity``)."""
    keys = window.keys
    from_preload, after_scan = ceiling_dependence(keys, best, capacity)
    n = max(1, keys.size)
    unseen = ~np.isin(keys, seen)
    counts = np.bincount(keys, minlength=int(keys.max()) + 1 if keys.size else 0)
    one_off = unseen & (counts[keys] == 1)
    used = set(np.unique(keys).tolist())
    pre = set(preload)
    return Limits(
        refs_unseen=float(unseen.sum()) / n,
        refs_one_off=float(one_off.sum()) / n,
        preload_used=len(pre & used) / len(pre) if pre else 0.0,
        preload_overlap=len(pre & set(best)) / len(best) if best else 1.0,
        ceiling_from_preload=from_preload,
        ceiling_after_scan=after_scan,
    )


def ceiling_dependence(keys: IntArray, best: Sequence[int], capacity: int) -> tuple[float, float]:
    """Shares of MIN's hits from the preload ``best`` at ``capacity`` (:class:`Limits`): first uses
    of preloaded keys, and those of them after at least ``capacity`` distinct newcomers."""
    run = SIMULATORS.get("min")(keys, capacity, best, True)
    if not run.hits or run.hit_refs is None:
        return 0.0, 0.0
    n = int(keys.size)
    _, first = np.unique(keys, return_index=True)
    is_first = np.zeros(n, dtype=bool)
    is_first[first] = True
    in_preload = np.isin(keys, np.asarray(list(best), dtype=np.int64))
    # Distinct newcomers referenced before each position (a first use of a key outside the preload).
    new = (is_first & ~in_preload).astype(np.int64)
    newcomers: IntArray = np.cumsum(new) - new
    preload_hit = (run.hit_refs == 1) & is_first & in_preload
    late = preload_hit & (newcomers >= capacity)
    return float(preload_hit.sum()) / run.hits, float(late.sum()) / run.hits


def _label_json(label: Hashable) -> Any:
    if isinstance(label, tuple):
        return [_label_json(x) for x in label]
    return label


# --------------------------------------------------------------------------- preload JSONL


def preload_lines(
    history: RefTrace,
    requests: Sequence[int],
    corpus: Path,
    *,
    api: ApiChoice = "auto",
    model: str | None = None,
    max_tokens_cap: int | None = None,
) -> tuple[list[dict[str, Any]], int]:
    """``POST /cache/preload`` lines for ``requests`` of ``history``, from the corpus that replays it.

    A request of a load run (``records:<id>``) is the corpus record with that id; a request of a
    trace (``line:<n>``) is the corpus record generated from that trace line
    (``provenance.source_line``). Each line is the body the load stage will send for that record
    (:func:`harness.load.arrivals.preload_line`), so ``api``, ``model`` and ``max_tokens_cap`` must be
    the replay's. Returns the lines and how many requests had no record.
    """
    from harness.corpus.model import CorpusRecord, read_corpus

    by_id: dict[str, CorpusRecord] = {}
    by_line: dict[int, CorpusRecord] = {}
    for record in read_corpus(corpus):
        by_id.setdefault(record.id, record)
        if record.provenance.source_line is not None:
            by_line.setdefault(record.provenance.source_line, record)
    lines: list[dict[str, Any]] = []
    missing = 0
    seen: set[str] = set()
    for r in requests:
        ref = history.request_refs[r] if r < len(history.request_refs) else ""
        kind, _, value = ref.partition(":")
        rec: CorpusRecord | None = None
        if kind == "records":
            rec = by_id.get(value)
        elif kind == "line":
            rec = by_line.get(int(value))
        if rec is None:
            missing += 1
            continue
        if rec.id in seen:
            continue
        seen.add(rec.id)
        lines.append(preload_line(rec, api=api, model=model, max_tokens_cap=max_tokens_cap))
    return lines, missing


def write_preload(path: str | Path, lines: Iterable[dict[str, Any]]) -> int:
    """Write preload JSONL atomically; returns the number of lines."""
    return write_jsonl(path, lines)
