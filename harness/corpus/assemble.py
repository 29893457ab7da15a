"""One corpus record from one chosen candidate: the prompt template, its variables, the record.

A record's sizes come from its trace row (input and output tokens, shared prefix blocks) or from
its scenario's distributions; its prompt is the template rendered with the candidate's variables,
shortened (fewer shots, less history) and then fitted to the target input tokens so that the query
itself always reaches the model intact. :mod:`harness.corpus.build` decides which candidates become
records; this module only assembles each one.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from harness.common.io import check_input_file
from harness.corpus import catalog
from harness.corpus.inputs import Pick, sample_distribution
from harness.corpus.logs import Utterance
from harness.corpus.model import CorpusRecord, Message, Provenance, RequestVariables, Sampling
from harness.corpus.sandbox import PromptRenderer, TemplateError
from harness.corpus.settings import CorpusSettings
from harness.corpus.tokens import TargetTokenizer


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
    v: RequestVariables, pick: Pick, shots: list[Utterance], history: int | None
) -> dict[str, Any]:
    """Template variables. Values are plain data (dicts, lists, strings): nothing is compiled."""
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
    }


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
) -> CorpusRecord:
    """Record ``k`` of the corpus from candidate ``ci`` (its variables ``v``, ``pick`` and ``shots``), sized
    from its trace row ``ev`` or, without one, from its scenario's distributions."""
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
        ctx = template_context(v, pick, shots if use_shots else [], history)
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
        if v.query not in body and v.query in parts[-1][1]:
            # Cut from the front instead: the request itself must reach the target intact.
            body, _, fitted = tok.fit_keep_end(
                parts[-1][1], max(0, budget - fixed), key=f"{settings.seed}:{ci}"
            )
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
        target_input_tokens=target,
        lang=v.profile.lang,
        domain=v.domain,
        intent=v.intent,
        variables=v,
        provenance=prov,
    )
