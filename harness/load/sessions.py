"""Sessions in the load stage: a conversation is one user, its turns closed-loop, its starts open-loop.

A session corpus (``harness corpus build --sessions``) holds one record per turn. The run's arrivals
are session *starts* (``--rate R`` starts R sessions a second; a schedule or the corpus's offsets
give each start), released by the pacer like any arrival; the user that takes one plays the whole
conversation (:meth:`harness.load.user.ReplayUser.play_session`): turn ``k+1`` goes out when turn
``k``'s stream has ended plus the turn's think time, so a slow answer delays the rest of its
conversation, as it would a person's. Every turn carries ``X-Session-ID``; a session's turns stay on
one worker (a start is one arrival: the arrival share is the session share).

Live history (``--history live``, the default): turn ``k+1``'s body is the corpus record's with its
history (:attr:`~harness.corpus.model.SessionTurn.history_at`) replaced by the turns as they went:
the log's user messages and what the target actually answered, as messages (chat, tool calls
included) or as the one transcript format (:func:`harness.corpus.sessions.transcript`,
completions). An agent's conversation goes on whatever the target called: the tool results a turn
sends answer the target's own calls (:class:`LiveHistory`). ``--history log`` sends the bodies as
built (the log's answers).

Agent sessions (a corpus from ``harness corpus graph``: records with ``call``) are played as their
trace's call graph (:meth:`harness.load.user.ReplayUser.play_graph`): a call goes out its gap after
the last call it waits for has ended, calls ready at once go out at once, and where a call's body
holds an earlier call's recorded answer the target's live answer takes its place (:func:`live_outputs`;
``--history log`` sends the recorded bodies). A failed call's dependants are not sent; their records
fail, naming it.

``--salt-per-pass``: pass ``p ≥ 1`` over the corpus (arrival ``seq // units``) puts ``[pass p] ``
at the very start of the first message or the prompt, so no pass reuses another's prefixes. Only a
run with it pays for rebuilding bodies; the default path sends the prepared bytes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from harness.common.errors import InputError
from harness.corpus.model import CorpusRecord
from harness.corpus.sessions import transcript


@dataclass(frozen=True, slots=True)
class SessionPlan:
    """One session of the corpus: its id and its turns' (or calls') record indices, in order."""

    id: str
    turns: tuple[int, ...]
    graph: bool = False
    """An agent session replayed as its call graph (records with ``call``), not a conversation."""
    width: int = 1
    """The most calls of the session that become ready together (the same ``after``): the connections
    a user playing it keeps open at once."""


def plan_sessions(
    records: Sequence[CorpusRecord], *, file: str | Path | None = None
) -> list[SessionPlan] | None:
    """The corpus's sessions in order of first appearance; ``None`` when no record is a session turn
    or a graph's call.

    Conversations (``session``) have turns ``1 … n``, agent sessions (``call``) calls ``1 … n``. A
    corpus mixing them with each other or with single requests, or a session whose turns or calls
    are not ``1 … n``, is an :class:`InputError` naming the record."""
    graph = any(r.call is not None for r in records)
    if not graph and not any(r.session is not None for r in records):
        return None
    kind, key = ("call", "call") if graph else ("session turn", "session.turn")
    steps: dict[str, dict[int, int]] = {}
    for i, r in enumerate(records):
        at: tuple[str, int] | None = None
        if graph and r.call is not None:
            at = (r.call.session_id, r.call.call)
        elif not graph and r.session is not None:
            at = (r.session.session_id, r.session.turn)
        if at is None:
            raise InputError(
                f"record {r.id!r} is not a {kind}, in a corpus of {kind}s",
                file=file,
                line=i + 1,
                field="call" if graph else "session",
            )
        seen = steps.setdefault(at[0], {})
        if at[1] in seen:
            raise InputError(f"session {at[0]!r} has {kind} {at[1]} twice", file=file, line=i + 1, field=key)
        seen[at[1]] = i
    out: list[SessionPlan] = []
    for sid, by_step in steps.items():
        order = sorted(by_step)
        if order != list(range(1, len(order) + 1)):
            raise InputError(
                f"session {sid!r} has {kind}s {order}; expected 1 … {len(order)}", file=file, field=key
            )
        indices = tuple(by_step[t] for t in order)
        width = 1
        if graph:
            together = Counter(tuple(c.after) for i in indices if (c := records[i].call) is not None)
            width = max(together.values())
        out.append(SessionPlan(sid, indices, graph=graph, width=width))
    return out


def live_outputs(body: bytes, swaps: Sequence[tuple[str, str]]) -> tuple[bytes, int]:
    """``body`` with each recorded answer of ``swaps`` (recorded, live) replaced by the live one in its
    message contents (or prompt): an agent session's call as the target's answers made it; and how
    many replacements were made (a recorded answer the body does not hold is left alone)."""
    obj = orjson.loads(body)
    made = 0
    for recorded, live in swaps:
        if not recorded or recorded == live:
            continue
        if "messages" in obj:
            for m in obj["messages"]:
                content = m.get("content")
                if isinstance(content, str) and recorded in content:
                    made += content.count(recorded)
                    m["content"] = content.replace(recorded, live)
        elif recorded in obj.get("prompt", ""):
            made += obj["prompt"].count(recorded)
            obj["prompt"] = obj["prompt"].replace(recorded, live)
    return (orjson.dumps(obj) if made else body), made


def salt(pass_index: int) -> str:
    """The text that starts pass ``pass_index``'s prompts ("" for the first pass: the corpus as built)."""
    return f"[pass {pass_index}] " if pass_index > 0 else ""


