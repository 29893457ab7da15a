"""One corpus record from one chosen candidate: the prompt template, its variables, the record.

A record's sizes come from its trace row (input and output tokens, shared prefix blocks) or from
its scenario's distributions; its prompt is the template rendered with the candidate's variables
and brought to the target input tokens with real material, in this order (:func:`fill_to`):

1. the query's own dialogue so far (CrossWOZ: the turns before it, newest added first);
2. catalogue entries relevant to the query, as retrieved context (:func:`catalog.reference`);
3. further few-shot examples: the pool's (:meth:`FewShotPool.more_for`), then the logs' other
   lines of the request's language, most confident first.

The last item added may be cut at a token boundary so the prompt lands on the target exactly.
Only when the material runs out are filler words added, after the instructions (the prompt's first
paragraph), never in front of them: production prompts open with their shared system part. A
prompt over its target is shortened (fewer shots, less history) and cut so that the query itself
reaches the model intact. :mod:`harness.corpus.build` decides which candidates become records;
this module only assembles each one.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

import numpy as np
import orjson

from harness.common.io import check_input_file
from harness.corpus import catalog
from harness.corpus.inputs import Pick, candidate_rng, sample_distribution
from harness.corpus.logs import Utterance
from harness.corpus.model import CorpusRecord, Fill, Message, Provenance, RequestVariables, Sampling
from harness.corpus.sandbox import PromptRenderer, TemplateError
from harness.corpus.settings import CorpusSettings
from harness.corpus.tokens import SharedBlocks, TargetTokenizer, after_instructions

FIT_ATTEMPTS = 8
"""Whole items :func:`fill_to` may leave out so that the next one, cut, lands on the target exactly."""
MATERIAL_KINDS = ("history", "catalog", "fewshot")
"""The order real material is added in to reach a target length (see the module docstring)."""


@dataclass
class PromptTemplate:
    """A prompt template (one ``.j2``) or a messages spec (``.messages.json`` naming one per role)."""

    kind: str
    name: str
    parts: list[tuple[str, str | None]]
    """(role, template name) for messages; role ``fewshot`` expands to user/assistant pairs."""
    files: list[Path]


def load_template(path: Path, renderer: PromptRenderer) -> PromptTemplate:
    """Read and compile the template (and every template a messages spec names): bad syntax or a
    bad spec is a :class:`TemplateError` before any data is generated."""
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
            if role not in ("system", "user", "assistant", "fewshot", "history"):
                raise TemplateError(
                    "role must be system, user, assistant, fewshot or history",
                    file=path,
                    field=f"messages[{i}].role",
                )
            tmpl = m.get("template")
            if role not in ("fewshot", "history") and not isinstance(tmpl, str):
                raise TemplateError(
                    "a message needs a 'template' name", file=path, field=f"messages[{i}].template"
                )
            parts.append((role, tmpl))
        files = [path] + [renderer.loader.resolve(t) for _, t in parts if t is not None]
        for _, t in parts:
            if t is not None:
                renderer.template(t)  # syntax errors surface before any data is generated
        return PromptTemplate("messages", path.name, parts, files)
    renderer.template(path.name)
    return PromptTemplate("prompt", path.name, [], [renderer.loader.resolve(path.name)])


def template_context(
    v: RequestVariables,
    pick: Pick,
    shots: list[Utterance],
    history: int | None,
    *,
    dialogue: list[tuple[str, str]] | None = None,
    reference: list[str] | None = None,
) -> dict[str, Any]:
    """Template variables. Values are plain data (dicts, lists, strings): nothing is compiled.
    ``dialogue`` (earlier turns, oldest first) and ``reference`` (catalogue entries) are only
    given when a target length asks for more material."""
    lang = v.profile.lang
    session = v.session.model_dump()
    if history is not None:
        session["events"] = session["events"][-history:] if history else []
    return {
        "lang": lang,
        "domain": v.domain,
        "domain_label": catalog.label(v.domain, lang),
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
        "dialogue": [{"role": r, "text": t} for r, t in (dialogue or [])],
        "reference": list(reference or []),
    }


Parts = list[tuple[str, str]]
"""(role, text) of a rendered prompt: one ``("prompt", text)``, or the messages in order."""


@dataclass
class Material:
    """Real material to reach a target length, in the order it is added (:data:`MATERIAL_KINDS`)."""

    items: list[tuple[str, Any]]
    """(kind, payload): ``history`` (role, text) newest first, ``catalog`` a line, ``fewshot`` an
    :class:`Utterance`."""

    def take(
        self, m: int, cut: str | None = None
    ) -> tuple[list[tuple[str, str]], list[str], list[Utterance]]:
        """The first ``m`` items (and item ``m`` cut to the text ``cut``) as dialogue (oldest first),
        reference lines and extra shots."""
        dialogue: list[tuple[str, str]] = []
        reference: list[str] = []
        shots: list[Utterance] = []
        chosen = list(self.items[:m])
        if cut and m < len(self.items):
            kind, payload = self.items[m]
            if kind == "history":
                chosen.append((kind, (payload[0], cut)))
            elif kind == "catalog":
                chosen.append((kind, cut))
            else:
                chosen.append((kind, replace(payload, text=cut, response=None)))
        for kind, payload in chosen:
            if kind == "history":
                dialogue.insert(0, payload)
            elif kind == "catalog":
                reference.append(payload)
            else:
                shots.append(payload)
        return dialogue, reference, shots

    @staticmethod
    def cut(item: tuple[str, Any], n_tokens: int, tok: TargetTokenizer) -> str | None:
        """``item`` cut to ``n_tokens`` at a token boundary: a dialogue turn keeps its end (the part
        nearest the request), other items their start; ``None`` when nothing is left."""
        text = Material.text(item)
        cut = tok.tail(text, n_tokens) if item[0] == "history" else tok.head(text, n_tokens)
        return cut or None

    @staticmethod
    def text(item: tuple[str, Any]) -> str:
        kind, payload = item
        return str(payload[1] if kind == "history" else payload if kind == "catalog" else payload.text)


def _count(tok: TargetTokenizer, parts: Parts) -> int:
    return tok.count_lines([t for _, t in parts]) if parts else 0


def fill_to(
    render: Any, material: Material, budget: int, tok: TargetTokenizer, key: str
) -> tuple[Parts, str, Fill, int, str | None]:
    """``render(m, cut)`` brought to ``budget`` tokens: the most items of ``material`` that fit,
    the next one cut at a token boundary to land exactly, then filler words (after the
    instructions) only for what is still missing. Returns (parts, how, fill, m, cut): the items
    used are the first ``m`` and item ``m`` cut to ``cut``."""
    measured: dict[tuple[int, str | None], int] = {}

    def measure(m: int, cut: str | None = None) -> int:
        got = measured.get((m, cut))
        if got is None:
            got = measured[(m, cut)] = _count(tok, render(m, cut))
        return got

    if measure(0) == budget:
        return render(0, None), "exact", Fill(), 0, None
    m, cut, got = 0, None, measure(0)
    # Each item's own tokens: where to start looking (labels and headers make the real count a
    # little more; every decision below is on measured counts).
    costs = [c + 1 for c in tok.count_each([Material.text(it) for it in material.items])]
    start: int | None = None
    for attempt in range(FIT_ATTEMPTS):
        n_items = len(material.items)
        # The most items that fit: the count only grows with items, so bisect, in a bracket found
        # by galloping from an estimate (each measure renders and counts the whole prompt).
        lo, hi = _bracket(measure, costs, budget, start)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if measure(mid) <= budget:
                lo = mid
            else:
                hi = mid - 1
        m, cut, got = lo, None, measure(lo)
        if got == budget or m >= n_items:
            break
        cut = _longest_cut(measure, material, m, budget, tok)
        got = measure(m, cut)
        if got == budget or m == 0 or attempt == FIT_ATTEMPTS - 1:
            break
        # What is left is less than the next item's own labels (a header, "User:"): leave out the
        # last whole item so that the next one, cut longer, lands on the budget exactly. Counts
        # of the items before it stay valid.
        material.items.pop(m - 1)
        costs.pop(m - 1)
        for key_ in [k for k in measured if k[0] >= m - 1 and not (k[0] == m - 1 and k[1] is None)]:
            del measured[key_]
        start = m - 1
    parts = render(m, cut)
    got = measure(m, cut)

    # Tokens per kind: the measured growth over each kind's run of items (items are grouped by
    # kind, in MATERIAL_KINDS order; the cut item counts for its kind).
    def upto(i: int) -> int:
        return measure(i) if i <= m else measure(m, cut)

    fill = Fill()
    start = 0
    for kind in MATERIAL_KINDS:
        end = start + sum(1 for kd, _ in material.items if kd == kind)
        setattr(fill, kind, max(0, upto(end) - upto(start)))
        start = end
    how = "filled"
    if got < budget:
        # Real material ran out (or the template shows none of it): filler after the instructions.
        role, first = parts[0]
        n_fill = budget - got
        trial = parts
        for _ in range(4):
            pad = tok.words(f"fill:{key}", n_fill)
            trial = [(role, after_instructions(first, pad)), *parts[1:]]
            n = _count(tok, trial)
            if n == budget or n_fill + budget - n <= 0:
                break
            n_fill += budget - n  # the seams merged or split a token: correct and retry
        fill.filler = tok.count(pad)
        parts, got = trial, n
        how = "padded"
    return parts, how, fill, m, cut


def _bracket(measure: Any, costs: list[int], budget: int, start: int | None) -> tuple[int, int]:
    """``(lo, hi)`` with ``measure(lo) <= budget`` and the last fitting item count in ``[lo, hi]``,
    galloping from ``start`` (known to fit) or from the items' estimated costs."""
    n_items = len(costs)
    if start is None:
        est = (
            int(np.searchsorted(np.cumsum(costs or [0]), budget - measure(0), side="right")) if n_items else 0
        )
    else:
        est = start
    est = min(est, n_items)
    step = 1
    if measure(est) <= budget:
        lo = est
        while lo + step <= n_items and measure(lo + step) <= budget:
            lo += step
            step *= 2
        return lo, (min(n_items, lo + step - 1) if lo + step <= n_items else n_items)
    hi = est - 1
    while hi - step >= 0 and measure(hi - step + 1) > budget:
        hi -= step
        step *= 2
    lo = max(0, hi - step + 1)
    while lo > 0 and measure(lo) > budget:  # guard: keep measure(lo) <= budget
        lo = max(0, lo - step)
    return lo, hi


