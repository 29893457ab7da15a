"""Session corpora: whole conversations from dialogue logs, one record per user turn (``--sessions``).

A session record is a turn ``k`` of a conversation: the log's user message verbatim, the think time
before it, the session's system prompt and retrieved context, and the history of turns ``1 … k−1``
(the log's answers; a replay with live history swaps in the target's, :mod:`harness.load.sessions`).
The history reaches the template as user/assistant messages (a ``.messages.json`` spec with a
``history`` part) or as a rendered transcript (``{{ transcript }}`` in a ``.j2`` prompt, rendered by
:func:`transcript`, the one transcript format, which the live replay uses too). An agent's turns
carry the tools, the tool results that open a turn (``session.inputs``) and the log's calls
(``session.log_tool_calls``), which a live replay matches the target's own calls against
(:mod:`harness.load.sessions`).

The conversations are :class:`~harness.corpus.dialogues.Dialogue` objects read from dialogue logs
(:mod:`harness.corpus.dialogues`, which describes the formats). Think time before turn ``k > 1``
(:func:`think_times`): from the log's timestamps where it has them (``ts_k − replied_at_{k−1}``,
else ``ts_k − ts_{k−1}``), or from a timing trace (``--trace``, :mod:`harness.corpus.timing`;
session ``i`` of the trace times dialogue ``i``, turns by the gaps between arrivals), else drawn
from a stated distribution (:class:`~harness.corpus.timing.ThinkTime`), seeded per session and
turn. Dedup (cosine ≥ the threshold, the corpus's per-language judges) judges each session's FIRST
user turn, so that whole conversations are kept or dropped together.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from harness.common.errors import ConfigError
from harness.common.stats import percentile
from harness.corpus import catalog
from harness.corpus import dedup as dedup_mod
from harness.corpus.assemble import PromptTemplate, load_template
from harness.corpus.dialogues import Dialogue, detect_session_format, materialize, read_dialogues
from harness.corpus.manifest import file_sha256, write_corpus_files
from harness.corpus.model import (
    CorpusRecord,
    Manifest,
    Message,
    Provenance,
    Sampling,
    SessionTurn,
    TemplateInfo,
)
from harness.corpus.sandbox import PromptRenderer, TemplateError
from harness.corpus.settings import CorpusSettings
from harness.corpus.timing import SessionTiming, ThinkTime, read_timing_trace
from harness.corpus.tokens import load_tokenizer

REPO = Path(__file__).resolve().parents[2]
DEFAULT_SESSION_LOGS = (REPO / "fixtures" / "corpus" / "crosswoz_sample.json.zip",)
DEFAULT_SESSION_TEMPLATE = REPO / "templates" / "prompts" / "session.messages.json"
HISTORY_MARK = "\u27e6history\u27e7"
"""Rendered in place of ``{{ transcript }}`` to find where the history sits in a prompt."""
MAX_OUTPUT_TOKENS = 1024


# ----------------------------------------------------------------------------------- think time


def think_times(
    d: Dialogue, timing: SessionTiming | None, dist: ThinkTime, seed: int, trace_source: str = "trace"
) -> tuple[list[float], list[str]]:
    """Think time before each turn of ``d`` (0 before the first) and where each came from."""
    times, sources = [0.0], ["none"]
    for k in range(1, len(d.turns)):
        cur, prev = d.turns[k], d.turns[k - 1]
        if cur.ts is not None and (prev.replied_at is not None or prev.ts is not None):
            base = prev.replied_at if prev.replied_at is not None else prev.ts
            assert base is not None
            times.append(max(0.0, cur.ts - base))
            sources.append("log")
        elif timing is not None and k - 1 < len(timing.think_s):
            times.append(timing.think_s[k - 1])
            sources.append(trace_source)
        else:
            times.append(dist.draw(seed, d.id, k + 1))
            sources.append(dist.describe())
    return times, sources


# ------------------------------------------------------------------------------------ rendering

TRANSCRIPT_LABELS = {"zh": ("用户", "助手"), "en": ("User", "Assistant")}


def transcript(pairs: Sequence[tuple[str, str]], lang: str) -> str:
    """The one rendered transcript of a history (completions API): ``User: …\\nAssistant: …\\n`` per turn."""
    user, assistant = TRANSCRIPT_LABELS.get(lang, TRANSCRIPT_LABELS["en"])
    return "".join(f"{user}: {u}\n{assistant}: {a}\n" for u, a in pairs)


def retrieved_context(d: Dialogue) -> list[dict[str, Any]]:
    """Catalogue entries of the venues the dialogue names (stable for the whole session)."""
    cat = catalog.load_catalog()
    out: list[dict[str, Any]] = []
    for name in d.venues:
        v = cat.venue_by_name.get(name)
        if v is None:
            continue
        entry = {
            "name": v.name,
            "domain": v.domain,
            "district": v.district,
            "subway": v.subway,
            "rating": v.rating,
            "price": v.price,
            "type": v.type,
            "dishes": list(v.dishes),
        }
        out.append({k: val for k, val in entry.items() if val not in (None, [])})
    return out


def _context(d: Dialogue, k: int, query: str, transcript_text: str) -> dict[str, Any]:
    ctx = retrieved_context(d)
    return {
        "lang": d.lang,
        "domain": d.domain,
        "domain_label": catalog.label(d.domain, d.lang),
        "intent": d.intent,
        "query": query,
        "session_id": d.id,
        "turn": k,
        "context": ctx,
        "context_text": "\n".join(
            "- " + "; ".join(f"{k}={'、'.join(v) if isinstance(v, list) else v}" for k, v in e.items())
            for e in ctx
        ),
        "transcript": transcript_text,
    }


def render_turn(
    tmpl: PromptTemplate, renderer: PromptRenderer, d: Dialogue, k: int, pairs: list[tuple[str, str]]
) -> tuple[str | None, list[Message] | None, tuple[int, int]]:
    """Turn ``k`` (1-based) with ``pairs`` as its history: (prompt, messages, history_at).

    An agent's conversation (:attr:`Dialogue.agentic`) needs a chat template: its history is every
    earlier turn's opening messages and the log's answer with its tool calls, its system part the
    log's own system messages (when it has any), and a turn opened by tool results carries them in
    place of the template's user part."""
    turn = d.turns[k - 1]
    query = turn.user
    if tmpl.kind == "prompt":
        if d.agentic:
            raise TemplateError(
                f"dialogue {d.id!r} has tools or tool calls: a prompt (completions) template cannot "
                "carry them; use a chat template (templates/prompts/session.messages.json)",
                file=tmpl.files[0],
            )
        text = renderer.render(tmpl.name, _context(d, k, query, HISTORY_MARK))
        if text.count(HISTORY_MARK) != 1:
            raise TemplateError(
                "a session prompt template must show {{ transcript }} exactly once", file=tmpl.files[0]
            )
        head, tail = text.split(HISTORY_MARK)
        body = transcript(pairs, d.lang)
        return head + body + tail, None, (len(head), len(head) + len(body))
    msgs: list[Message] = []
    at = (0, 0)
    ctx = _context(d, k, query, transcript(pairs, d.lang))
    system_done = False
    for role, name in tmpl.parts:
        if role == "history":
            start = len(msgs)
            for earlier in d.turns[: k - 1]:
                msgs += [*earlier.opener(), earlier.answer()]
            at = (start, len(msgs))
        elif role == "fewshot":
            continue  # a session's examples are its own history
        elif role == "system" and d.system:
            if not system_done:  # the log's own system prompt, verbatim, once
                msgs += [Message(role="system", content=text) for text in d.system]
                system_done = True
        elif role == "user" and (turn.inputs or d.verbatim):
            msgs += turn.opener()  # tool results (and what the user added), a trace's text: verbatim
        else:
            assert name is not None
            # A template's final newline is not part of a message (the user's text stays verbatim).
            msgs.append(Message(role=role, content=renderer.render(name, ctx).rstrip("\n")))
    if not any(role == "history" for role, _ in tmpl.parts):
        raise TemplateError('a session messages spec needs a {"role": "history"} part', file=tmpl.files[0])
    return None, msgs, at