def _salted(body: dict[str, Any], text: str) -> None:
    if not text:
        return
    if "messages" in body:
        first = dict(body["messages"][0])
        first["content"] = text + first["content"]
        body["messages"] = [first, *body["messages"][1:]]
    else:
        body["prompt"] = text + body["prompt"]


def salted_body(body: bytes, pass_index: int) -> bytes:
    """A prepared body with pass ``pass_index``'s salt at its very start (the same bytes for pass 0)."""
    if pass_index <= 0:
        return body
    obj = orjson.loads(body)
    _salted(obj, salt(pass_index))
    return orjson.dumps(obj)


SYNTHETIC_TOOL_RESULT = (
    '{"synthetic": true, "note": "the recorded conversation has no result for this call; the load '
    'harness sent this one so the conversation can go on"}'
)
"""The result a live replay sends for a tool call the target made that the log did not (another
function, or other arguments): stated as synthetic in its text, and counted in the turn's record
(``tool_results.synthetic``)."""


def _same_call(log: dict[str, Any], live: dict[str, Any]) -> bool:
    """The same function with the same arguments (compared as JSON values where they parse)."""
    a, b = log.get("function") or {}, live.get("function") or {}
    if a.get("name") != b.get("name"):
        return False
    try:
        return bool(orjson.loads(a.get("arguments") or "{}") == orjson.loads(b.get("arguments") or "{}"))
    except orjson.JSONDecodeError:
        return bool(a.get("arguments") == b.get("arguments"))


@dataclass(slots=True)
class TurnBody:
    """One turn's request as a live replay sends it."""

    body: bytes
    opener: list[dict[str, Any]] | None = None
    """The messages that opened the turn as sent (chat): the live history's next entries."""
    tool_results: dict[str, int] | None = None
    """What the turn's tool results were (:attr:`~harness.load.results.RequestRecord.tool_results`)."""


