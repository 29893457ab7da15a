"""Sessions replayed with live history: a real headless Locust run against a server that tags replies.

The corpus is built from the bundled CrossWOZ dialogues (``--sessions``); the server writes a reply
unique to each request. The claims: every turn after the first carries, as its history, exactly the
text the server replied to the earlier turns of its session (live history, not the log's); turn
``k+1`` reaches the server only after turn ``k``'s stream was written to its end; the think time is
kept (turn ``k+1`` is intended at the end of turn ``k`` plus the think time and never sent earlier;
how late it goes is the machine's, measured by ``bench/sessions.py``, docs/load.md); the records
and the summary break the run down by session and turn.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness.common import headers as H
from harness.common.settings import load_settings
from harness.corpus.model import read_corpus
from harness.corpus.sessions import SessionBuildInputs, build_sessions
from harness.corpus.settings import CorpusSettings
from harness.corpus.timing import ThinkTime
from harness.load.results import read_records
from harness.load.run_summary import read_summary
from harness.load.runner import LoadSpec, run_locust
from tests.load.sse_server import Behaviour, SSEServer

pytestmark = pytest.mark.slow
THINK_S = 0.15
TIMEOUT_S = 180


def _corpus(out: Path, n: int) -> Path:
    settings = load_settings(CorpusSettings, seed=3)
    build_sessions(
        SessionBuildInputs(out=out, n=n, think_time=ThinkTime.parse(f"constant:{THINK_S}")), settings
    )
    return out


def _check_live_history(served: list[Any], by_id: dict[str, int], think_s: float) -> None:
    """Every session's turns reached the server in order, closed-loop, each with the server's exact
    earlier replies as its history and the think time kept."""
    sessions: dict[str, list[Any]] = {}
    for x in served:
        sessions.setdefault(x.headers[H.SESSION_ID], []).append(x)
    assert set(sessions) == set(by_id)
    for sid, turns in sessions.items():
        turns.sort(key=lambda x: x.received)
        assert len(turns) == by_id[sid]
        for k, x in enumerate(turns):
            msgs = x.body["messages"]
            # The history is every earlier turn's user message and the server's exact reply to it.
            answers = [m["content"] for m in msgs if m["role"] == "assistant"]
            assert answers == [t.reply for t in turns[:k]], (sid, k)
            if k:
                prev = turns[k - 1]
                assert prev.done is not None and x.received > prev.done, "turn k+1 sent before turn k ended"
                # The think time is kept, never cut: ``done`` is stamped before the stream's end is
                # written, so the client saw the end after it, and sent no sooner than think_s later.
                assert x.received - prev.done >= think_s


def _check_records(recs: list[Any], by_id: dict[str, int], think_s: float) -> None:
    """Records of every turn, live, each turn intended at its predecessor's end plus the think time."""
    assert {(r.session_id, r.history_source) for r in recs} == {(sid, "live") for sid in by_id}
    assert len(recs) == sum(by_id.values()) and all(r.error is None for r in recs)
    # Turn k+1 is intended exactly at the end of turn k's stream plus the think time, so its lateness
    # measures how well the think time was kept. How small that lateness is depends on the machine
    # (a descheduled process wakes late): bench/sessions.py measures it; here, the schedule itself.
    by_turn = {(r.session_id, r.turn): r for r in recs}
    for (sid, turn), r in by_turn.items():
        if turn is not None and turn > 1:
            prev = by_turn[(sid, turn - 1)]
            assert prev.e2e_ms is not None
            assert r.intended_s == pytest.approx(prev.sent_s + prev.e2e_ms / 1000.0 + think_s, abs=1e-6)
            assert r.sent_s >= r.intended_s


def test_live_history_carries_what_the_target_answered(tmp_path: Path) -> None:
    corpus = _corpus(tmp_path / "corpus", 4)
    records = list(read_corpus(corpus))
    by_id = {r.session.session_id: r.session.turns for r in records if r.session is not None}
    with SSEServer(Behaviour(first_token_s=0.005, gap_s=0.002, tokens=6, tag_replies=True)) as srv:
        spec = LoadSpec(host=srv.url, corpus=corpus, rate=4, duration=1, results_dir=tmp_path / "r",
                        start_delay=1.0, concurrency=8)  # fmt: skip
        assert run_locust(spec, timeout_s=TIMEOUT_S) == 0
        served = srv.requests
    assert len(served) == sum(by_id.values()) == len(records)
    _check_live_history(served, by_id, THINK_S)
    recs = list(read_records(tmp_path / "r"))
    _check_records(recs, by_id, THINK_S)
    s = read_summary(tmp_path / "r")
    assert s.errors == 0 and not s.interrupted and s.sessions == 4
    assert s.recipe is not None and (s.recipe.history, s.recipe.salt_per_pass) == ("live", None)
    assert [t.turn for t in s.turns] == list(range(1, max(by_id.values()) + 1))
    assert s.turns[0].requests == 4 and s.turns[1].ttft_ms.n == sum(1 for n in by_id.values() if n >= 2)


def test_two_workers_keep_each_session_whole_and_never_cut_a_conversation_at_drain(tmp_path: Path) -> None:
    """``--processes 2``: every session's turns on one worker, live history exact, one results dir.

    ``--max-requests 4`` counts sessions (4 starts, every turn of each), and ``--drain-timeout 1``
    is far shorter than a 7-turn conversation at a 0.5 s think time (≥ 3 s): a timeout counted
    from the last start would cut it (at most 1 s drain + a 1 s tick after it), the one counted from
    the last scheduled turn does not."""
    think_s = 0.5
    settings = load_settings(CorpusSettings, seed=4)  # 4 sessions of 7, 4, 7 and 4 turns
    corpus = tmp_path / "corpus"
    build_sessions(
        SessionBuildInputs(out=corpus, n=4, think_time=ThinkTime.parse(f"constant:{think_s}")), settings
    )
    by_id = {r.session.session_id: r.session.turns for r in read_corpus(corpus) if r.session is not None}
    assert (max(by_id.values()) - 1) * think_s > 2 * 1.0 + 0.5  # the conversation outlasts the old cut
    with SSEServer(Behaviour(first_token_s=0.005, gap_s=0.002, tokens=6, tag_replies=True)) as srv:
        spec = LoadSpec(host=srv.url, corpus=corpus, rate=8, max_requests=4, drain_timeout=1.0,
                        results_dir=tmp_path / "r", start_delay=2.0, concurrency=4, processes=2)  # fmt: skip
        assert run_locust(spec, timeout_s=TIMEOUT_S) == 0
        served = srv.requests
    assert len(served) == sum(by_id.values())
    _check_live_history(served, by_id, think_s)
    recs = list(read_records(tmp_path / "r"))
    _check_records(recs, by_id, think_s)
    workers_of: dict[str | None, set[int | None]] = {}
    for r in recs:
        workers_of.setdefault(r.session_id, set()).add(r.worker)
    assert all(len(w) == 1 for w in workers_of.values())  # a session never spans workers
    assert {w for ws in workers_of.values() for w in ws} == {0, 1}  # both workers played sessions
    s = read_summary(tmp_path / "r")
    assert s.sessions == 4 and s.requests == len(recs) and not s.interrupted and s.errors == 0
    assert sorted(w.recorded for w in s.workers) == sorted(
        sum(by_id[sid] for sid, ws in workers_of.items() if ws == {w}) for w in (0, 1)
    )
