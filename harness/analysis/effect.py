"""A warmup judged where it matters: planned from the past, measured through the target on what came after.

``harness analysis plan`` judges a plan out of sample by *simulation*; this module measures what the
plan does to users. One corpus built from a trace (``harness corpus build --trace``, whose records
carry their arrival offsets and the trace's shared KV blocks, ``prefix_block_ids``) is cut in time:

* the **history** (``--split F``: the records before the fraction ``F`` of its time span; or another
  corpus, ``--history-corpus``) is all the planner sees;
* the **window** (the records after the cut, offsets rebased to 0) is the traffic replayed.

The window is replayed three times against the same target, each after every cache level was
flushed (:func:`harness.experiments.target.flush_all`), at the same times (open loop, the corpus's own
offsets):

``cold``
    nothing preloaded: what the first window of a deploy sees today;
``planned``
    the plan's preload first: the prefixes the planner (:func:`harness.analysis.warmup.plan_warmup`,
    the ``recent`` predictor by default) ranks best from the history alone, as many KV blocks as the
    target's prefix cache holds;
``oracle``
    the preload chosen with knowledge of the window (Belady's best preload of its blocks): the ceiling
    any warmup can reach at this capacity.

A preload request is the shared prefix of a history (or window) request alone, cut at its last
shared token, sent with ``max_tokens: 1`` and ``Cache-Control: no-cache``: it fills the engine's KV
prefix cache and nothing else (no response-cache entry a window request could hit, so the passes
differ only in the KV blocks preloaded). This works against any OpenAI-compatible server with a
prefix cache (vLLM's ``--enable-prefix-caching``): nothing here needs our own admin routes but the
flush.

**What is reported** (:class:`EffectReport`, ``OUT/effect.json``): per pass and per window head (the
first 10 %, the first 25 %, all of the window, by arrival): TTFT P50 / P95 / P99 with order-statistic
intervals, the KV-block hit rate (prompt tokens the target reported cached, of the shared-prefix
tokens the requests carried), and the **realized gain** ``1 − P95(planned) ÷ P95(cold)`` beside the
oracle's, each with a paired bootstrap interval (the same requests resampled in both passes). Beside
them, the simulator's prediction for the same preload at the same capacity (LRU, as the engine
evicts), so the simulator is checked against the engine.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
from pydantic import Field

from harness.analysis.references import RefTrace, corpus_refs, is_tail, timed
from harness.analysis.sim import SIMULATORS, optimal_preload
from harness.analysis.warmup import PlanReport, covering_requests, ids_in, plan_warmup
from harness.common.errors import InputError
from harness.common.model import StrictModel
from harness.common.stats import percentile, percentile_interval
from harness.corpus.model import CorpusRecord
from harness.load.results import RequestRecord

PASSES: tuple[str, ...] = ("cold", "planned", "oracle")
"""The three replays of the window, in the order they run."""
HEADS: tuple[float, ...] = (0.1, 0.25, 1.0)
"""Window heads reported: the first 10 %, the first 25 % and all of the window, by arrival time."""
BOOTSTRAP = 2000
"""Bootstrap resamples of a paired gain interval."""


# ------------------------------------------------------------------------------------ the data


@dataclass(frozen=True)
class Split:
    """A history and the window after it; the window's offsets start at 0."""

    history: list[CorpusRecord]
    window: list[CorpusRecord]
    cut_s: float
    """Where the cut fell, in the source's seconds (``nan`` for two corpora)."""


def _rebased(records: list[CorpusRecord]) -> list[CorpusRecord]:
    t0 = float(records[0].arrival_offset_s or 0.0) if records else 0.0
    return [r.model_copy(update={"arrival_offset_s": float(r.arrival_offset_s or 0.0) - t0}) for r in records]


