"""Agent sessions as units: what each replayed call graph took end to end, and the run's totals.

An agent session replayed as its call graph (:meth:`harness.load.user.ReplayUser.play_graph`) writes
one :class:`~harness.load.results.RequestRecord` per call, each with ``call`` set. A user waits for the
whole graph, so a session is judged as one: :func:`session_outcomes` groups those records by
``session_id`` into a :class:`SessionOutcome` (its makespan, failed and blocked calls, tokens), and
:func:`agent_sessions` sums them up for ``summary.json`` (:class:`AgentSessions`). The gates'
``session_makespan_p95`` and ``session_success_rate`` rank and count the same outcomes
(:class:`harness.gates.runs.RunFrame`), so the summary and a gate agree on every session.

A session's makespan runs from its start (the least ``ready_s`` of its calls: a root call's is the
session's arrival) to the last end among its calls (``sent_s + e2e_ms``; ``sent_s`` for a call
without an end: a blocked one, one that got no answer), so a failed branch still counts for as long
as it ran. Every percentile is the project's one definition (:mod:`harness.common.stats`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from pydantic import Field

from harness.common.model import StrictModel
from harness.common.stats import Distribution
from harness.load.results import RequestRecord

FAILED_SESSIONS_SHOWN = 20
"""How many failed sessions :attr:`AgentSessions.failed_sessions` names (the rest are counted)."""


class SessionOutcome(StrictModel):
    """One agent session of a run, from the records of its calls."""

    session_id: str
    calls: int
    """Records of the session (blocked calls included)."""
    failed: int
    """Calls not ok, the blocked ones included."""
    blocked: list[int]
    """Call indices not sent because a call they waited for failed."""
    start_s: float
    """The least ``ready_s`` of its calls (s from the run's epoch)."""
    makespan_ms: float
    """From ``start_s`` to the last end among its calls, in ms."""
    prompt_tokens: int | None = None
    """Sum over the calls that reported them (``None``: none did)."""
    cached_tokens: int | None = None
    critical_path: list[int] = Field(default_factory=list)
    """The calls of the chain that ended last, in order: each became ready when the one before it
    ended (``ready_s``), so together with their gaps they make up the makespan."""
    critical_llm_ms: float | None = None
    """The target's time on that chain: the sum of its calls' E2E (``None``: a call of it has none)."""
    recorded_llm_ms: float | None = None
    """The same calls' durations in the source trace (``None``: not recorded for every one of them):
    ``critical_llm_ms / recorded_llm_ms`` is how the target compares with production, session-wide."""

    @property
    def ok(self) -> bool:
        """Every call succeeded (a session with a failed call did not do its job)."""
        return self.failed == 0


class AgentSessions(StrictModel):
    """The agent sessions of a run (``summary.json``: ``agent_sessions``)."""

    sessions: int
    calls: int
    succeeded: int
    """Sessions whose every call succeeded."""
    success_rate: float | None
    """``succeeded / sessions``."""
    makespan_ms: Distribution
    """Over the sessions' makespans."""
    blocked_calls: int
    """Calls not sent because a call they waited for failed."""
    prefix_hit_rate: float | None
    """Sum of ``cached_tokens`` / sum of ``prompt_tokens`` over the calls that reported both (token
    weighted: a session's later calls resend its earlier context, which the prefix cache should hold)."""
    slowest: SessionOutcome | None
    """The session with the largest makespan (the report draws its waterfall)."""
    failed_sessions: list[str]
    """Ids of sessions with a failed call, in order of start, the first :data:`FAILED_SESSIONS_SHOWN`."""
    critical_vs_recorded: Distribution | None = None
    """Over the sessions: the target's time on the critical chain over the trace's time for the same
    calls (1.3: the target took 30 % longer than production did); ``None``: no trace durations."""


def _outcome(session_id: str, calls: list[RequestRecord]) -> SessionOutcome:
    # A record without ready_s (a converter's) started no later than it was meant to be sent.
    starts = [r.ready_s if r.ready_s is not None else r.intended_s for r in calls]
    ends = [r.sent_s + (r.e2e_ms / 1000.0 if r.e2e_ms is not None else 0.0) for r in calls]
    # A NaN time in the file makes the makespan NaN (min/max would keep or drop it by position): the
    # summary leaves it out of the distribution, the gates refuse to judge on it.
    broken = any(math.isnan(t) for t in (*starts, *ends))
    start = min((t for t in starts if not math.isnan(t)), default=math.nan)
    prompt = [r.prompt_tokens for r in calls if r.prompt_tokens is not None]
    cached = [r.cached_tokens for r in calls if r.cached_tokens is not None]
    chain = [] if broken else _critical_chain(calls, ends)
    e2e = [r.e2e_ms for r in chain]
    recorded = [r.recorded_ms for r in chain]
    return SessionOutcome(
        session_id=session_id,
        calls=len(calls),
        failed=sum(not r.ok for r in calls),
        blocked=sorted(r.call for r in calls if r.blocked_by is not None and r.call is not None),
        start_s=start,
        makespan_ms=math.nan if broken else (max(ends) - start) * 1000.0,
        prompt_tokens=sum(prompt) if prompt else None,
        cached_tokens=sum(cached) if cached else None,
        critical_path=[r.call for r in chain if r.call is not None],
        critical_llm_ms=sum(e for e in e2e if e is not None) if chain and None not in e2e else None,
        recorded_llm_ms=sum(t for t in recorded if t is not None) if chain and None not in recorded else None,
    )


def _critical_chain(calls: list[RequestRecord], ends: list[float]) -> list[RequestRecord]:
    """From the call that ended last back to a root: each step the call whose end is the ``ready_s``
    of the one after it (the replay sets ``ready_s`` to exactly that end)."""
    last = max(range(len(calls)), key=lambda i: ends[i])
    chain = [calls[last]]
    while (r := chain[-1]).depth and r.ready_s is not None:
        ready = r.ready_s
        before = next((c for c, e in zip(calls, ends, strict=True) if abs(e - ready) < 1e-6), None)
        if before is None or before in chain:
            break  # a hand-written or converted file: no exact end to follow
        chain.append(before)
    return chain[::-1]


def _graph_calls(records: Iterable[RequestRecord]) -> dict[str, list[RequestRecord]]:
    """The records of agent-session calls by session, in file order (a ``call`` without a
    ``session_id`` belongs to no session and is left out)."""
    by_session: dict[str, list[RequestRecord]] = {}
    for r in records:
        if r.call is not None and r.session_id is not None:
            by_session.setdefault(r.session_id, []).append(r)
    return by_session


def _in_order(by_session: dict[str, list[RequestRecord]]) -> list[SessionOutcome]:
    # Then by id: records arrive in completion order, and the order must be the same on every read.
    outcomes = [_outcome(sid, calls) for sid, calls in by_session.items()]
    return sorted(outcomes, key=lambda o: (o.start_s, o.session_id))


def session_outcomes(records: Iterable[RequestRecord]) -> list[SessionOutcome]:
    """One :class:`SessionOutcome` per ``session_id`` among the records with a ``call``, in order of
    start."""
    return _in_order(_graph_calls(records))


def agent_sessions(records: Iterable[RequestRecord]) -> AgentSessions | None:
    """The run's :class:`AgentSessions`; ``None`` when no record is an agent-session call."""
    by_session = _graph_calls(records)
    if not by_session:
        return None
    outcomes = _in_order(by_session)
    both = [
        (r.prompt_tokens, r.cached_tokens)
        for calls in by_session.values()
        for r in calls
        if r.prompt_tokens is not None and r.cached_tokens is not None
    ]
    prompt = sum(p for p, _ in both)
    timed = [o for o in outcomes if not math.isnan(o.makespan_ms)]
    succeeded = sum(o.ok for o in outcomes)
    ratios = [
        o.critical_llm_ms / o.recorded_llm_ms
        for o in outcomes
        if o.ok and o.critical_llm_ms is not None and o.recorded_llm_ms
    ]
    return AgentSessions(
        sessions=len(outcomes),
        calls=sum(o.calls for o in outcomes),
        succeeded=succeeded,
        success_rate=succeeded / len(outcomes),
        makespan_ms=Distribution.of([o.makespan_ms for o in outcomes]),
        blocked_calls=sum(len(o.blocked) for o in outcomes),
        prefix_hit_rate=sum(c for _, c in both) / prompt if prompt else None,
        # max keeps the first of equals: the earliest-starting of the slowest.
        slowest=max(timed, key=lambda o: o.makespan_ms) if timed else None,
        failed_sessions=[o.session_id for o in outcomes if not o.ok][:FAILED_SESSIONS_SHOWN],
        critical_vs_recorded=Distribution.of(ratios) if ratios else None,
    )
