"""Builds a corpus: inputs → dedup → render → token fitting → quality → files.

The build runs in generate-and-dedup rounds. Candidate ``i`` is a pure function of ``(seed, i)``;
its request text (the user's query, the part that makes a request distinct; prompts share their
scaffold) is embedded, and greedy first-come dedup over all candidates so far decides who stays.
Greedy dedup is prefix-stable (an item's fate depends only on items before it), so later rounds
never change earlier decisions and the corpus is the first ``n`` kept candidates: deterministic
for a seed. Kept requests are then assigned, in order, to trace rows (arrival, token lengths,
shared prefix) when a trace is given, rendered, fitted, and written atomically.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from harness.common.errors import CheckFailed, ConfigError, InputError
from harness.common.io import check_input_file, write_json, write_jsonl
from harness.corpus import dedup as dedup_mod
from harness.corpus import quality
from harness.corpus.fewshot import FewShotPool, build_pool, read_log
from harness.corpus.inputs import InputSampler, Pick, candidate_rng, sample_distribution
from harness.corpus.model import (
    CORPUS_FILE,
    MANIFEST_FILE,
    QUALITY_FILE,
    CorpusRecord,
    FewShotLogEntry,
    Manifest,
    Message,
    Provenance,
    RequestVariables,
    Sampling,
    TemplateInfo,
)
from harness.corpus.sandbox import PromptRenderer, TemplateError
from harness.corpus.settings import CorpusSettings, Thresholds
from harness.corpus.tokens import TargetTokenizer, load_tokenizer
from harness.traces.model import ScenarioSet

Progress = Callable[[str, int, int], None]
"""``(phase, done, total)`` callback for progress bars."""

DOMAIN_LABELS = {
    "travel": ("travel", "旅行"),
    "ecommerce": ("online shopping", "电商"),
    "banking": ("banking", "银行"),
    "telecom": ("telecom", "通信"),
    "food_delivery": ("food delivery", "外卖"),
}


_EMBEDDERS: dict[tuple[str, int, str], Any] = {}


@dataclass
class BuildInputs:
    template: Path
    out: Path
    n: int | None = None
    scenarios: Path | None = None
    fewshot: Path | None = None
    trace: Path | None = None
    trace_format: str | None = None
    template_roots: list[Path] = field(default_factory=list)


@dataclass
class BuildResult:
    records: list[CorpusRecord]
    manifest: Manifest
    metrics: dict[str, float | int | None]
    dedup: dedup_mod.DedupResult
    failures: list[str]
    candidates: int


@dataclass
class _Template:
    """A prompt template (one ``.j2``) or a messages spec (``.messages.json`` naming one per role)."""

    kind: str
    name: str
    parts: list[tuple[str, str | None]]
    """(role, template name) for messages; role ``fewshot`` expands to user/assistant pairs."""
    files: list[Path]


def _load_template(path: Path, renderer: PromptRenderer) -> _Template:
    if path.suffix == ".json":
        check_input_file(path)
        try:
            spec = orjson.loads(path.read_bytes())
        except orjson.JSONDecodeError as exc:
            raise TemplateError(f"messages spec is not valid JSON: {exc}", file=path) from None
        if not isinstance(spec, dict) or not isinstance(spec.get("messages"), list):
            raise TemplateError("messages spec needs a 'messages' list", file=path, field="messages")
        parts: list[tuple[str, str | None]] = []
        for i, m in enumerate(spec["messages"]):
            role = m.get("role") if isinstance(m, dict) else None
            if role not in ("system", "user", "assistant", "fewshot"):
                raise TemplateError(
                    "role must be system, user, assistant or fewshot", file=path, field=f"messages[{i}].role"
                )
            tmpl = m.get("template")
            if role != "fewshot" and not isinstance(tmpl, str):
                raise TemplateError(
                    "a message needs a 'template' name", file=path, field=f"messages[{i}].template"
                )
            parts.append((role, tmpl))
        files = [path] + [renderer.loader.resolve(t) for _, t in parts if t is not None]
        for _, t in parts:
            if t is not None:
                renderer.template(t)  # syntax errors surface before any data is generated
        return _Template("messages", path.name, parts, files)
    renderer.template(path.name)
    return _Template("prompt", path.name, [], [renderer.loader.resolve(path.name)])


def _sha(paths: Sequence[Path]) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(p.read_bytes())
    return h.hexdigest()


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


def _context(
    v: RequestVariables, pick: Pick, shots: list[FewShotLogEntry], history: int | None
) -> dict[str, Any]:
    """Template variables. Values are plain data (dicts, lists, strings): nothing is compiled."""
    lang = v.profile.lang
    label = DOMAIN_LABELS.get(v.domain, (v.domain, v.domain))[1 if lang == "zh" else 0]
    session = v.session.model_dump()
    if history is not None:
        session["events"] = session["events"][-history:] if history else []
    return {
        "lang": lang,
        "domain": v.domain,
        "domain_label": label,
        "intent": v.intent,
        "query": v.query,
        "profile": v.profile.model_dump(),
        "session": session,
        "request_at": v.request_at,
        "constraints": dict(v.constraints),
        "fewshots": [
            {"id": s.id, "text": s.text, "response": s.response or "", "domain": s.domain or ""}
            for s in shots
        ],
        "scenario": {"name": pick.scenario.name, "tags": dict(pick.scenario.tags)} if pick.scenario else None,
    }


def dedup_text(v: RequestVariables, mode: str = "variables") -> str:
    """The text dedup compares: the query alone, or every variable part of the prompt.

    Rendered prompts share their template scaffold, which would dominate their embeddings; the
    variable parts (who asks, what they did, what they ask, under which constraints) are what makes
    two requests different, so that is what ``variables`` embeds.
    """
    if mode == "query":
        return v.query
    p = v.profile
    actions = ", ".join(f"{e.action} {e.detail}" for e in v.session.events[-4:])
    cons = "; ".join(f"{k}={val}" for k, val in sorted(v.constraints.items()) if not k.startswith("window"))
    return f"{v.query} | {p.name}, {p.tier}, {p.city} | {actions} | {cons}"


def build_corpus(
    inputs: BuildInputs, settings: CorpusSettings, progress: Progress | None = None
) -> BuildResult:
    """Build the corpus described by ``inputs`` into ``inputs.out`` and return what was written."""
    from harness.common.embeddings import Embedder
    from harness.common.settings import HarnessSettings

    tick = progress or (lambda phase, done, total: None)
    template_path = inputs.template
    if not template_path.is_file():
        raise TemplateError("template file not found", file=template_path)
    roots = [template_path.resolve().parent, *inputs.template_roots]
    renderer = PromptRenderer(
        roots, max_output_chars=settings.max_output_chars, max_render_s=settings.max_render_s
    )
    tmpl = _load_template(template_path, renderer)
    scen = _scenarios(inputs.scenarios) if inputs.scenarios is not None else None
    rows = _trace_rows(inputs.trace, inputs.trace_format, inputs.n) if inputs.trace is not None else None
    n = inputs.n if inputs.n is not None else (len(rows) if rows is not None else None)
    if n is None or n < 1:
        raise ConfigError("give --n (the number of requests), or --trace to take one request per trace line")
    if rows is not None and len(rows) < n:
        n = len(rows)

    cache = HarnessSettings().run_dir / "cache" / "embeddings.sqlite" if settings.embed_cache else None
    key = (settings.device, settings.batch_size, str(cache))
    embedder = _EMBEDDERS.get(key)
    if embedder is None:  # one per process and configuration: loading the model costs seconds
        embedder = _EMBEDDERS[key] = Embedder(
            device=settings.device, batch_size=settings.batch_size, cache_path=cache
        )
    tok = load_tokenizer(str(settings.tokenizer) if settings.tokenizer else None, settings.seed)
    pool: FewShotPool | None = None
    if inputs.fewshot is not None:
        tick("few-shot pool", 0, 1)
        pool = build_pool(
            read_log(inputs.fewshot),
            embedder,
            top_n=settings.fewshot_top_n,
            k=settings.fewshot_k,
            shot_set_size=settings.shot_set_size,
            floor=settings.fewshot_floor,
            seed=settings.seed,
        )
        tick("few-shot pool", 1, 1)
    sampler = InputSampler(settings.seed, locales=settings.locales, scenarios=scen)

    # Generate-and-dedup rounds (see module docstring).
    cand: list[tuple[RequestVariables, Pick]] = []
    vecs = np.zeros((0, 0), dtype=np.float32)
    result = dedup_mod.dedup(np.zeros((0, 1), np.float32), settings.dedup_threshold, settings.dedup_method)
    for _round in range(settings.max_rounds):
        kept = len(result.keep)
        if kept >= n:
            break
        want = n - kept
        if cand:
            rate = max(kept / len(cand), 0.05)
            want = math.ceil(want / rate * 1.1) + 4
        start = len(cand)
        for i in range(start, start + want):
            cand.append(sampler.variables(i))
            if (i - start) % 50 == 0:
                tick("generate", i - start, want)
        tick("generate", want, want)
        texts = [dedup_text(v, settings.dedup_on) for v, _ in cand[start:]]
        tick("embed", 0, len(texts))
        fresh = _encode(embedder, texts, partial(tick, "embed"))
        vecs = fresh if vecs.size == 0 else np.vstack([vecs, fresh])
        tick("dedup", 0, 1)
        result = dedup_mod.dedup(vecs, settings.dedup_threshold, settings.dedup_method)
        tick("dedup", 1, 1)
    if len(result.keep) < n:
        raise CheckFailed(
            f"only {len(result.keep)} distinct requests (cosine < {settings.dedup_threshold}) after "
            f"{len(cand)} candidates in {settings.max_rounds} rounds; ask for fewer, raise the threshold, "
            "or add locales / scenarios"
        )
    chosen = [int(i) for i in result.keep[:n]]

    # Trace prefix sharing: a block id seen in two or more used rows is shared text.
    id_counts: Counter[int] = Counter()
    if rows is not None:
        for ev in rows[:n]:
            id_counts.update(set(ev.prefix_block_ids))

    records: list[CorpusRecord] = []
    template_sha = _sha(tmpl.files)
    for k, ci in enumerate(chosen):
        v, pick = cand[ci]
        rng = candidate_rng(settings.seed, ci, "render")
        shots = pool.for_request(v.domain, rng, settings.shots_per_prompt) if pool is not None else []
        v = v.model_copy(update={"fewshot_ids": [s.id for s in shots]})
        ev = rows[k] if rows is not None else None
        records.append(
            _record(
                k=k,
                ci=ci,
                v=v,
                pick=pick,
                shots=shots,
                ev=ev,
                tmpl=tmpl,
                renderer=renderer,
                tok=tok,
                template_sha=template_sha,
                id_counts=id_counts,
                settings=settings,
                rng=rng,
            )
        )
        if k % 20 == 0:
            tick("render", k, n)
    tick("render", n, n)

    # Measured, not assumed: every prompt's length under the target tokenizer.
    counts = tok.count_batch([r.text() for r in records])
    for r, c in zip(records, counts, strict=True):
        r.prompt_tokens = c
        if r.target_input_tokens is not None and c == r.target_input_tokens and r.provenance.fitted == "none":
            r.provenance.fitted = "exact"

    kept_vecs = vecs[chosen]
    after = dedup_mod.dedup(kept_vecs, settings.dedup_threshold, settings.dedup_method)
    metrics = quality.compute(
        records,
        vectors=kept_vecs,
        dup_before=result.n_dropped / len(cand) if cand else 0.0,
        dup_after=after.n_dropped / len(chosen) if chosen else 0.0,
    )
    metrics["candidates"] = len(cand)
    metrics["dropped"] = result.n_dropped
    thresholds = Thresholds.of(settings)
    bad = quality.failures(metrics, thresholds)

    manifest = Manifest(
        created_at=datetime.now(UTC).isoformat(),
        seed=settings.seed,
        n=len(records),
        templates=[TemplateInfo(path=str(p), sha256=_sha([p])) for p in tmpl.files],
        embedder=embedder.name,
        embedder_dim=int(vecs.shape[1]) if vecs.size else 0,
        tokenizer=str(tok.path),
        block_size=settings.block_size,
        dedup={
            "threshold": settings.dedup_threshold,
            "method": result.method,
            "candidates": len(cand),
            "dropped": result.n_dropped,
            "pairs": result.pairs,
        },
        counts={
            "records": len(records),
            "candidates": len(cand),
            "dropped": result.n_dropped,
            "with_prefix": sum(1 for r in records if r.prefix_tokens > 0),
            "fitted_exact": sum(
                1
                for r in records
                if r.target_input_tokens is not None and r.prompt_tokens == r.target_input_tokens
            ),
        },
        inputs={
            "template": str(inputs.template),
            "scenarios": str(inputs.scenarios) if inputs.scenarios else None,
            "fewshot": str(inputs.fewshot) if inputs.fewshot else None,
            "trace": str(inputs.trace) if inputs.trace else None,
        },
        fewshot=pool.summary() if pool is not None else {},
        settings={k: (str(v) if isinstance(v, Path) else v) for k, v in settings.model_dump().items()},
    )
    out = inputs.out
    write_jsonl(out / CORPUS_FILE, (r.model_dump(mode="json", exclude_none=True) for r in records))
    write_json(out / MANIFEST_FILE, manifest.model_dump(mode="json"))
    examples = [
        {
            "kept": dedup_text(cand[a][0], settings.dedup_on),
            "dropped": dedup_text(cand[b][0], settings.dedup_on),
            "cosine": round(s, 4),
        }
        for a, b, s in result.examples
    ]
    write_json(
        out / QUALITY_FILE,
        {
            "metrics": metrics,
            "thresholds": thresholds.model_dump(),
            "failures": bad,
            "dedup_examples": examples,
        },
    )
    return BuildResult(records, manifest, metrics, result, bad, len(cand))


def _encode(embedder: Any, texts: list[str], tick: Callable[..., None]) -> npt.NDArray[np.float32]:
    chunk = max(embedder.batch_size * 4, 256)
    parts = []
    for s in range(0, len(texts), chunk):
        parts.append(embedder.encode(texts[s : s + chunk]))
        tick(min(len(texts), s + chunk), len(texts))
    return np.vstack(parts) if parts else np.zeros((0, embedder.dim), dtype=np.float32)


def _record(
    *,
    k: int,
    ci: int,
    v: RequestVariables,
    pick: Pick,
    shots: list[FewShotLogEntry],
    ev: Any,
    tmpl: _Template,
    renderer: PromptRenderer,
    tok: TargetTokenizer,
    template_sha: str,
    id_counts: Counter[int],
    settings: CorpusSettings,
    rng: np.random.Generator,
) -> CorpusRecord:
    sc = pick.scenario
    target: int | None = None
    prefix_ids: tuple[int, ...] = ()
    bs = settings.block_size
    cap = settings.max_input_tokens
    if ev is not None:
        target = int(ev.input_tokens) if cap is None else min(int(ev.input_tokens), cap)
        bs = int(ev.block_size or settings.block_size)
        lead = 0
        for b in ev.prefix_block_ids:
            if id_counts[b] < 2:
                break
            lead += 1
        room = max(0, (target - settings.min_body_tokens) // bs) if target > settings.min_body_tokens else 0
        prefix_ids = tuple(ev.prefix_block_ids[: min(lead, room)])
        out_tokens = int(ev.output_tokens)
    else:
        if sc is not None and sc.input_tokens is not None:
            target = sample_distribution(sc.input_tokens, rng)
            if cap is not None:
                target = min(target, cap)
        if sc is not None and sc.output_tokens is not None:
            out_tokens = sample_distribution(sc.output_tokens, rng)
        else:
            out_tokens = int(np.clip(rng.lognormal(np.log(160), 0.6), 16, 1024))
    prefix = tok.prefix(prefix_ids, bs) if prefix_ids else ""
    prefix_tokens = len(prefix_ids) * bs

    def render(history: int | None, use_shots: bool) -> list[tuple[str, str]]:
        ctx = _context(v, pick, shots if use_shots else [], history)
        if tmpl.kind == "prompt":
            return [("prompt", renderer.render(tmpl.name, ctx))]
        msgs: list[tuple[str, str]] = []
        for role, name in tmpl.parts:
            if role == "fewshot":
                for s in ctx["fewshots"]:
                    msgs.append(("user", s["text"]))
                    if s["response"]:
                        msgs.append(("assistant", s["response"]))
            else:
                assert name is not None
                msgs.append((role, renderer.render(name, ctx)))
        return msgs

    parts = render(None, True)
    fitted = "none"
    if target is not None:
        budget = target - prefix_tokens
        fixed = sum(tok.count(t) for _, t in parts[:-1])
        if fixed + tok.count(parts[-1][1]) > budget:  # shorten before cutting: fewer shots, less history
            parts = render(2, False)
            fixed = sum(tok.count(t) for _, t in parts[:-1])
        body, _, fitted = tok.fit(parts[-1][1], max(0, budget - fixed), key=f"{settings.seed}:{ci}")
        parts[-1] = (parts[-1][0], body)
    if prefix:
        first_role, first_text = parts[0]
        parts[0] = (first_role, prefix + "\n\n" + first_text)
    prov = Provenance(
        seed=settings.seed,
        candidate=ci,
        template=tmpl.name,
        template_sha256=template_sha,
        source=getattr(ev, "source", None) or None,
        source_line=getattr(ev, "line", None),
        source_trace_id=getattr(ev, "source_trace_id", None),
        fitted=fitted,
    )
    prompt = parts[0][1] if tmpl.kind == "prompt" else None
    messages = [Message(role=r, content=t) for r, t in parts] if tmpl.kind == "messages" else None
    return CorpusRecord(
        id=f"req-{settings.seed}-{k:06d}",
        tenant=(getattr(ev, "tenant", None) or settings.tenant),
        scenario=sc.name if sc is not None else (getattr(ev, "operation", None) if ev is not None else None),
        prompt=prompt,
        messages=messages,
        sampling=Sampling(temperature=settings.temperature, seed=int(rng.integers(2**31))),
        max_tokens=max(1, out_tokens),
        expected_output_tokens=max(0, out_tokens),
        arrival_offset_s=float(ev.arrival_s) if ev is not None else None,
        prefix_group=f"blk-{prefix_ids[0]}" if prefix_ids else None,
        prefix_tokens=prefix_tokens,
        target_input_tokens=target,
        lang=v.profile.lang,
        domain=v.domain,
        intent=v.intent,
        variables=v,
        provenance=prov,
    )