def _longest_cut(measure: Any, material: Material, m: int, budget: int, tok: TargetTokenizer) -> str | None:
    """The longest cut of item ``m`` with which the prompt still fits ``budget`` (``None``: none
    does). Guessed from the cut of one token (the item's labels are paid once), then checked."""
    whole = material.items[m]
    n_tok = tok.count(Material.text(whole))

    def fits(t: int) -> bool:
        return t == 0 or measure(m, material.cut(whole, t, tok)) <= budget

    if n_tok == 0 or not fits(1):
        return None
    guess = max(1, min(n_tok, 1 + budget - measure(m, material.cut(whole, 1, tok))))
    if fits(guess):
        left, right = guess, n_tok
        if guess == n_tok or not fits(guess + 1):
            right = guess
    else:
        left, right = 1, guess - 1
    while left < right:
        t = (left + right + 1) // 2
        if fits(t):
            left = t
        else:
            right = t - 1
    return material.cut(whole, left, tok)


def assemble_record(
    *,
    k: int,
    ci: int,
    v: RequestVariables,
    pick: Pick,
    shots: list[Utterance],
    ev: Any,
    tmpl: PromptTemplate,
    renderer: PromptRenderer,
    tok: TargetTokenizer,
    template_sha: str,
    id_counts: Counter[int],
    settings: CorpusSettings,
    rng: np.random.Generator,
    blocks: SharedBlocks | None = None,
    more_shots: list[Utterance] | None = None,
) -> CorpusRecord:
    """Record ``k`` of the corpus from candidate ``ci`` (its variables ``v``, ``pick`` and ``shots``), sized
    from its trace row ``ev`` or, without one, from its scenario's distributions. ``blocks`` gives
    the shared trace prefix text; ``more_shots`` the pool lines a prompt may add to reach its length."""
    sc = pick.scenario
    target: int | None = None
    prefix_ids: tuple[int, ...] = ()
    bs = settings.block_size
    cap = settings.max_input_tokens
    if ev is not None:
        bs = int(ev.block_size or settings.block_size)
        traced = int(ev.input_tokens)
        if settings.block_tokens is not None and settings.block_tokens != bs:
            # Scaled as a whole: the blocks and the rest of the prompt keep their proportions.
            traced = max(1, round(traced * settings.block_tokens / bs))
            bs = settings.block_tokens
        target = traced if cap is None else min(traced, cap)
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
    shared = blocks if blocks is not None else SharedBlocks(tok, seed=settings.seed)
    prefix = shared.prefix(prefix_ids, bs) if prefix_ids else ""
    prefix_tokens = len(prefix_ids) * bs

    def render(
        history: int | None,
        own: list[Utterance],
        dialogue: list[tuple[str, str]] | None = None,
        reference: list[str] | None = None,
        extra: list[Utterance] | None = None,
    ) -> Parts:
        ctx = template_context(
            v,
            pick,
            own + (extra or []),
            history,
            dialogue=dialogue,
            reference=reference,
        )
        if tmpl.kind == "prompt":
            return [("prompt", renderer.render(tmpl.name, ctx))]
        msgs: Parts = []
        for role, name in tmpl.parts:
            if role == "fewshot":
                for s in ctx["fewshots"]:
                    msgs.append(("user", s["text"]))
                    if s["response"]:
                        msgs.append(("assistant", s["response"]))
            elif role == "history":
                msgs.extend((t["role"], t["text"]) for t in ctx["dialogue"])
            else:
                assert name is not None
                msgs.append((role, renderer.render(name, ctx)))
        return msgs

    parts = render(None, shots)
    fitted = "none"
    fill: Fill | None = None
    key = f"{settings.seed}:{ci}"
    if target is not None:
        budget = target - prefix_tokens
        full = _count(tok, parts)
        short = full > budget
        if short:  # shorten before cutting: fewer shots, less history
            parts = render(2, [])
        if _count(tok, parts) < budget:
            best: tuple[Parts, str, Fill, list[Utterance]] | None = None
            # With the prompt's own shots; when filler was still needed (what was left was less
            # than one more item's labels), once more with one shot fewer, which then comes back
            # as material and can be cut to land exactly.
            for own in ([] if short else shots, shots[:-1]) if shots and not short else ([],):
                got = _fill_record(
                    render, v, pick, own=own, shots=shots, more_shots=more_shots or [],
                    history=2 if short else None, budget=budget, tok=tok, seed=settings.seed, ci=ci, key=key,
                )  # fmt: skip
                if best is None or got[2].filler < best[2].filler:
                    best = got
                if best[2].filler == 0:
                    break
            assert best is not None
            parts, fitted, fill_used, shown = best
            fill = fill_used if any(fill_used.model_dump().values()) else None
            # The record names every shot its prompt shows: its own (unless shortened away) and added ones.
            v = v.model_copy(update={"fewshot_ids": [s.id for s in shown]})
        else:
            if short:
                v = v.model_copy(update={"fewshot_ids": []})
            fixed = _count(tok, parts[:-1])
            body, _, fitted, filler = tok.fit_counted(parts[-1][1], max(0, budget - fixed), key=key)
            if v.query not in body and v.query in parts[-1][1]:
                # Cut from the front instead: the request itself must reach the target intact.
                body, _, fitted, filler = tok.fit_keep_end_counted(
                    parts[-1][1], max(0, budget - fixed), key=key
                )
            fill = Fill(filler=filler) if filler else None
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
        fill=fill,
        query_source=pick.query.source,
        query_id=pick.query.id,
        query_at=pick.query.where,
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
        prefix_block_ids=list(prefix_ids),
        target_input_tokens=target,
        lang=v.profile.lang,
        domain=v.domain,
        intent=v.intent,
        variables=v,
        provenance=prov,
    )


