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
the log's user messages and what the target actually answered, as messages (chat) or as the one
transcript format (:func:`harness.corpus.sessions.transcript`, completions). ``--history log``
sends the bodies as built (the log's answers).

``--salt-per-pass``: pass ``p ≥ 1`` over the corpus (arrival ``seq // units``) puts ``[pass p] ``
at the very start of the first message or the prompt, so no pass reuses another's prefixes. Only a
run with it pays for rebuilding bodies; the default path sends the prepared bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from harness.common.errors import InputError
from harness.corpus.model import CorpusRecord
from harness.corpus.sessions import transcript


@dataclass(frozen=True, slots=True)
class SessionPlan:
    """One conversation of the corpus: its id and its turns' record indices, in turn order."""

    id: str
    turns: tuple[int, ...]


def plan_sessions(
    records: Sequence[CorpusRecord], *, file: str | Path | None = None
) -> list[SessionPlan] | None:
    """The corpus's sessions in order of first appearance; ``None`` when no record is a session turn.

    A corpus mixing session turns and single requests, or a session whose turns are not 1 … n, is
    an :class:`InputError` naming the record."""
    if not any(r.session is not None for r in records):
        return None
    turns: dict[str, dict[int, int]] = {}
    for i, r in enumerate(records):
        if r.session is None:
            raise InputError(
                f"record {r.id!r} is not a session turn, in a corpus of sessions",
                file=file,
                line=i + 1,
                field="session",
            )
        seen = turns.setdefault(r.session.session_id, {})
        if r.session.turn in seen:
            raise InputError(
                f"session {r.session.session_id!r} has turn {r.session.turn} twice",
                file=file,
                line=i + 1,
                field="session.turn",
            )
        seen[r.session.turn] = i
    out: list[SessionPlan] = []
    for sid, by_turn in turns.items():
        order = sorted(by_turn)
        if order != list(range(1, len(order) + 1)):
            raise InputError(
                f"session {sid!r} has turns {order}; expected 1 … {len(order)}",
                file=file,
                field="session.turn",
            )
        out.append(SessionPlan(sid, tuple(by_turn[t] for t in order)))
    return out


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


def turn_body(
    rec: CorpusRecord, body: bytes, history: Sequence[tuple[str, str]] | None, pass_index: int = 0
) -> bytes:
    """Turn ``rec``'s body with ``history`` (user message, answer) pairs in place of the record's own
    history (``None``: the record's, as built), salted for ``pass_index``."""
    if history is None:
        return salted_body(body, pass_index)
    st = rec.session
    assert st is not None
    obj = orjson.loads(body)
    a, b = st.history_at
    if "messages" in obj:
        msgs = obj["messages"]
        live: list[dict[str, str]] = []
        for user, answer in history:
            live += [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
        obj["messages"] = [*msgs[:a], *live, *msgs[b:]]
    else:
        prompt = obj["prompt"]
        obj["prompt"] = prompt[:a] + transcript(history, rec.lang) + prompt[b:]
    _salted(obj, salt(pass_index))
    return orjson.dumps(obj)
