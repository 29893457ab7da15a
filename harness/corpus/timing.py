"""Session timing: think-time distributions and timing traces (``--think-time``, ``--trace``).

Where a dialogue log has no timestamps, the think time before turn ``k > 1`` of a session comes from
a timing trace or, failing that, from a stated distribution (the choice, turn by turn, is
:func:`harness.corpus.sessions.think_times`). This module holds those two sources:

* :class:`ThinkTime` — ``lognormal:MEDIAN,SIGMA``, ``exponential:MEAN`` or ``constant:SECONDS``,
  drawn seeded per session and turn;
* :func:`read_timing_trace` — a Mooncake-style JSONL trace (``timestamp`` in ms and a
  ``session_id`` / ``chat_id`` / ``conversation_id``, or without any, sessions inferred from
  growing ``hash_ids`` prefixes, :func:`chain_by_prefix`) as a :class:`TimingTrace`: session ``i``
  of the trace times dialogue ``i``, its turns by the gaps between arrivals.

:func:`chain_by_prefix` (with :class:`TraceRequest`, one trace line) is also how the ``mooncake``
dialogue log of :mod:`harness.corpus.dialogues` finds a trace's conversations.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any, Literal

import numpy as np
import orjson
from pydantic import Field, ValidationError

from harness.common.errors import ConfigError, InputError
from harness.common.model import StrictModel
from harness.corpus.logs import _payload

SESSION_FIELDS = ("session_id", "chat_id", "conversation_id")
"""Names a timing trace's session id may go by."""


class ThinkTime(StrictModel):
    """The stated distribution of think times where a log has no timestamps (``--think-time``).

    ``lognormal:MEDIAN,SIGMA`` (seconds; default ``lognormal:8,0.8``: a median user reads and types
    for 8 s), ``exponential:MEAN`` or ``constant:SECONDS``; draws are clipped to ``[lo, hi]``."""

    kind: Literal["lognormal", "exponential", "constant"] = "lognormal"
    a: float = Field(default=8.0, ge=0.0)
    b: float = Field(default=0.8, ge=0.0)
    lo: float = Field(default=0.0, ge=0.0)
    hi: float = Field(default=120.0, gt=0.0)

    @classmethod
    def parse(cls, spec: str) -> ThinkTime:
        kind, _, args = spec.partition(":")
        try:
            nums = [float(x) for x in args.split(",") if x.strip()]
            if kind == "lognormal" and len(nums) == 2:
                return cls(kind="lognormal", a=nums[0], b=nums[1])
            if kind in ("exponential", "constant") and len(nums) == 1:
                return cls(kind=kind, a=nums[0], b=0.0)
        except (ValueError, ValidationError):
            pass
        raise ConfigError(
            f"not a think-time distribution: {spec!r}",
            field="--think-time",
            hint="lognormal:MEDIAN,SIGMA, exponential:MEAN or constant:SECONDS",
        )

    def describe(self) -> str:
        if self.kind == "lognormal":
            return f"lognormal(median {self.a:g} s, sigma {self.b:g}) clipped to [{self.lo:g}, {self.hi:g}] s"
        if self.kind == "exponential":
            return f"exponential(mean {self.a:g} s) clipped to [{self.lo:g}, {self.hi:g}] s"
        return f"constant {self.a:g} s"

    def draw(self, seed: int, session_id: str, turn: int) -> float:
        """A seeded draw for one turn (the same seed, session and turn give the same time)."""
        if self.kind == "constant":
            return self.a
        digest = hashlib.blake2b(f"think:{seed}:{session_id}:{turn}".encode(), digest_size=8).digest()
        rng = np.random.default_rng(int.from_bytes(digest, "big"))
        x = (
            rng.lognormal(math.log(max(self.a, 1e-9)), self.b)
            if self.kind == "lognormal"
            else rng.exponential(self.a)
        )
        return float(min(max(x, self.lo), self.hi))


@dataclass(frozen=True, slots=True)
class SessionTiming:
    """A timing trace's session: its start and its turns' think times (``None``: not in the trace)."""

    start_s: float
    think_s: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class TimingTrace:
    """The sessions of a timing trace (``--trace``), by start time, and how they were found."""

    sessions: list[SessionTiming]
    how: Literal["ids", "prefix"]
    """``ids``: the lines' session ids; ``prefix``: inferred from growing ``hash_ids`` prefixes."""
    requests: int
    """Lines that went into a session."""
    forks: int = 0
    """Requests (``prefix``) that extend a turn another request already continued: new sessions."""

    @property
    def think_source(self) -> str:
        """``think_source`` of the turns it times."""
        return "trace" if self.how == "ids" else "trace-prefix"

    def summary(self) -> dict[str, Any]:
        turns = [len(s.think_s) + 1 for s in self.sessions]
        return {
            "sessions_from": "session ids" if self.how == "ids" else "hash_ids prefix extension",
            "requests": self.requests,
            "sessions": len(self.sessions),
            "multi_turn_sessions": sum(1 for t in turns if t > 1),
            "turns_max": max(turns, default=0),
            "turns_histogram": {str(k): v for k, v in sorted(Counter(turns).items())},
            "forks": self.forks,
        }


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """What prefix inference needs of one trace line."""

    at_s: float
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...]


class _Node:
    """A node of the prefix trie over hash ids: the requests whose full blocks end exactly here."""

    __slots__ = ("ends", "next")

    def __init__(self) -> None:
        self.next: dict[int, _Node] = {}
        self.ends: list[int] = []