# ---------------------------------------------------------------------------------------- build


@dataclass
class SessionBuildInputs:
    out: Path
    logs: list[Path] | None = None
    """Dialogue logs; ``None``: the bundled CrossWOZ sample."""
    template: Path = DEFAULT_SESSION_TEMPLATE
    n: int | None = None
    """Sessions to keep (``None``: every distinct one)."""
    think_time: ThinkTime = field(default_factory=ThinkTime)
    trace: Path | None = None
    template_roots: list[Path] = field(default_factory=list)


@dataclass
class SessionBuildResult:
    records: list[CorpusRecord]
    manifest: Manifest
    metrics: dict[str, Any]
    sessions: list[dict[str, Any]]
    dropped: int
    examples: list[dict[str, object]]
    failures: list[str]


def _dedup_first_turns(
    dialogues: list[Dialogue], settings: CorpusSettings, tick: Callable[[str, int, int], None]
) -> tuple[list[int], dict[int, tuple[int, float]], dict[str, dict[str, object]]]:
    """Indices of the dialogues kept (greedy, in order) and, for each dropped one, (kept, cosine).
    A trace's conversations are distinct by construction (and have no text yet): all kept."""
    from harness.corpus.rounds import _judges  # the corpus's one way to make its per-language judges

    traced = [i for i, d in enumerate(dialogues) if d.from_trace]
    if traced:
        rest = [i for i, d in enumerate(dialogues) if not d.from_trace]
        if not rest:
            return traced, {}, {}
        kept_rest, gone, judged_rest = _dedup_first_turns([dialogues[i] for i in rest], settings, tick)
        gone_back = {rest[b]: (rest[a], c) for b, (a, c) in gone.items()}
        return sorted(traced + [rest[i] for i in kept_rest]), gone_back, judged_rest

    langs = sorted({d.lang for d in dialogues})
    missing = [lang for lang in langs if lang not in settings.dedup_judges]
    if missing:
        raise ConfigError(
            f"no dedup judge for language(s) {', '.join(missing)}", field="HARNESS__CORPUS__DEDUP_JUDGES"
        )
    reference = [_Utt(t.user, d.lang) for d in dialogues for t in d.turns]
    judges = _judges(settings, reference, langs, tick)  # type: ignore[arg-type]
    threshold = settings.dedup_threshold
    kept: list[int] = []
    dropped: dict[int, tuple[int, float]] = {}
    described: dict[str, dict[str, object]] = {}
    for lang in langs:
        idx = [i for i, d in enumerate(dialogues) if d.lang == lang]
        judge = judges[lang]
        vecs = judge.vectors([dialogues[i].turns[0].user for i in idx])
        i_arr, j_arr, s_arr = judge.pairs(vecs, threshold - dedup_mod.MARGIN)
        alive = np.ones(len(idx), dtype=bool)
        for a, b, s in sorted(
            zip(i_arr.tolist(), j_arr.tolist(), s_arr.tolist(), strict=True), key=lambda x: (x[1], x[0])
        ):
            if alive[a] and alive[b]:  # the later one goes, the first-come one stays
                alive[b] = False
                dropped[idx[b]] = (idx[a], float(s))
        kept += [idx[p] for p in np.flatnonzero(alive)]
        described[lang] = {
            **judge.describe(),
            "threshold": threshold,
            "on": "first turn",
            "sessions": len(idx),
            "dropped": int((~alive).sum()),
        }
    return sorted(kept), dropped, described


