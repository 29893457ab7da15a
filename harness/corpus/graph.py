"""Agent sessions from traces' call graphs: one corpus record per LLM call (``harness corpus graph``).

``harness traces graph`` writes one :class:`~harness.traces.graph.SessionGraph` per trace: its LLM
calls in start order, which waits for which, the gaps between them and what each sent.
:func:`graph_records` turns each call into a :class:`~harness.corpus.model.CorpusRecord` whose
:attr:`~harness.corpus.model.CorpusRecord.call` keeps its place in the graph, so the load stage can
replay the session as the agent ran it. The body is the call's recorded request (OpenAI chat
messages, its tools); a call whose content was not recorded borrows the messages of the ``fill``
corpus's record nearest its recorded input length. Each session arrives at its trace's own start,
relative to the earliest trace (``arrival_offset_s`` on its first call).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Literal

import orjson
from pydantic import ValidationError

from harness.common.errors import InputError
from harness.common.io import validation_error
from harness.corpus.model import (
    CorpusRecord,
    Message,
    Provenance,
    Sampling,
    SessionCall,
    ToolCall,
    ToolFunction,
)
from harness.traces.graph import ChatMessage, GraphCall, SessionGraph

GENERATOR = "harness.corpus.graph"
TEMPLATE = "trace-graph"
DEFAULT_MAX_TOKENS = 256
"""``max_tokens`` of a call that recorded neither a requested limit nor its output tokens."""
Role = Literal["system", "user", "assistant", "tool"]
ROLES: dict[str, Role] = {
    "system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool",
}  # fmt: skip
"""Recorded roles and the chat role each is sent as (``developer`` is OpenAI's newer ``system``)."""
_CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]")


def graph_records(
    graphs: Iterable[SessionGraph],
    *,
    fill: Sequence[CorpusRecord] | None = None,
    file: Path | Mapping[str, Path] | None = None,
) -> list[CorpusRecord]:
    """One record per call of ``graphs``, session by session, calls in the graph's (start) order.

    ``fill``: records whose messages (or prompt) stand in for calls without recorded content, the
    one nearest in ``prompt_tokens`` to the call's input tokens. ``file``: the graph file errors name,
    one for all graphs or one per session id. A session's ``provenance.template_sha256`` is the
    SHA-256 of the graph's line as ``harness traces graph`` writes it (orjson, ``None`` fields left
    out): for a graph read from such a file, the hash of its line. Raises :class:`InputError` for no
    graphs, a session given twice, a role chat has no place for, a tool call or link the corpus
    cannot hold, or a call without content and no ``fill``.
    """
    sessions = [g for g in graphs if g.calls]

    def where(session: str) -> Path | None:
        return file.get(session) if isinstance(file, Mapping) else file

    if not sessions:
        raise InputError(
            "no session graph with LLM calls", file=file if isinstance(file, Path) else None,
            hint="write one with: harness traces graph TRACE -o graph.jsonl",
        )  # fmt: skip
    seen: set[str] = set()
    for g in sessions:
        if g.session in seen:
            raise InputError(
                f"session {g.session} is given twice", file=where(g.session),
                hint="each trace's graph once: the same graph file, or the same traces, named twice?",
            )  # fmt: skip
        seen.add(g.session)
    # The short id reads well in records and logs; two traces that share it keep their whole ids.
    prefixes = Counter(sid[:16] for sid in seen)
    first = min(g.start_us for g in sessions)
    filler = _Filler(fill or [])
    records: list[CorpusRecord] = []
    for g in sessions:
        short = g.session[:16] if prefixes[g.session[:16]] == 1 else g.session
        sha = hashlib.sha256(orjson.dumps(g.model_dump(mode="json", exclude_none=True))).hexdigest()
        index = {c.id: k for k, c in enumerate(g.calls, start=1)}
        for k, c in enumerate(g.calls, start=1):
            at = f"session {g.session} call {k} ({c.name})"
            query_id = None
            if c.content and c.request.messages:
                messages = _messages(c.request.messages, at, where(g.session))
                prompt_tokens, target = c.input_tokens, None
            elif fill:
                borrowed = filler.nearest(c.input_tokens)
                messages = list(borrowed.messages or [Message(role="user", content=borrowed.text())])
                # The body is the fill record's: its length is what is sent, the trace's the target.
                prompt_tokens, target, query_id = borrowed.prompt_tokens, c.input_tokens, borrowed.id
            else:
                raise InputError(
                    f"{at}: the trace recorded no request content for it", file=where(g.session),
                    hint="give a corpus whose records stand in for such calls: --fill CORPUS",
                )  # fmt: skip
            try:
                call = SessionCall(
                    session_id=g.session, call=k, calls=len(g.calls), depth=c.depth, log_output=c.output,
                    after=[index[p] for p in c.depends_on], uses=[index[p] for p in c.uses_output],
                    gap_s=c.gap_ms / 1000.0, name=c.name, agent=c.agent, recorded_ms=c.duration_ms,
                    cold=g.cold,
                )  # fmt: skip
            except KeyError as exc:
                raise InputError(
                    f"{at}: waits for {exc.args[0]!r}, which is no call of the session", file=where(g.session)
                ) from None
            except ValidationError as exc:
                raise validation_error(exc, InputError, file=where(g.session), what=at) from None
            text = "\n".join(m.text() for m in messages)
            provenance = Provenance(
                generator=GENERATOR, seed=0, candidate=len(records), template=TEMPLATE, template_sha256=sha,
                source=g.source or None, source_trace_id=g.session, fitted="none", query_id=query_id,
            )  # fmt: skip
            records.append(
                CorpusRecord(
                    id=f"{short}-{k}", scenario=c.agent or "agent", messages=messages, tools=c.request.tools,
                    sampling=_sampling(c), expected_output_tokens=c.output_tokens or 0,
                    max_tokens=max(1, c.request.max_tokens or c.output_tokens or DEFAULT_MAX_TOKENS),
                    prompt_tokens=prompt_tokens, target_input_tokens=target, lang=_lang(text),
                    domain="agent", intent=c.name or "chat", call=call, provenance=provenance,
                    arrival_offset_s=(g.start_us - first) / 1e6 if k == 1 else None,
                )
            )  # fmt: skip
    return records