def split_records(records: Sequence[CorpusRecord], fraction: float, source: str) -> Split:
    """Cut ``records`` at ``fraction`` of their time span: before is the history, after the window."""
    if not 0.0 < fraction < 1.0:
        raise InputError(f"the split {fraction:g} is not in (0, 1)", field="--split")
    ordered = timed(records, source)
    if not ordered:
        raise InputError("the corpus has no records", file=source)
    t0, t1 = float(ordered[0].arrival_offset_s or 0.0), float(ordered[-1].arrival_offset_s or 0.0)
    cut = t0 + fraction * (t1 - t0)
    history = [r for r in ordered if float(r.arrival_offset_s or 0.0) < cut]
    window = [r for r in ordered if float(r.arrival_offset_s or 0.0) >= cut]
    if not history or not window:
        raise InputError(
            f"splitting at {fraction:g} of the span leaves {len(history)} history and {len(window)} window "
            "records; both need some",
            file=source, field="--split",
        )  # fmt: skip
    return Split(history, _rebased(window), cut)


def pair_records(
    history: Sequence[CorpusRecord], window: Sequence[CorpusRecord], sources: tuple[str, str]
) -> Split:
    """A history corpus and a window corpus given apart (yesterday's and today's)."""
    h, w = timed(history, sources[0]), timed(window, sources[1])
    for got, src in ((h, sources[0]), (w, sources[1])):
        if not got:
            raise InputError("the corpus has no records", file=src)
    return Split(h, _rebased(w), math.nan)


# ------------------------------------------------------------------------------------ the plan


class Prediction(StrictModel):
    """The simulator's hit rates of the window's shared KV blocks, per pass: the window's whole block
    stream (its prompts' one-off blocks too, which take room in the cache) simulated at the capacity
    under ``policy``, hits counted on the shared blocks (what :attr:`PassHead.block_hit_rate`
    measures on the target)."""

    policy: str
    cold: float
    planned: float
    oracle: float
    refs: int
    """Shared-block references of the window."""
    one_off_refs: int
    """One-off block references of the window (the rest of each prompt)."""


@dataclass(frozen=True)
class EffectPlan:
    """What each pass preloads, and what the simulator predicts of it."""

    capacity: int
    """KV blocks (of the corpus's block size) the target's prefix cache holds."""
    report: PlanReport
    planned: list[CorpusRecord]
    oracle: list[CorpusRecord]
    prediction: Prediction
    planned_blocks: int
    """Distinct KV blocks the planned preload brings (at most the capacity)."""
    oracle_blocks: int
    preload_used: dict[str, float]
    """Per pass: the share of its preloaded blocks the window references at all."""


def prefix_only(rec: CorpusRecord, tokenizer: object, blocks: int | None = None) -> CorpusRecord | None:
    """The request that brings ``rec``'s shared prefix into a prefix cache and nothing else: its
    prompt cut at the last shared token (of its first ``blocks`` shared blocks, when given), one
    output token, an id of its own. ``None`` when it has none, or is a chat record (its prefix sits
    inside a template the target renders)."""
    from harness.corpus.tokens import TargetTokenizer

    if not rec.prefix_block_ids or rec.prompt is None or rec.prefix_tokens <= 0:
        return None
    assert isinstance(tokenizer, TargetTokenizer)
    n = len(rec.prefix_block_ids) if blocks is None else max(0, min(blocks, len(rec.prefix_block_ids)))
    tokens = rec.prefix_tokens // len(rec.prefix_block_ids) * n
    head = tokenizer.head(rec.prompt, tokens) if n else ""
    if not head:
        return None
    return rec.model_copy(
        update={
            "id": f"preload-{rec.id}",
            "prompt": head,
            "max_tokens": 1,
            "expected_output_tokens": 1,
            "prompt_tokens": tokens,
            "prefix_tokens": tokens,
            "prefix_block_ids": rec.prefix_block_ids[:n],
            "scenario": "preload",
        }
    )


def _preloads(
    records: Sequence[CorpusRecord], chosen: Sequence[int], trace: RefTrace, tokenizer: object
) -> list[CorpusRecord]:
    """The prefix-only requests that bring the ``chosen`` keys (best first) into a prefix cache, in the
    order to send them: least valuable first, so that under LRU the most valuable are the most
    recently used when the traffic starts (as the simulation's warm start has them).

    Each request's prompt is cut after its deepest chosen block: the blocks after it in its chain
    were not chosen, and would take room from those that were (a chain's ancestors score at least
    as high as its descendants, so everything before the cut was chosen too)."""
    wanted = {trace.labels[k] for k in chosen}
    out: list[CorpusRecord] = []
    for r in covering_requests(trace, chosen):
        rec = records[r]
        depth = max(
            (i + 1 for i, h in enumerate(rec.prefix_block_ids) if (rec.tenant, h) in wanted), default=0
        )
        pre = prefix_only(rec, tokenizer, depth)
        if pre is not None:
            out.append(pre)
    return out[::-1]