@dataclass(frozen=True, slots=True)
class _Utt:
    """What a lexical judge's reference needs of an utterance."""

    text: str
    lang: str


def build_sessions(
    inputs: SessionBuildInputs,
    settings: CorpusSettings,
    progress: Callable[[str, int, int], None] | None = None,
) -> SessionBuildResult:
    """Build a session corpus into ``inputs.out``; deterministic for a seed."""
    tick = progress or (lambda phase, done, total: None)
    if not inputs.template.is_file():
        raise TemplateError("template file not found", file=inputs.template)
    renderer = PromptRenderer(
        [inputs.template.resolve().parent, *inputs.template_roots],
        max_output_chars=settings.max_output_chars,
        max_render_s=settings.max_render_s,
    )
    tmpl = load_template(inputs.template, renderer)
    logs = list(inputs.logs) if inputs.logs else list(DEFAULT_SESSION_LOGS)
    for p in logs:
        detect_session_format(p)  # an unknown format fails before anything is read in full
    timing = read_timing_trace(inputs.trace) if inputs.trace is not None else None
    tok = load_tokenizer(str(settings.tokenizer) if settings.tokenizer else None, settings.seed)
    tick("read logs", 0, 1)
    dialogues = read_dialogues(logs)
    tick("read logs", 1, 1)
    # A seeded order: --n takes a sample, not the head of the file; first-come dedup follows it.
    order = np.random.default_rng([settings.seed, 0x5E55]).permutation(len(dialogues))
    dialogues = [dialogues[i] for i in order]
    kept, dropped, judged = _dedup_first_turns(dialogues, settings, tick)
    n = inputs.n if inputs.n is not None else len(kept)
    chosen = kept[:n]
    template_sha = file_sha256(tmpl.files)
    records: list[CorpusRecord] = []
    t0 = min((d.turns[0].ts or 0.0 for d in dialogues if d.from_trace), default=0.0)
    for s, di in enumerate(chosen):
        d = dialogues[di]
        traced = d.from_trace
        if traced:
            d = materialize(d, tok)
        timing_s = timing.sessions[s % len(timing.sessions)] if timing else None
        if traced and timing_s is None:  # a trace's conversation starts when the trace says
            timing_s = SessionTiming((d.turns[0].ts or 0.0) - t0, ())
        thinks, sources = think_times(
            d, timing_s, inputs.think_time, settings.seed, timing.think_source if timing else "trace"
        )
        if traced:  # its turns' times are the trace's arrivals, sessions inferred from prefixes
            sources = [src if src != "log" else "trace-prefix" for src in sources]
        pairs: list[tuple[str, str]] = []
        sid = f"s{settings.seed}-{s:05d}"
        rng = np.random.default_rng([settings.seed, s, 0x7E])
        for k, turn in enumerate(d.turns, start=1):
            prompt, msgs, at = render_turn(tmpl, renderer, d, k, pairs)
            reply_text = turn.answer().text()
            reply_tokens = tok.count(reply_text) if reply_text else 0
            out_tokens = min(MAX_OUTPUT_TOKENS, max(32, math.ceil(reply_tokens * 1.5)))
            records.append(
                CorpusRecord(
                    id=f"{sid}-t{k:02d}",
                    tenant=settings.tenant,
                    prompt=prompt,
                    messages=msgs,
                    sampling=Sampling(temperature=settings.temperature, seed=int(rng.integers(2**31))),
                    max_tokens=out_tokens,
                    expected_output_tokens=reply_tokens,
                    arrival_offset_s=timing_s.start_s if (timing_s is not None and k == 1) else None,
                    tools=d.tools,
                    tool_choice=d.tool_choice if d.tools else None,
                    prefix_group=sid,
                    lang=d.lang,
                    domain=d.domain,
                    intent=d.intent if k == 1 else "tool_result" if turn.inputs else "follow_up",
                    provenance=Provenance(
                        seed=settings.seed,
                        candidate=int(order[di]),
                        template=tmpl.name,
                        template_sha256=template_sha,
                        query_source=d.source,
                        query_id=f"{d.id}-{k}",
                        query_at=turn.where or None,
                    ),
                    session=SessionTurn(
                        session_id=sid,
                        turn=k,
                        turns=len(d.turns),
                        user=turn.user,
                        think_time_s=round(thinks[k - 1], 6),
                        think_source=sources[k - 1],
                        history_at=at,
                        log_reply=turn.reply,
                        inputs=list(turn.inputs) if turn.inputs else None,
                        log_tool_calls=list(turn.calls) or None,
                    ),
                )
            )
            pairs.append((turn.user, turn.reply or ""))
        tick("render", s + 1, len(chosen))
    counts = tok.count_batch([r.text() for r in records])
    for r, c in zip(records, counts, strict=True):
        r.prompt_tokens = c
    per_session = session_rows(records, tok.count_batch)
    metrics = session_metrics(records, per_session)
    metrics.update(
        requested=n, shortfall=max(0, n - len(chosen)), candidates=len(dialogues), dropped=len(dropped)
    )
    if timing is not None:
        metrics["timing_trace"] = timing.summary()
    failures: list[str] = []
    if inputs.n is not None and len(chosen) < inputs.n:
        failures.append(
            f"only {len(chosen)} distinct sessions were possible from the dialogue logs "
            f"({len(dialogues)} dialogues, first turns at cosine < {settings.dedup_threshold}); "
            f"asked for {inputs.n}"
        )
    examples = [
        {"kept": dialogues[k].turns[0].user, "dropped": dialogues[b].turns[0].user, "cosine": round(c, 4)}
        for b, (k, c) in sorted(dropped.items())[:5]
    ]
    manifest = Manifest(
        created_at=datetime.now(UTC).isoformat(),
        seed=settings.seed,
        n=len(records),
        templates=[TemplateInfo(path=str(p), sha256=file_sha256([p])) for p in tmpl.files],
        embedder="none",
        embedder_dim=0,
        tokenizer=str(tok.path),
        block_size=settings.block_size,
        dedup={
            "threshold": settings.dedup_threshold,
            "on": "first turn",
            "candidates": len(dialogues),
            "dropped": len(dropped),
        },
        dedup_judges=judged,
        counts={
            "sessions": len(chosen),
            "records": len(records),
            "candidates": len(dialogues),
            "dropped": len(dropped),
        },
        inputs={
            "template": str(inputs.template),
            "fewshot": ", ".join(map(str, logs)),
            "trace": str(inputs.trace) if inputs.trace else None,
            "think_time": inputs.think_time.describe(),
            "trace_sessions": (
                None
                if timing is None
                else "{sessions} sessions ({multi_turn_sessions} of several turns) from {requests} lines, "
                "by {sessions_from}".format(**timing.summary())
            ),
        },
        sources=[
            {"file": str(p), "format": detect_session_format(p), "sha256": file_sha256([p])} for p in logs
        ],
        settings={
            "sessions": True,
            **{k: (str(v) if isinstance(v, Path) else v) for k, v in settings.model_dump().items()},
        },
    )
    quality_doc = {
        "metrics": metrics,
        "failures": failures,
        "sessions": per_session,
        "dedup_judges": judged,
        "dedup_examples": examples,
    }
    write_corpus_files(inputs.out, records, manifest, quality_doc)
    return SessionBuildResult(records, manifest, metrics, per_session, len(dropped), examples, failures)