def _fill_record(
    render: Any,
    v: RequestVariables,
    pick: Pick,
    *,
    own: list[Utterance],
    shots: list[Utterance],
    more_shots: list[Utterance],
    history: int | None,
    budget: int,
    tok: TargetTokenizer,
    seed: int,
    ci: int,
    key: str,
) -> tuple[Parts, str, Fill, list[Utterance]]:
    """The prompt rendered with its ``own`` shots and brought to ``budget`` with material
    (:func:`fill_to`); also returns every shot it shows."""
    returned = [s for s in shots if s not in own]
    material = _material(v, pick, returned=returned, more_shots=more_shots, seed=seed, ci=ci)

    def render_material(m: int, cut: str | None) -> Parts:
        dialogue, reference, extra = material.take(m, cut)
        return cast("Parts", render(history, own, dialogue, reference, extra))

    parts, how, fill, used, cut = fill_to(render_material, material, budget, tok, key)
    return parts, how, fill, own + material.take(used, cut)[2]


def _material(
    v: RequestVariables,
    pick: Pick,
    *,
    returned: list[Utterance],
    more_shots: list[Utterance],
    seed: int,
    ci: int,
) -> Material:
    """The real material a record may add, in :data:`MATERIAL_KINDS` order; ``returned``: the
    record's own shots its base prompt left out, which come back first among the few-shots."""
    items: list[tuple[str, Any]] = [("history", turn) for turn in reversed(pick.query.history)]
    ref_rng = candidate_rng(seed, ci, "reference")  # its own stream: the record's draws stay as they were
    lines = catalog.reference(v.profile.lang, v.domain, v.constraints, ref_rng)
    items += [("catalog", line) for line in lines]
    extra = returned + [s for s in more_shots if s not in returned]
    items += [("fewshot", s) for s in extra if s.text != v.query]
    return Material(items)