def warm_start(preloads: Sequence[CorpusRecord], window: RefTrace) -> list[int]:
    """What ``preloads``, sent in order, leave in a prefix cache, as ``window`` key ids, least recently
    used first: the simulation's warm start is exactly what the target was sent. A finished sequence's
    blocks are parked leaf first (:meth:`harness.target.engine.kv_cache.BlockManager.free`), so its root is
    its most recent; a block a later preload shares moves up with it."""
    order: dict[Hashable, None] = {}
    for rec in preloads:
        for h in reversed(rec.prefix_block_ids):
            label = (rec.tenant, h)
            order.pop(label, None)
            order[label] = None
    return ids_in(list(order), window)


def _shared_hit_rate(
    trace: RefTrace, shared: np.ndarray, capacity: int, policy: str, initial: Sequence[int]
) -> float:
    counts = SIMULATORS.get(policy)(trace.keys, capacity, initial, True)
    assert counts.hit_refs is not None
    n = int(shared.sum())
    return float(counts.hit_refs[shared].sum() / n) if n else 0.0


def plan_effect(
    split: Split,
    capacity: int,
    *,
    predictor: str = "recent",
    policy: str = "lru",
    tokenizer: str | None = None,
    seed: int = 0,
) -> EffectPlan:
    """The planned and oracle preloads for ``split`` at ``capacity`` KV blocks, and the simulator's
    prediction of each pass under ``policy`` (the target's eviction: the engine's default is LRU)."""
    from harness.corpus.tokens import load_tokenizer

    if capacity < 1:
        raise InputError(
            f"the cache capacity must be at least 1 block, got {capacity}", field="--cache-capacity"
        )
    SIMULATORS.get(policy)  # an unknown name fails here, listing the known ones
    history = corpus_refs(split.history, "history")
    window = corpus_refs(split.window, "window", tail_block=block_tokens([*split.window, *split.history]))
    if history.n_refs == 0:
        raise InputError(
            "the history's records share no KV blocks (prefix_block_ids are all empty): nothing to plan",
            field="--history-corpus",
            hint="build the corpus from a trace with hash_ids (Mooncake): harness corpus build --trace",
        )
    if window.n_refs == 0:
        raise InputError(
            "the window's records share no KV blocks: a warmup cannot change it", field="--corpus"
        )
    report, chosen, _ = plan_warmup(history, capacity, window=window, predictor=predictor, policy=policy)
    tok = load_tokenizer(str(tokenizer) if tokenizer else None, seed)
    planned = _preloads(split.history, chosen, history, tok)
    shared = np.asarray([not is_tail(label) for label in window.labels], dtype=bool)[window.keys]
    # The oracle preloads the window's best shared blocks (one-off blocks are nobody's to preload).
    only_shared = corpus_refs(split.window, "window")
    oracle = _preloads(split.window, optimal_preload(only_shared.keys, capacity), only_shared, tok)
    prediction = Prediction(
        policy=policy,
        cold=_shared_hit_rate(window, shared, capacity, policy, ()),
        planned=_shared_hit_rate(window, shared, capacity, policy, warm_start(planned, window)),
        oracle=_shared_hit_rate(window, shared, capacity, policy, warm_start(oracle, window)),
        refs=int(shared.sum()),
        one_off_refs=int((~shared).sum()),
    )
    wanted = {label for label in window.labels if not is_tail(label)}
    used = {}
    for name, pre in (("planned", planned), ("oracle", oracle)):
        blocks = {(r.tenant, h) for r in pre for h in r.prefix_block_ids}
        used[name] = len(blocks & wanted) / len(blocks) if blocks else 0.0
    return EffectPlan(
        capacity=capacity,
        preload_used=used,
        report=report,
        planned=planned,
        oracle=oracle,
        prediction=prediction,
        planned_blocks=len({(r.tenant, h) for r in planned for h in r.prefix_block_ids}),
        oracle_blocks=len({(r.tenant, h) for r in oracle for h in r.prefix_block_ids}),
    )