def history_texts(r: CorpusRecord) -> list[str]:
    """The history part of a session turn's body, where ``session.history_at`` says it is."""
    if r.session is None:
        return []
    a, b = r.session.history_at
    if b <= a:
        return []
    if r.prompt is not None:
        return [r.prompt[a:b]]
    return [m.text() for m in (r.messages or [])[a:b]]


def session_rows(
    records: Sequence[CorpusRecord], count_batch: Callable[[list[str]], list[int]]
) -> list[dict[str, Any]]:
    """Per-session quality rows (``quality.json`` ``sessions``; ``harness corpus stats``), in order of
    first appearance: ``session_id``, ``dialogue`` (the log's id), ``lang``, ``turns``,
    ``history_tokens_max`` / ``_mean`` (tokens of each turn's history: messages' contents or the
    transcript, counted by ``count_batch``), ``prompt_tokens_max`` and ``think_time_s_sum``."""
    texts = [history_texts(r) for r in records]
    flat = count_batch([t for ts in texts for t in ts])
    rows: dict[str, dict[str, Any]] = {}
    hist: dict[str, list[int]] = {}
    at = 0
    for r, ts in zip(records, texts, strict=True):
        st = r.session
        n = sum(flat[at : at + len(ts)])
        at += len(ts)
        if st is None:
            continue
        row = rows.get(st.session_id)
        if row is None:
            qid = r.provenance.query_id or ""
            row = rows[st.session_id] = {
                "session_id": st.session_id,
                "dialogue": qid.rsplit("-", 1)[0] if qid else None,
                "lang": r.lang,
                "turns": 0,
                "prompt_tokens_max": None,
                "think_time_s_sum": 0.0,
            }
        row["turns"] += 1
        row["think_time_s_sum"] = round(row["think_time_s_sum"] + st.think_time_s, 6)
        if r.prompt_tokens is not None:
            row["prompt_tokens_max"] = max(row["prompt_tokens_max"] or 0, r.prompt_tokens)
        hist.setdefault(st.session_id, []).append(n)
    for sid, row in rows.items():
        h = hist[sid]
        row["history_tokens_max"] = max(h)
        row["history_tokens_mean"] = round(sum(h) / len(h), 1)
    return list(rows.values())