@dataclass(slots=True)
class LiveHistory:
    """A conversation as it went: what each turn sent to open it and what the target answered.

    Chat bodies get it as messages (``--history live``: the log's openers, the target's answers with
    their tool calls); completions bodies as the one transcript of (user message, answer text) pairs.
    Tool results follow the target, not the log: each call the target made gets the log's result for
    the same call (same function and arguments, each used once), or :data:`SYNTHETIC_TOOL_RESULT`;
    a turn whose log opens with tool results after an answer that called no tool puts the log's
    calls in that answer (beside what the target said), so the recorded results answer something and
    the agent loop goes on."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    pairs: list[tuple[str, str]] = field(default_factory=list)

    def body_for(
        self,
        rec: CorpusRecord,
        body: bytes,
        *,
        live: bool,
        pass_index: int = 0,
        log_calls: Sequence[dict[str, Any]] | None = None,
    ) -> TurnBody:
        """Turn ``rec``'s request: its prepared ``body`` with this history in place of the record's
        own (``live``; else the body as built), salted for ``pass_index``. ``log_calls``: the tool
        calls of the log's answer to the previous turn (what this turn's recorded results answer)."""
        st = rec.session
        assert st is not None
        obj = orjson.loads(body)
        a, b = st.history_at
        if "messages" not in obj:
            if live and self.pairs:
                prompt = obj["prompt"]
                obj["prompt"] = prompt[:a] + transcript(self.pairs, rec.lang) + prompt[b:]
                _salted(obj, salt(pass_index))
                return TurnBody(orjson.dumps(obj))
            return TurnBody(salted_body(body, pass_index))
        msgs = obj["messages"]
        n = len(st.inputs) if st.inputs else 1
        opener: list[dict[str, Any]] = list(msgs[b : b + n])
        results: dict[str, int] | None = None
        if live:
            opener, results = self._answer_calls(opener, log_calls)
            obj["messages"] = [*msgs[:a], *self.messages, *opener, *msgs[b + n :]]
        elif not pass_index:
            return TurnBody(body, opener)
        _salted(obj, salt(pass_index))
        return TurnBody(orjson.dumps(obj), opener, results)

    def _answer_calls(
        self, opener: list[dict[str, Any]], log_calls: Sequence[dict[str, Any]] | None
    ) -> tuple[list[dict[str, Any]], dict[str, int] | None]:
        recorded = [m for m in opener if m.get("role") == "tool"]
        rest = [m for m in opener if m.get("role") != "tool"]
        last = self.messages[-1] if self.messages else None
        live_calls = (
            (last.get("tool_calls") or []) if last is not None and last.get("role") == "assistant" else []
        )
        if not live_calls:
            if not recorded:
                return opener, None
            if last is not None and log_calls:
                # The target answered without the log's call: its answer gets the log's calls, so
                # that the recorded results that open this turn answer them.
                last["tool_calls"] = list(log_calls)
                last["content"] = last.get("content") or None
            return opener, {"log_call": len(recorded)}
        by_id = {m.get("tool_call_id"): m for m in recorded}
        unused = [(c, by_id[c.get("id")]) for c in log_calls or () if c.get("id") in by_id]
        counts: Counter[str] = Counter()
        answers: list[dict[str, Any]] = []
        for call in live_calls:
            hit = next((pair for pair in unused if _same_call(pair[0], call)), None)
            if hit is not None:
                unused.remove(hit)
                answers.append({**hit[1], "tool_call_id": call.get("id")})
                counts["recorded"] += 1
            else:
                answers.append(
                    {"role": "tool", "tool_call_id": call.get("id"), "content": SYNTHETIC_TOOL_RESULT}
                )
                counts["synthetic"] += 1
        return [*answers, *rest], dict(sorted(counts.items()))

    def answered(self, turn: TurnBody, user: str, answer: dict[str, Any] | None) -> None:
        """Add a turn as it went: what opened it and the target's answer (``None``: nothing arrived)."""
        msg = answer if answer is not None else {"role": "assistant", "content": ""}
        self.pairs.append((user, msg.get("content") or ""))
        if turn.opener is not None:
            self.messages += [*turn.opener, msg]