def chain_by_prefix(reqs: Sequence[TraceRequest], block_size: int) -> tuple[list[list[int]], int]:
    """Sessions of a trace without session ids, inferred from KV block prefixes: (turn lists, forks).

    Request B is the next turn of an earlier request A when B's ``hash_ids`` start with every FULL
    block of A (``input_tokens // block_size`` of them: A's last block is partial unless the length is
    a multiple, and a longer prompt hashes it differently) and B's prompt holds at least A's prompt
    and A's answer (``B.input ≥ A.input + max(A.output, 1)``): a next turn carries the history,
    answer included. That second test is what separates turns from siblings, requests that share a
    document or system prompt but each ask their own question (the synthetic Mooncake trace is full of
    them: same blocks, a few tokens apart). Among several such A, the one with the longest shared
    prefix is the previous turn (turn k+2 also extends turn k), then the latest; an A that already
    has a next turn is not taken again, so a second continuation (a fork) starts a session of its
    own. Requests are taken in timestamp order, so turns are in timestamp order.
    """
    order = sorted(range(len(reqs)), key=lambda i: (reqs[i].at_s, i))
    root = _Node()
    continued: set[int] = set()
    session_of: dict[int, int] = {}
    sessions: list[list[int]] = []
    forks = 0
    for i in order:
        b = reqs[i]
        path: list[_Node] = []
        node = root
        for h in b.hash_ids:
            nxt = node.next.get(h)
            if nxt is None:
                break
            node = nxt
            path.append(node)
        parent: int | None = None
        taken = False
        for node in reversed(path):  # the longest shared prefix first
            for j in reversed(node.ends):  # then the latest request
                a = reqs[j]
                if b.input_tokens < a.input_tokens + max(a.output_tokens, 1):
                    continue
                if j in continued:
                    taken = True
                    continue
                parent = j
                break
            if parent is not None:
                break
        if parent is None:
            forks += taken
            session_of[i] = len(sessions)
            sessions.append([i])
        else:
            continued.add(parent)
            session_of[i] = session_of[parent]
            sessions[session_of[i]].append(i)
        full = min(len(b.hash_ids), b.input_tokens // block_size)
        node = root
        for h in b.hash_ids[:full]:
            node = node.next.setdefault(h, _Node())
        if full:
            node.ends.append(i)
    return sessions, forks


def read_timing_trace(path: Path) -> TimingTrace:
    """Sessions of a Mooncake-style JSONL trace, by start time.

    With session ids (``session_id`` / ``chat_id`` / ``conversation_id``) on its lines, those group
    the turns (lines without one are skipped); without any, sessions are inferred from ``hash_ids``
    (:func:`chain_by_prefix`, Mooncake's 512-token blocks). Think time before turn k is the gap
    between the arrivals of turns k−1 and k: the trace does not say when turn k−1's answer ended, so
    the gap includes that answer's generation time as well as the user's thinking.
    """
    from harness.traces.readers.mooncake import BLOCK_SIZE  # the trace's own block size

    _, data = _payload(path)
    rows: dict[str, list[float]] = {}
    plain: list[tuple[int, dict[str, Any], float]] = []
    for n, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        obj = _timestamped(path, n, line)
        at_s = float(obj["timestamp"]) / 1000.0
        sid = next((obj[f] for f in SESSION_FIELDS if obj.get(f) is not None), None)
        if sid is not None:
            rows.setdefault(str(sid), []).append(at_s)
        else:
            plain.append((n, obj, at_s))
    if rows:
        sessions = [sorted(ts) for ts in rows.values()]
        return TimingTrace(_timings(sessions), "ids", sum(len(ts) for ts in sessions))
    reqs = [_trace_request(path, n, obj, at_s) for n, obj, at_s in plain if "hash_ids" in obj]
    if not reqs:
        raise InputError(
            f"no line has a session id ({', '.join(SESSION_FIELDS)}) or hash_ids: sessions and think "
            "times cannot be taken from this trace",
            file=path,
            hint="give --sessions a dialogue log only (think times then come from --think-time)",
        )
    chains, forks = chain_by_prefix(reqs, BLOCK_SIZE)
    return TimingTrace(_timings([[reqs[i].at_s for i in c] for c in chains]), "prefix", len(reqs), forks)


def _trace_request(path: Path, n: int, obj: dict[str, Any], at_s: float) -> TraceRequest:
    ids, inp, outp = obj.get("hash_ids"), obj.get("input_length"), obj.get("output_length", 0)
    if not isinstance(ids, list) or not all(isinstance(h, int) for h in ids):
        raise InputError("expected 'hash_ids', a list of integers", file=path, line=n, field="hash_ids")
    for name, v in (("input_length", inp), ("output_length", outp)):
        if not isinstance(v, int) or v < 0:
            raise InputError(
                "expected a token count ≥ 0 (sessions are inferred from hash_ids and lengths)",
                file=path,
                line=n,
                field=name,
            )
    assert isinstance(inp, int) and isinstance(outp, int)
    return TraceRequest(at_s, inp, outp, tuple(ids))


def _timings(sessions: list[list[float]]) -> list[SessionTiming]:
    sessions = sorted(sessions, key=lambda ts: ts[0])
    t0 = sessions[0][0]
    return [SessionTiming(ts[0] - t0, tuple(b - a for a, b in pairwise(ts))) for ts in sessions]


def _timestamped(path: Path, n: int, line: bytes) -> dict[str, Any]:
    """Line ``n`` of a Mooncake-style trace: a JSON object with a numeric ``timestamp`` (ms), or an
    ``InputError`` naming the file, line and field."""
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise InputError(f"invalid JSON ({exc.msg})", file=path, line=n) from None
    if not isinstance(obj, dict) or not isinstance(obj.get("timestamp"), int | float):
        raise InputError(
            "expected an object with a numeric 'timestamp' (ms)", file=path, line=n, field="timestamp"
        )
    return obj