def session_metrics(records: Sequence[CorpusRecord], per_session: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Corpus-wide session metrics: sessions, turns per session, history and prompt tokens."""
    turns = [int(s["turns"]) for s in per_session]
    hist = [int(s["history_tokens_max"]) for s in per_session]
    thinks = [r.session.think_time_s for r in records if r.session is not None and r.session.turn > 1]
    prompt = [r.prompt_tokens for r in records if r.prompt_tokens is not None]
    by_source = Counter(
        ("log" if r.session.think_source in ("log", "trace", "trace-prefix") else "distribution")
        for r in records
        if r.session is not None and r.session.turn > 1
    )

    def pct(xs: Sequence[float], q: float) -> float | None:
        return round(float(percentile(list(xs), q)), 3) if xs else None

    return {
        "sessions": len(per_session),
        "records": len(records),
        "turns_mean": round(sum(turns) / len(turns), 2) if turns else None,
        "turns_p50": pct(turns, 50),
        "turns_max": max(turns, default=None),
        "history_tokens_max_p50": pct(hist, 50),
        "history_tokens_max_p95": pct(hist, 95),
        "history_tokens_max": max(hist, default=None),
        "prompt_tokens_p50": pct(prompt, 50),
        "prompt_tokens_max": max(prompt, default=None),
        "think_time_s_p50": pct(thinks, 50),
        "think_time_s_p95": pct(thinks, 95),
        "think_times_from": dict(by_source),
    }


def session_table(metrics: dict[str, Any]) -> list[tuple[str, str]]:
    """(metric, value) rows for the console."""
    return [(k, str(v)) for k, v in metrics.items()]