def _messages(recorded: Sequence[ChatMessage], at: str, file: Path | None) -> list[Message]:
    """The recorded messages as the corpus's chat messages (:data:`ROLES`)."""
    out: list[Message] = []
    calls: list[ToolCall] = []  # the calls of the last assistant message, answered in order
    answered = 0
    for i, m in enumerate(recorded):
        role = ROLES.get(m.role)
        if role is None:
            raise InputError(
                f"{at}: message {i} has role {m.role!r}; chat has system (developer), user, "
                "assistant and tool", file=file, field=f"request.messages.{i}.role",
            )  # fmt: skip
        try:
            if role == "tool":
                # An untagged result answers the call at its position after the assistant message;
                # one that answers none is sent as the user's words, since OpenAI-compatible
                # servers refuse a tool message that answers no call.
                own = m.tool_call_id or (calls[answered].id if answered < len(calls) else None)
                answered += 1
                message = (
                    Message(role="tool", content=m.content or "", tool_call_id=own)
                    if own
                    else Message(role="user", content=m.content or "")
                )
            else:
                tool_calls = [_tool_call(c, f"call_{i}_{j}") for j, c in enumerate(m.tool_calls or [])]
                message = Message(role=role, content=m.content or "", tool_calls=tool_calls or None)
                if role == "assistant":
                    calls, answered = tool_calls, 0
        except ValidationError as exc:
            raise validation_error(
                exc, InputError, file=file, field=f"request.messages.{i}", what=at
            ) from None
        out.append(message)
    return out


def _tool_call(raw: Mapping[str, object], fallback_id: str) -> ToolCall:
    """A recorded tool call (OpenAI shape); a call without an id gets one, so its result can name it."""
    fn = raw.get("function")
    fn = fn if isinstance(fn, Mapping) else raw
    arguments = fn.get("arguments", "{}")
    return ToolCall(
        id=str(raw.get("id") or fallback_id),
        function=ToolFunction(
            name=str(fn.get("name", "")),
            arguments=arguments if isinstance(arguments, str) else orjson.dumps(arguments).decode(),
        ),
    )


def _sampling(call: GraphCall) -> Sampling:
    t = call.request.temperature
    if t is None or not math.isfinite(t):
        return Sampling()
    return Sampling(temperature=min(2.0, max(0.0, t)))


def _lang(text: str) -> str:
    """``zh`` when most letters are CJK ideographs, else ``en``."""
    letters = [ch for ch in text if ch.isalpha()]
    return "zh" if 2 * sum(1 for ch in letters if _CJK.match(ch)) > len(letters) else "en"


class _Filler:
    """Picks fill records by length: the one whose ``prompt_tokens`` is nearest the target; equally
    near ones in turn, so calls of the same length do not all send the same text."""

    def __init__(self, records: Sequence[CorpusRecord]) -> None:
        self.records = records
        self.turns: Counter[tuple[int, ...]] = Counter()

    def nearest(self, tokens: int | None) -> CorpusRecord:
        def distance(r: CorpusRecord) -> float:
            if tokens is None:  # no recorded length: every record is as near
                return 0.0
            return math.inf if r.prompt_tokens is None else abs(r.prompt_tokens - tokens)

        scores = [distance(r) for r in self.records]
        best = min(scores)
        tied = tuple(i for i, s in enumerate(scores) if s == best)
        pick = tied[self.turns[tied] % len(tied)]
        self.turns[tied] += 1
        return self.records[pick]
