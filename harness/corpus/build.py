"""Builds a corpus: validate inputs → read logs → few-shot pool → candidates → dedup → render → files.

Every input is validated before any model loads (template syntax and sandbox, scenario and trace
files, request logs, locales, judges, the tokenizer), so a bad ``--template`` or ``--fewshot`` fails
in milliseconds, not after the embedder's seconds of start-up.

Each request's query is a real utterance of the logs (:mod:`harness.corpus.logs`). The build runs in
generate-and-dedup rounds over a seeded candidate order (:mod:`harness.corpus.rounds`: the
per-language judges, the draws, greedy first-come dedup), each round sized by the share of
candidates kept so far, until ``n`` are kept, the logs run out or ``max_rounds`` is reached; the
corpus is the first ``n`` kept candidates: deterministic for a seed. When the logs run out before
``n`` distinct requests, the corpus holds the ones that were possible and the shortfall is reported
(a quality failure, exit 1), never padded.

For throughput a cached few-shot pool (``pool_cache``) brings its embedding judges' vectors with it;
that changes nothing about which candidates are drawn or kept (docs/corpus.md, "Build throughput").

This module is the orchestration; each record is assembled by :mod:`harness.corpus.assemble` and the
files (corpus, manifest, quality report) are written by :mod:`harness.corpus.manifest`.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from harness.common.errors import ConfigError, InputError
from harness.corpus import dedup as dedup_mod
from harness.corpus import quality
from harness.corpus.assemble import PromptTemplate, assemble_record, load_template, template_context
from harness.corpus.fewshot import (
    FewShotPool,
    build_pool,
    fill_confidence,
    load_pool,
    load_pool_vectors,
    save_pool,
    save_pool_vectors,
    top_by_confidence,
)
from harness.corpus.inputs import LOCALE_LANG, InputSampler, Pick, candidate_rng
from harness.corpus.logs import Utterance, detect_log_format, read_logs
from harness.corpus.manifest import corpus_manifest, file_sha256, write_corpus_files
from harness.corpus.model import CorpusRecord, Manifest, RequestVariables
from harness.corpus.rounds import (
    LangDedup,
    Progress,
    _Draws,
    _generate_and_judge,
    _greedy,
    _judges,
    _refit_vetoes,
    dedup_text,
)
from harness.corpus.sandbox import PromptRenderer, TemplateError
from harness.corpus.settings import CorpusSettings, Thresholds
from harness.corpus.tokens import SharedBlocks, TargetTokenizer, load_tokenizer
from harness.traces.model import ScenarioSet

REPO = Path(__file__).resolve().parents[2]
DEFAULT_LOGS = (
    REPO / "fixtures" / "corpus" / "clinc150_sample.json",
    REPO / "fixtures" / "corpus" / "crosswoz_sample.json.zip",
)
"""The bundled real request logs (CLINC150 and CrossWOZ samples) used when no ``--fewshot`` is given."""


@dataclass
class BuildInputs:
    template: Path
    out: Path
    n: int | None = None
    scenarios: Path | None = None
    fewshot: list[Path] | None = None
    """Request logs (few-shot pool and queries); ``None``: the bundled samples (:data:`DEFAULT_LOGS`)."""
    trace: Path | None = None
    trace_format: str | None = None
    template_roots: list[Path] = field(default_factory=list)


@dataclass
class BuildResult:
    records: list[CorpusRecord]
    manifest: Manifest
    metrics: dict[str, float | int | None]
    dropped: int
    examples: list[dict[str, object]]
    failures: list[str]
    candidates: int
    warnings: list[str] = field(default_factory=list)


@dataclass
class _Prepared:
    """Everything validated before a model loads."""

    tmpl: PromptTemplate
    renderer: PromptRenderer
    scenarios: ScenarioSet | None
    rows: list[Any] | None
    n: int
    logs: list[Path]
    utterances: list[Utterance]
    tok: TargetTokenizer
    langs: list[str]


def _trace_rows(path: Path, fmt: str | None, limit: int | None) -> list[Any]:
    from harness.traces import read_requests

    rows: list[Any] = []
    for ev in read_requests(path, format=fmt):
        rows.append(ev)
        if limit is not None and len(rows) >= limit:
            break
    if not rows:
        raise InputError("trace has no requests", file=path)
    return rows


def _scenarios(path: Path) -> ScenarioSet:
    from harness.traces import load_scenarios

    return load_scenarios(path)


def prepare(inputs: BuildInputs, settings: CorpusSettings) -> _Prepared:
    """Validate every input and setting, cheaply: no embedder, no torch (see the module docstring)."""
    template_path = inputs.template
    if not template_path.is_file():
        raise TemplateError("template file not found", file=template_path)
    roots = [template_path.resolve().parent, *inputs.template_roots]
    renderer = PromptRenderer(
        roots, max_output_chars=settings.max_output_chars, max_render_s=settings.max_render_s
    )
    tmpl = load_template(template_path, renderer)
    scen = _scenarios(inputs.scenarios) if inputs.scenarios is not None else None
    rows = _trace_rows(inputs.trace, inputs.trace_format, inputs.n) if inputs.trace is not None else None
    n = inputs.n if inputs.n is not None else (len(rows) if rows is not None else None)
    if n is None or n < 1:
        raise ConfigError("give --n (the number of requests), or --trace to take one request per trace line")
    if rows is not None and len(rows) < n:
        n = len(rows)
    unknown = [loc for loc in settings.locales if loc not in LOCALE_LANG]
    if unknown:
        raise ConfigError(
            f"unsupported locale(s) {', '.join(unknown)}; supported: {', '.join(LOCALE_LANG)}",
            field="HARNESS__CORPUS__LOCALES",
        )
    for lang, name in settings.dedup_judges.items():
        dedup_mod.judges.get(name)  # an unknown judge is a ConfigError naming the known ones
        if lang not in LOCALE_LANG.values():
            raise ConfigError(f"no language {lang!r}; use en or zh", field="HARNESS__CORPUS__DEDUP_JUDGES")
    if settings.dedup_method != "auto":
        dedup_mod.searches.get(settings.dedup_method)
    logs = list(inputs.fewshot) if inputs.fewshot else list(DEFAULT_LOGS)
    for p in logs:
        detect_log_format(p)  # a file of no known format fails here, before anything is read in full
    utterances = read_logs(logs)
    wanted = {LOCALE_LANG[loc] for loc in settings.locales}
    langs = sorted({u.lang for u in utterances} & wanted)
    if not langs:
        raise InputError(
            "the request logs hold no requests in the languages of the locales "
            f"({', '.join(settings.locales)})",
            file=", ".join(map(str, logs)),
        )
    missing = [lang for lang in langs if lang not in settings.dedup_judges]
    if missing:
        raise ConfigError(
            f"no dedup judge for language(s) {', '.join(missing)}", field="HARNESS__CORPUS__DEDUP_JUDGES"
        )
    tok = load_tokenizer(str(settings.tokenizer) if settings.tokenizer else None, settings.seed)
    # A trial render: what compiles can still fail when it runs (an include leaving the root, an
    # undefined variable, a sandbox escape), and that too must show before any model loads.
    probe = InputSampler(settings.seed, utterances, locales=settings.locales, scenarios=scen)
    got = probe.variables(0)
    if got is not None:
        names: list[str | None] = [t for _, t in tmpl.parts] if tmpl.kind == "messages" else [tmpl.name]
        # Once bare, once with the material a target length may add (dialogue, reference lines).
        for ctx in (
            template_context(got[0], got[1], utterances[:2], None),
            template_context(
                got[0],
                got[1],
                utterances[:2],
                None,
                dialogue=[("user", "?"), ("assistant", "!")],
                reference=["ref"],
            ),
        ):
            for part in names:
                if part is not None:
                    renderer.render(part, ctx)
    return _Prepared(tmpl, renderer, scen, rows, n, logs, utterances, tok, langs)


def _pool_cache_path(prep: _Prepared, settings: CorpusSettings) -> Path:
    """Where the few-shot pool of these logs and settings is cached (see ``pool_cache``)."""
    import hashlib

    import orjson

    from harness.common.settings import HarnessSettings

    key = {
        "logs": [file_sha256([p]) for p in prep.logs],
        "langs": prep.langs,
        "judges": {lang: settings.dedup_judges[lang] for lang in prep.langs},
        "embed_model": str(settings.embed_model or ""),
        "threshold": settings.dedup_threshold,
        "top_n": settings.fewshot_top_n,
        "k": settings.fewshot_k,
        "shot_set_size": settings.shot_set_size,
        "floor": settings.fewshot_floor,
        "seed": settings.seed,
        "margin": dedup_mod.MARGIN,
    }
    digest = hashlib.sha256(orjson.dumps(key, option=orjson.OPT_SORT_KEYS)).hexdigest()[:32]
    return HarnessSettings().run_dir / "cache" / "fewshot" / f"pool-{digest}.json"


def build_corpus(
    inputs: BuildInputs, settings: CorpusSettings, progress: Progress | None = None
) -> BuildResult:
    """Build the corpus described by ``inputs`` into ``inputs.out`` and return what was written."""
    tick = progress or (lambda phase, done, total: None)
    prep = prepare(inputs, settings)
    n = prep.n
    threshold = settings.dedup_threshold

    tick("read logs", 0, 1)
    utterances = prep.utterances
    tick("read logs", 1, 1)
    judges = _judges(settings, utterances, prep.langs, tick)

    tick("few-shot pool", 0, 1)
    usable = [u for u in utterances if u.lang in prep.langs]
    pool: FewShotPool | None = None
    want_pool = settings.fewshot_top_n > 0 and settings.shots_per_prompt > 0
    cache = _pool_cache_path(prep, settings) if settings.pool_cache and want_pool else None
    # The embedding judges: what they encode for the pool is cached with it (see save_pool_vectors).
    memos = {lang: j for lang, j in judges.items() if isinstance(j, dedup_mod.EmbeddingJudge)}
    if cache is not None:
        pool = load_pool(cache, usable)  # its entries carry their saved confidences
        if pool is not None and memos:
            saved = load_pool_vectors(cache)
            for lang, judge in memos.items():
                judge.remember(saved.get(lang, {}))
    if pool is None and want_pool:
        # Label confidences (a TF-IDF fit over every line) are what the pool is ranked by; a
        # cached pool needs none of them.
        usable = fill_confidence(usable)
        pool = build_pool(
            usable,
            lambda lang: judges[lang],
            top_n=settings.fewshot_top_n,
            threshold=threshold,
            k=settings.fewshot_k,
            shot_set_size=settings.shot_set_size,
            floor=settings.fewshot_floor,
            seed=settings.seed,
        )
        if cache is not None:
            save_pool(cache, pool)
            save_pool_vectors(cache, {lang: j.memo() for lang, j in memos.items()})
    tick("few-shot pool", 1, 1)
    # Pool lines may be queries too (a small log would run out otherwise); a prompt never shows its
    # own query among its examples (FewShotPool.for_request).
    sampler = InputSampler(settings.seed, usable, locales=settings.locales, scenarios=prep.scenarios)

    # Generate-and-dedup rounds (see module docstring).
    cand: list[tuple[RequestVariables, Pick]] = []
    per_lang = {lang: LangDedup(judges[lang]) for lang in prep.langs}
    chosen: list[int] = []
    exhausted = False
    # One worker thread runs the judges (the encoder's forward passes) while this thread dresses
    # the round's candidates: the two overlap because torch releases the GIL in its kernels.
    judging = ThreadPoolExecutor(max_workers=1, thread_name_prefix="corpus-judge")
    draws = _Draws(sampler)
    try:
        for _round in range(settings.max_rounds):
            kept_total = sum(len(d.keep) for d in per_lang.values())
            if len(chosen) >= n or exhausted:
                break
            want = n - len(chosen)
            if cand:
                rate = max(kept_total / len(cand), 0.05)
                want = math.ceil(want / rate * 1.05) + 2
            exhausted = _generate_and_judge(
                draws, judging=judging, per_lang=per_lang, cand=cand, want=want, tick=tick
            )
            tick("dedup", 0, 1)
            while True:
                for d in per_lang.values():
                    if d.index:
                        _greedy(d, threshold)
                kept = sorted(d.index[p] for d in per_lang.values() for p in d.keep)
                chosen = kept[:n]
                if not _refit_vetoes(per_lang, set(chosen), cand, threshold):
                    break
            tick("dedup", 1, 1)
    finally:
        judging.shutdown(wait=True)

    records = _render_all(
        prep=prep, settings=settings, pool=pool, cand=cand, chosen=chosen, tick=tick, usable=usable
    )
    failures_extra: list[str] = []
    if len(chosen) < n and (exhausted or draws.exhausted()):
        failures_extra.append(
            f"only {len(chosen)} distinct requests were possible from the request logs "
            f"({len(cand)} candidates, cosine < {threshold} per language); asked for {n}"
        )
    elif len(chosen) < n:
        failures_extra.append(
            f"only {len(chosen)} distinct requests after {settings.max_rounds} rounds ({len(cand)} "
            f"candidates; the logs hold more): raise HARNESS__CORPUS__MAX_ROUNDS; asked for {n}"
        )
    return _write(
        prep=prep,
        settings=settings,
        inputs=inputs,
        pool=pool,
        judges=judges,
        per_lang=per_lang,
        cand=cand,
        chosen=chosen,
        records=records,
        failures_extra=failures_extra,
    )


def _render_all(
    *,
    prep: _Prepared,
    settings: CorpusSettings,
    pool: FewShotPool | None,
    cand: list[tuple[RequestVariables, Pick]],
    chosen: list[int],
    tick: Progress,
    usable: Sequence[Utterance] = (),
) -> list[CorpusRecord]:
    # Log lines beyond the pool, most confident first: the last real material a prompt can add
    # (ranked only when a record can have a target length: it costs a TF-IDF fit).
    in_pool = {e.id for e in pool.entries} if pool is not None else set()
    beyond: dict[str, list[Utterance]] = {}
    targets = prep.rows is not None or (
        prep.scenarios is not None and any(c.input_tokens is not None for c in prep.scenarios.classes)
    )
    if targets:
        rest = [u for u in usable if u.id not in in_pool]
        if any(u.confidence is None for u in rest):
            rest = fill_confidence(rest)
        for u in top_by_confidence(rest, len(rest)):
            beyond.setdefault(u.lang, []).append(u)
    # Trace prefix sharing: a block id seen in two or more used rows is shared text.
    id_counts: Counter[int] = Counter()
    rows = prep.rows
    if rows is not None:
        for ev in rows[: len(chosen)]:
            id_counts.update(set(ev.prefix_block_ids))
    records: list[CorpusRecord] = []
    template_sha = file_sha256(prep.tmpl.files)
    blocks = SharedBlocks(prep.tok, seed=settings.seed)
    for k, ci in enumerate(chosen):
        v, pick = cand[ci]
        rng = candidate_rng(settings.seed, ci, "render")
        shots = (
            pool.for_request(v.domain, rng, settings.shots_per_prompt, v.query, v.profile.lang)
            if pool is not None
            else []
        )
        v = v.model_copy(update={"fewshot_ids": [s.id for s in shots]})
        ev = rows[k] if rows is not None else None
        more = pool.more_for(v.domain, v.profile.lang, v.fewshot_ids, v.query) if pool is not None else []
        more += beyond.get(v.profile.lang, [])
        records.append(
            assemble_record(
                k=k,
                ci=ci,
                v=v,
                pick=pick,
                shots=shots,
                ev=ev,
                tmpl=prep.tmpl,
                renderer=prep.renderer,
                tok=prep.tok,
                template_sha=template_sha,
                id_counts=id_counts,
                settings=settings,
                rng=rng,
                blocks=blocks,
                more_shots=more,
            )
        )
        if k % 20 == 0:
            tick("render", k, len(chosen))
    tick("render", len(chosen), len(chosen))
    # Measured, not assumed: every prompt's length under the target tokenizer. Line by line with
    # the tokenizer's memo where that is exact (TargetTokenizer.line_additive): prompts share
    # most of their lines (the template's scaffold, few-shot lines), which are then tokenized once.
    counts = prep.tok.count_each([r.text() for r in records])
    for r, c in zip(records, counts, strict=True):
        r.prompt_tokens = c
        if r.target_input_tokens is not None and c == r.target_input_tokens and r.provenance.fitted == "none":
            r.provenance.fitted = "exact"
    return records


def _write(
    *,
    prep: _Prepared,
    settings: CorpusSettings,
    inputs: BuildInputs,
    pool: FewShotPool | None,
    judges: dict[str, dedup_mod.Judge],
    per_lang: dict[str, LangDedup],
    cand: list[tuple[RequestVariables, Pick]],
    chosen: list[int],
    records: list[CorpusRecord],
    failures_extra: list[str],
) -> BuildResult:
    threshold = settings.dedup_threshold
    chosen_set = set(chosen)
    dropped_total = sum(len(d.dropped) for d in per_lang.values())
    # Re-judge the corpus itself, per language: 0 pairs when dedup held.
    after_pairs = 0
    after_dropped = 0
    en_vecs = None
    judged: dict[str, dict[str, object]] = {}
    examples: list[dict[str, object]] = []
    for lang, d in per_lang.items():
        pos = [p for p, k in enumerate(d.index) if k in chosen_set]
        if pos:
            sub = d.vectors[pos]
            i, j, _ = d.judge.pairs(sub, threshold)
            after_pairs += len(i)
            after_dropped += len(set(j.tolist()))
            if isinstance(d.judge, dedup_mod.EmbeddingJudge):
                en_vecs = np.asarray(sub, dtype=np.float32)
        judged[lang] = {
            **d.judge.describe(),
            "threshold": threshold,
            "candidates": len(d.index),
            "dropped": len(d.dropped),
            "pairs": d.pairs,
            "records": len(pos),
        }
        for b, rep in sorted(d.dropped.items())[:5]:
            if rep < 0:
                continue
            examples.append(
                {
                    "lang": lang,
                    "kept": dedup_text(cand[d.index[rep]][0]),
                    "dropped": dedup_text(cand[d.index[b]][0]),
                    "cosine": round(d.sims.get((rep, b), float("nan")), 4),
                }
            )
    metrics = quality.compute(
        records,
        vectors=en_vecs,
        dup_before=dropped_total / len(cand) if cand else 0.0,
        dup_after=after_dropped / len(chosen) if chosen else 0.0,
    )
    metrics["requested"] = prep.n
    metrics["shortfall"] = prep.n - len(records)
    metrics["candidates"] = len(cand)
    metrics["dropped"] = dropped_total
    thresholds = Thresholds.of(settings)
    bad = quality.failures(metrics, thresholds) + failures_extra

    emb = next((j for j in judges.values() if isinstance(j, dedup_mod.EmbeddingJudge)), None)
    manifest = corpus_manifest(
        settings=settings,
        records=records,
        requested=prep.n,
        template=inputs.template,
        template_files=prep.tmpl.files,
        scenarios=inputs.scenarios,
        trace=inputs.trace,
        logs=prep.logs,
        tokenizer=prep.tok.path,
        embedder=emb.embedder.name if emb is not None else "none",
        embedder_dim=int(en_vecs.shape[1]) if en_vecs is not None and en_vecs.size else 0,
        candidates=len(cand),
        dropped=dropped_total,
        pairs=sum(d.pairs for d in per_lang.values()),
        dedup_judges=judged,
        fewshot=pool.summary() if pool is not None else {},
    )
    warnings = filler_warnings(records)
    quality_doc = {
        "metrics": metrics,
        "thresholds": thresholds.model_dump(),
        "failures": bad,
        "warnings": warnings,
        "dedup_judges": judged,
        "dedup_examples": examples,
    }
    write_corpus_files(inputs.out, records, manifest, quality_doc)
    if warnings:
        from harness.common.console import err

        for w in warnings:
            err().print(f"harness: warning: {w}", markup=False, highlight=False)
    return BuildResult(records, manifest, metrics, dropped_total, examples, bad, len(cand), warnings)


def filler_warnings(records: Sequence[CorpusRecord]) -> list[str]:
    """What to warn about a corpus whose prompts needed filler words to reach their lengths."""
    padded = [r for r in records if r.provenance.fill is not None and r.provenance.fill.filler > 0]
    if not padded:
        return []
    filler = sum(r.provenance.fill.filler for r in padded if r.provenance.fill is not None)
    total = sum(r.prompt_tokens or 0 for r in records)
    return [
        f"{len(padded)} of {len(records)} prompts needed filler words to reach their target length "
        f"({filler} tokens, {filler / max(total, 1):.1%} of all prompt tokens; after the instructions): "
        "the logs' dialogue history, catalogue entries and few-shot pool ran out. Give longer logs "
        "(--fewshot), a template that shows `dialogue` and `reference`, or --max-input-tokens"
    ]