def block_tokens(records: Iterable[CorpusRecord]) -> int | None:
    """Tokens per shared block in ``records`` (``prefix_tokens / len(prefix_block_ids)``); ``None``
    when no record has shared blocks."""
    for r in records:
        if r.prefix_block_ids:
            return max(1, r.prefix_tokens // len(r.prefix_block_ids))
    return None


# ------------------------------------------------------------------------------------ the effect


class Interval(StrictModel):
    value: float | None
    lo: float | None
    hi: float | None
    n: int


class PassHead(StrictModel):
    """One pass over one head of the window."""

    requests: int
    errors: int
    ttft_p50: Interval
    ttft_p95: Interval
    ttft_p99: Interval
    e2e_p95: Interval
    block_hit_rate: float | None
    """Prompt tokens the target reported cached (``cached_tokens``, at most the shared prefix), of
    the shared-prefix tokens the requests carried: the realized counterpart of the simulator's
    KV-block hit rate."""


class HeadEffect(StrictModel):
    head: float
    """Share of the window, from its start, by arrival time."""
    passes: dict[str, PassHead]
    gain_p95: dict[str, Interval]
    """``1 − P95(pass) ÷ P95(cold)`` of TTFT for ``planned`` and ``oracle``, with a paired bootstrap
    interval (requests resampled together in both passes)."""
    gain_p99: dict[str, Interval]


class EffectReport(StrictModel):
    """``OUT/effect.json``."""

    history_requests: int
    window_requests: int
    window_span_s: float
    cut_s: float | None
    capacity_blocks: int
    block_tokens: int | None
    predictor: str
    preload_requests: dict[str, int]
    preload_blocks: dict[str, int]
    preload_used: dict[str, float] = Field(default_factory=dict)
    """Per pass: the share of its preloaded blocks the window references at all (the rest is
    popularity drift: hot in the history, not after it)."""
    predicted_block_hit_rate: Prediction
    simulated: PlanReport
    heads: list[HeadEffect]
    confidence: float
    notes: list[str] = Field(default_factory=list)

    def head(self, share: float) -> HeadEffect:
        return next(h for h in self.heads if math.isclose(h.head, share))

    COLUMNS: ClassVar[tuple[str, ...]] = (
        "window", "pass", "requests", "TTFT P50", "TTFT P95", "TTFT P99", "block hits", "simulated",
        "P95 gain",
    )  # fmt: skip
    """The columns of :meth:`rows`."""

    def rows(self) -> list[tuple[str, ...]]:
        """Per window head and pass: TTFT, the shared-block hits measured (and simulated, for the whole
        window) and the P95 gain over cold with its paired interval, as text: what the command's table
        and the report show."""
        from harness.gates.metrics import format_value

        def ms(x: float | None) -> str:
            return format_value(x, "ms") if x is not None else "—"

        def pct(x: float | None) -> str:
            return format_value(x, "ratio") if x is not None else "—"

        out: list[tuple[str, ...]] = []
        for h in self.heads:
            head = f"first {h.head:.0%}" if h.head < 1.0 else "whole window"
            for name, p in h.passes.items():
                g = h.gain_p95.get(name)
                gain = (
                    f"{pct(g.value)} [{pct(g.lo)}, {pct(g.hi)}]"
                    if g is not None and g.value is not None
                    else "—"
                )
                sim = getattr(self.predicted_block_hit_rate, name) if h.head == 1.0 else None
                out.append(
                    (head, name, str(p.requests), ms(p.ttft_p50.value), ms(p.ttft_p95.value),
                     ms(p.ttft_p99.value), pct(p.block_hit_rate), pct(sim), gain)
                )  # fmt: skip
        return out

    def realized_share_of_oracle(self, share: float = 0.1) -> float | None:
        """The planned pass's P95 gain over the oracle's, in the head ``share``."""
        h = self.head(share)
        p, o = h.gain_p95["planned"].value, h.gain_p95["oracle"].value
        return p / o if p is not None and o is not None and o > 0 else None


def read_effect(path: str | Path) -> EffectReport:
    """An ``effect.json`` written by ``harness analysis effect``."""
    from harness.common.io import read_json

    return read_json(path, EffectReport, expected="a warmup effect (harness analysis effect)")


def _interval(values: np.ndarray, q: float, confidence: float) -> Interval:
    if values.size == 0:
        return Interval(value=None, lo=None, hi=None, n=0)
    lo, hi = percentile_interval(values, q, confidence)
    return Interval(value=percentile(values, q), lo=_finite(lo), hi=_finite(hi), n=int(values.size))


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def _paired_gain(
    base: dict[str, float], other: dict[str, float], q: float, confidence: float, rng: np.random.Generator
) -> Interval:
    ids = sorted(set(base) & set(other))
    if len(ids) < 2:
        return Interval(value=None, lo=None, hi=None, n=len(ids))
    a = np.asarray([base[i] for i in ids])
    b = np.asarray([other[i] for i in ids])
    value = 1.0 - percentile(b, q) / percentile(a, q)
    pick = rng.integers(0, len(ids), size=(BOOTSTRAP, len(ids)))
    # One resample draws the same requests from both passes: the pairing is what makes it tight.
    qa = np.percentile(a[pick], q, axis=1, method="inverted_cdf")
    qb = np.percentile(b[pick], q, axis=1, method="inverted_cdf")
    gains = 1.0 - qb / qa
    alpha = (1.0 - confidence) / 2.0
    return Interval(
        value=float(value),
        lo=float(np.quantile(gains, alpha)),
        hi=float(np.quantile(gains, 1.0 - alpha)),
        n=len(ids),
    )


def _pass_head(recs: list[RequestRecord], prefix: dict[str, int], confidence: float) -> PassHead:
    ok = [r for r in recs if r.status == 200 and r.error is None]
    ttft = np.asarray([r.ttft_ms for r in ok if r.ttft_ms is not None], dtype=np.float64)
    e2e = np.asarray([r.e2e_ms for r in ok if r.e2e_ms is not None], dtype=np.float64)
    carried = cached = 0
    for r in ok:
        p = prefix.get(r.id, 0)
        if p and r.cached_tokens is not None:
            carried += p
            cached += min(r.cached_tokens, p)
    return PassHead(
        requests=len(recs),
        errors=len(recs) - len(ok),
        ttft_p50=_interval(ttft, 50, confidence),
        ttft_p95=_interval(ttft, 95, confidence),
        ttft_p99=_interval(ttft, 99, confidence),
        e2e_p95=_interval(e2e, 95, confidence),
        block_hit_rate=cached / carried if carried else None,
    )


def measure_effect(
    passes: dict[str, list[RequestRecord]],
    window: Sequence[CorpusRecord],
    *,
    confidence: float = 0.95,
    seed: int = 0,
) -> list[HeadEffect]:
    """The window heads of :data:`HEADS` for each pass's records (matched to the window's corpus
    records by id: each replay sends every window record once, in the same order)."""
    arrival = {r.id: float(r.arrival_offset_s or 0.0) for r in window}
    prefix = {r.id: r.prefix_tokens for r in window}
    span = max(arrival.values()) if arrival else 0.0
    rng = np.random.default_rng(seed)
    out: list[HeadEffect] = []
    for share in HEADS:
        keep = {i for i, t in arrival.items() if t <= share * span + 1e-9}
        heads = {name: [r for r in recs if r.id in keep] for name, recs in passes.items()}
        ttft = {
            name: {r.id: float(r.ttft_ms) for r in recs if r.ttft_ms is not None and r.status == 200}
            for name, recs in heads.items()
        }
        gain95: dict[str, Interval] = {}
        gain99: dict[str, Interval] = {}
        for name in passes:
            if name == "cold" or "cold" not in ttft:
                continue
            gain95[name] = _paired_gain(ttft["cold"], ttft[name], 95, confidence, rng)
            gain99[name] = _paired_gain(ttft["cold"], ttft[name], 99, confidence, rng)
        out.append(
            HeadEffect(
                head=share,
                passes={name: _pass_head(recs, prefix, confidence) for name, recs in heads.items()},
                gain_p95=gain95,
                gain_p99=gain99,
            )
        )
    return out


def write_records(path: Path, records: Sequence[CorpusRecord]) -> Path:
    """``records`` as a corpus file (one JSON record a line), atomically."""
    from harness.common.io import write_jsonl

    write_jsonl(path, (r.model_dump(mode="json", exclude_none=True) for r in records))
    return path
