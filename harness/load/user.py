"""The replay user: takes arrivals from the pacer and streams one OpenAI request per arrival.

Users are the concurrency pool of the open loop (:mod:`harness.load.pacer`): ``wait_time`` is zero
and each task blocks on the pacer's queue, so *when* a request goes out is the schedule's decision,
not the user's. The pacer hands an arrival over a little ahead of time; the user builds its headers
and trace context, waits for the intended time, and only then stamps ``sent`` and writes it. The
record's ``queue_wait_ms`` is the part of its lateness the arrival spent waiting for a free user
(every user busy: the target's backpressure), as the pacer stamped it. Each user is a plain Locust
``User`` with its own keep-alive connection (:mod:`harness.load.wire`) and sends one request at a
time, so no request ever waits for a pooled connection inside a timer.

Measuring a stream: the request head is written as bytes with the body, and the response body is read
line by line from the socket as bytes arrive (``readline(b"\\n")`` on geventhttpclient's streaming
response; ``FastHttpSession.iter_lines`` reads 1 KiB blocks and would batch events). Each line is
stamped with ``perf_counter`` on arrival; parsing and token counting wait until the stream ended
(:mod:`harness.load.client`, :mod:`harness.load.stream`). Locust's ``FastHttpSession.request`` is not
used: with ``stream=True`` its timer stops at the headers, and its per-call bookkeeping, like
``HTTPClient.request``'s header handling, cost more than the replay itself.

Locust's own statistics get one truthful entry per request: the request's name with
``response_time`` = E2E (Locust would otherwise stop the clock at the headers) and
``response_length`` = bytes read, so its RPS, counts and failure ratio are the requests'. TTFT, TPOT
and ITL live in the "LLM load" tab (:mod:`harness.load.web`). Locust rounds what it shows; every
percentile the harness reports is computed from ``records.jsonl``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import gevent
import locust  # noqa: F401  (gevent's monkey-patching, before anything does I/O)
from gevent import GreenletExit
from gevent.event import Event
from locust import User, constant, task

from harness.common import headers as H
from harness.corpus.model import SessionCall
from harness.load import plugin
from harness.load.arrivals import Arrival, bypasses
from harness.load.client import (
    MAX_ERROR_BODY,
    StreamBody,
    StreamOutcome,
    fill_stream_fields,
    http_error,
    read_response,
    read_sse,
    stream_headers,
)
from harness.load.loadrun import LoadRun
from harness.load.pacer import IDLE_AFTER_S, IDLE_LEAD_S, MAX_NAP_S
from harness.load.results import RequestRecord
from harness.load.sessions import LiveHistory, live_outputs, salted_body
from harness.load.wire import Connection


@dataclass(slots=True)
class _Request:
    """One request in flight: what the finish step needs besides its record."""

    path: str
    span: Any
    start_time: float
    """Wall time at send (Locust's ``start_time``)."""
    sent: float
    """perf_counter at send."""
    body: StreamBody = field(default_factory=StreamBody)


MAX_WARM_SPARES = 7
"""The most extra connections a user opens ahead for an agent session's parallel calls (a wider
fan-out opens the rest when it happens)."""


@dataclass(slots=True)
class _CallPlace:
    """An agent session's call as :meth:`ReplayUser.send` records and traces it."""

    call: SessionCall
    ready_s: float
    parent: Any
    """The session's span: the call's span is its child (one trace per session played)."""
    after: list[Any]
    """The spans of the calls it waited for (linked)."""
    span: Any = None
    """Its own span, once sent (its dependants link it)."""


class ReplayUser(User):
    """One slot of the open loop's concurrency pool (``--concurrency`` of them per process)."""

    abstract = False
    wait_time = constant(0)
    connection_timeout = 30.0

    def __init__(self, environment: Any) -> None:
        super().__init__(environment)
        run = plugin.current()
        # Its own keep-alive connection (:mod:`harness.load.wire`), with the run's timeouts and TLS
        # policy (verified unless --insecure: Locust's FastHttpUser would not verify by default).
        self._conn: Connection | None = None
        self._own_free = True
        self._spare: list[Connection] = []
        """Connections this user opened for an agent session's parallel calls, free for the next."""
        if run is not None:
            self._conn = self._new_connection()

    def on_start(self) -> None:
        # Connect before the epoch (users spawn during --start-delay), so that the first arrival of
        # each user does not pay for the TCP handshake and the resolver: clients of an LLM service
        # keep their connections.
        if self._conn is not None:
            self._conn.warm()
        # The same for the parallel calls of agent sessions: as many connections as the widest
        # fan-out needs (bounded), so a branch does not pay for a handshake its siblings do not.
        run = plugin.current()
        sessions = run.inputs.sessions if run is not None and self._conn is not None else None
        if sessions:
            for _ in range(min(MAX_WARM_SPARES, max(p.width for p in sessions) - 1)):
                spare = self._new_connection()
                spare.warm()
                self._spare.append(spare)

    def on_stop(self) -> None:
        for conn in [self._conn, *self._spare]:
            if conn is not None:
                conn.close()

    @task
    def replay(self) -> None:
        run = plugin.current()
        pacer = run.pacer if run is not None else None
        if run is None or pacer is None:
            gevent.sleep(0.1)  # the master process, or before test_start
            return
        taken = pacer.take_handover()
        if taken is None:
            gevent.sleep(1.0)  # the share is done; the shape ends the test
            return
        a = taken.arrival
        try:
            sessions = run.inputs.sessions
            if sessions is not None and sessions[a.request].graph:
                self.play_graph(run, a, taken.queue_wait_s)
            elif sessions is not None:
                self.play_session(run, a, taken.queue_wait_s)
            elif run.opts.salt_per_pass:
                reqs = run.inputs.requests
                body = salted_body(reqs[a.request].body, a.seq // len(reqs))
                self.send(run, a, queue_wait_s=taken.queue_wait_s, body=body)
            else:
                self.send(run, a, queue_wait_s=taken.queue_wait_s)
        finally:
            pacer.done()

    def play_session(self, run: LoadRun, a: Arrival, queue_wait_s: float | None) -> None:
        """One whole conversation (:mod:`harness.load.sessions`): turn ``k+1`` is sent ``think_time_s``
        after turn ``k``'s stream ended, with the history the target answered (``--history live``)."""
        inputs = run.inputs
        assert inputs.sessions is not None
        plan = inputs.sessions[a.request]
        live = run.opts.history == "live"
        pass_index = a.seq // len(inputs.sessions) if run.opts.salt_per_pass else 0
        history = LiveHistory()
        intended_s = a.intended_s
        log_calls: list[dict[str, Any]] | None = None
        for k, ri in enumerate(plan.turns):
            rec = inputs.records[ri]
            st = rec.session
            assert st is not None
            # Built before the think time: when it ends only the send is left to do.
            turn = history.body_for(
                rec, inputs.requests[ri].body, live=live and k > 0, pass_index=pass_index, log_calls=log_calls
            )
            if k:
                self._nap_until(run, intended_s, st.think_time_s)
            end, out, _ = self.send(
                run, Arrival(a.seq, intended_s, ri, stage=a.stage),
                queue_wait_s=queue_wait_s if k == 0 else 0.0, body=turn.body,
                session=(plan.id, st.turn, run.opts.history), tool_results=turn.tool_results,
            )  # fmt: skip
            # A failed turn's answer is what arrived of it (maybe nothing): the user goes on, as a
            # person facing an error would, and the record says the turn failed.
            history.answered(turn, st.user, out.message() if out is not None else None)
            log_calls = [c.model_dump() for c in st.log_tool_calls] if st.log_tool_calls else None
            if k + 1 < len(plan.turns):
                nxt = inputs.records[plan.turns[k + 1]].session
                assert nxt is not None
                intended_s = (end - run.epoch) + nxt.think_time_s
                run.note_turn(intended_s)

    def play_graph(self, run: LoadRun, a: Arrival, queue_wait_s: float | None) -> None:
        """One agent session as its trace's call graph (:mod:`harness.load.sessions`).

        Every call gets a greenlet at the session's start: it waits for the calls it names in
        ``after``, naps through its gap and sends, on a connection of its own while another of the
        session's calls is in flight (so parallel branches leave together and none waits for a
        connection inside its timer). Its live answer replaces its recorded one in the bodies of the
        calls that ``use`` it (``--history live``). A call whose predecessor failed is not sent: its
        record fails, naming the call that failed (and so, in turn, do its own dependants)."""
        inputs = run.inputs
        assert inputs.sessions is not None
        plan = inputs.sessions[a.request]
        live = run.opts.history == "live"
        passes = a.seq // len(inputs.sessions)
        pass_index = passes if run.opts.salt_per_pass else 0
        # Each play is a session of its own in the records and on the wire: a corpus replayed again
        # (a rate longer than one pass) names its later plays ``<trace id>~<pass>``.
        sid = plan.id if passes == 0 else f"{plan.id}~{passes}"
        n = len(plan.turns)
        done = [Event() for _ in range(n)]
        ends: list[float] = [0.0] * n
        answers: list[str] = [""] * n
        failed: list[int | None] = [None] * n  # None: the call succeeded; else the failed call it carries
        calls: list[SessionCall] = []
        for ri in plan.turns:
            call = inputs.records[ri].call
            assert call is not None
            calls.append(call)

        tracing = run.tracing
        assert tracing is not None
        session_span = tracing.session(
            f"session {sid}",
            attributes={"harness.session_id": sid, "harness.calls": n, "harness.source_trace_id": plan.id},
            start_ns=time.time_ns() + max(0, int((run.epoch + a.intended_s - time.perf_counter()) * 1e9)),
        )
        places: list[_CallPlace | None] = [None] * n

        def play(k: int) -> None:
            ri, c = plan.turns[k], calls[k]
            try:
                for p in c.after:
                    done[p - 1].wait()
                ready_s = max((ends[p - 1] for p in c.after), default=run.epoch + a.intended_s) - run.epoch
                blocked = next((failed[p - 1] for p in c.after if failed[p - 1] is not None), None)
                if blocked is not None:
                    failed[k] = blocked
                    self._blocked(run, Arrival(a.seq, ready_s, ri, stage=a.stage), sid, c, blocked)
                    return
                intended_s = ready_s + c.gap_s
                run.note_turn(intended_s)
                body = salted_body(inputs.requests[ri].body, pass_index)
                if live and c.uses:
                    body, _ = live_outputs(
                        body, [(calls[u - 1].log_output or "", answers[u - 1]) for u in c.uses]
                    )
                self._nap_until(run, intended_s, c.gap_s)
                conn = self._take_connection()
                after = [
                    sp for p in c.after if (pl := places[p - 1]) is not None and (sp := pl.span) is not None
                ]
                place = places[k] = _CallPlace(c, ready_s, session_span, after)
                try:
                    end, out, sent = self.send(
                        run, Arrival(a.seq, intended_s, ri, stage=a.stage),
                        queue_wait_s=queue_wait_s if not c.after else 0.0, body=body,
                        session=(sid, None, run.opts.history), conn=conn, graph=place,
                    )  # fmt: skip
                finally:
                    self._give_back(conn)
                ends[k] = end
                answers[k] = out.text() if out is not None else ""
                if not sent.ok:
                    failed[k] = c.call
            finally:
                done[k].set()

        # joinall with raise_error: a stop (GreenletExit in this task) or a bug reaches Locust, the
        # session's greenlets killed with it.
        greenlets = [gevent.spawn(play, k) for k in range(n)]
        try:
            gevent.joinall(greenlets, raise_error=True)
        finally:
            gevent.killall([g for g in greenlets if not g.dead])
            failures = sum(1 for f in failed if f is not None)
            tracing.end(
                session_span, attributes={"harness.failed_calls": failures},
                error=f"{failures} of {n} calls failed" if failures else None, end_ns=time.time_ns(),
            )  # fmt: skip

    def _take_connection(self) -> Connection:
        """A keep-alive connection no other call of this user is using (a new one when all are)."""
        assert self._conn is not None
        if self._own_free:
            self._own_free = False
            return self._conn
        if self._spare:
            return self._spare.pop()
        return self._new_connection()

    def _new_connection(self) -> Connection:
        run = plugin.current()
        assert run is not None
        return Connection(
            self.host or "", run.credentials,
            connection_timeout=self.connection_timeout, network_timeout=run.opts.request_timeout,
        )  # fmt: skip

    def _give_back(self, conn: Connection) -> None:
        if conn is self._conn:
            self._own_free = True
        else:
            self._spare.append(conn)

    def _blocked(self, run: LoadRun, a: Arrival, session_id: str, c: SessionCall, by: int) -> None:
        """The record of a call not sent because call ``by``, which it waited for, failed (``a``: at
        the time that became known, when the call would have become ready)."""
        ready_s = a.intended_s
        spec = run.inputs.requests[a.request]
        stage = a.stage or run.opts.stage
        error = f"not sent: call {by} of session {session_id} failed, and this call waited for it"
        rec = RequestRecord(
            id=spec.id, stage=stage, intended_s=ready_s, sent_s=ready_s, lateness_ms=0.0, status=0,
            scenario=a.scenario or spec.scenario, tenant=spec.tenant, trace_id=spec.trace_id, error=error,
            session_id=session_id, history_source=run.opts.history, call=c.call, depth=c.depth,
            ready_s=ready_s, recorded_ms=c.recorded_ms, blocked_by=by,
        )  # fmt: skip
        run.record(rec)
        self.environment.events.request.fire(
            request_type="POST", name=spec.path, response_time=0.0, response_length=0,
            exception=RuntimeError(error), context={}, response=None, start_time=time.time(),
            url=(self.host or "") + spec.path,
        )  # fmt: skip

    @staticmethod
    def _nap_until(run: LoadRun, intended_s: float, think_s: float) -> None:
        """Sleep through a think time up to the lead before ``intended_s``; :meth:`send` then yields
        until it is due (:meth:`Pacer.wait_until`). A long gevent sleep overshoots by ~3 % of its
        length, so the nap halves what is left each time rather than sleeping it in one go."""
        pacer = run.pacer
        lead = pacer.lead_s if pacer is not None else 0.003
        if think_s >= IDLE_AFTER_S:  # after idleness the first milliseconds run slow (pacer.py)
            lead = max(lead, IDLE_LEAD_S)
        due = run.epoch + intended_s - lead
        while (left := due - time.perf_counter()) > 0:
            gevent.sleep(left if left <= 2 * MAX_NAP_S else left / 2)

    def send(
        self,
        run: LoadRun,
        a: Arrival,
        *,
        queue_wait_s: float | None = None,
        body: bytes | None = None,
        session: tuple[str, int | None, str] | None = None,
        tool_results: dict[str, int] | None = None,
        conn: Connection | None = None,
        graph: _CallPlace | None = None,
    ) -> tuple[float, StreamOutcome | None, RequestRecord]:
        """Send one arrival's request, read its stream line by line as it arrives, record it; the
        ``perf_counter`` time its stream ended, the parsed response (``None``: no body) and the record.

        ``queue_wait_s``: how long the arrival waited for a free user (:meth:`Pacer.take_handover`);
        ``None`` when there is no pacer to say. ``body``: other bytes than the prepared ones (a
        session turn, a salted pass); ``session``: (session id, turn, history source);
        ``tool_results``: what the turn's tool results were (:class:`~harness.load.sessions.LiveHistory`);
        ``conn``: another connection than the user's own (a parallel call of an agent session);
        ``graph``: an agent session's call (its span is then a child of the session's)."""
        spec = run.inputs.requests[a.request]
        stage = a.stage or run.opts.stage
        trace_id = a.trace_id or spec.trace_id
        bypass = bypasses(a.seq, run.opts.bypass_fraction, run.bypass_offset)
        hdrs = stream_headers(
            stage=stage, tenant=spec.tenant, extra=run.request_headers, warmup_id=run.warmup_id,
            trace_id=trace_id, bypass=bypass,
        )  # fmt: skip
        if session is not None:
            hdrs[H.SESSION_ID] = session[0]
        tracing = run.tracing
        conn = conn if conn is not None else self._conn
        assert tracing is not None and conn is not None
        if tracing.recording or graph is not None:
            # Only a recorded span carries attributes: a graph call without an endpoint needs just its
            # session's trace context, and the request path builds nothing it would throw away.
            attributes: dict[str, str | int] = {}
            if tracing.recording:
                attributes = {
                    "harness.stage": stage,
                    "harness.scenario": a.scenario or spec.scenario or "",
                    "harness.record_id": spec.id,
                    "harness.warmup_id": run.warmup_id,
                    "http.request.method": "POST",
                    "url.path": spec.path,
                    "gen_ai.operation.name": "chat"
                    if spec.path.endswith("/chat/completions")
                    else "text_completion",
                }
                if run.inputs.model:
                    attributes["gen_ai.request.model"] = run.inputs.model
                if graph is not None:
                    c = graph.call
                    attributes |= {
                        "harness.session_id": session[0] if session else "",
                        "harness.call": c.call,
                        "harness.after": ",".join(map(str, c.after)),
                        "gen_ai.agent.name": c.agent or "",
                    }
            span = tracing.start(
                f"POST {spec.path}",
                hdrs,
                attributes=attributes,
                source_trace_id=trace_id,
                # The request leaves at its intended time (below), up to the pacer's lead after now.
                start_ns=time.time_ns() + max(0, int((run.epoch + a.intended_s - time.perf_counter()) * 1e9)),
                parent=graph.parent if graph is not None else None,
                after=graph.after if graph is not None else (),
            )
            if graph is not None:
                graph.span = span
        else:  # only the trace context on the wire: no span object to build and end
            span = None
            tracing.inject_new_context(hdrs)
        # The record, prepared with the request (sent_s and lateness_ms are stamped at the send).
        rec = RequestRecord(
            id=spec.id, stage=stage, intended_s=a.intended_s, sent_s=math.nan, lateness_ms=0.0, status=0,
            scenario=a.scenario or spec.scenario, tenant=spec.tenant, trace_id=trace_id, bypass=bypass,
        )  # fmt: skip
        if session is not None:
            rec.session_id, rec.turn, rec.history_source = session  # type: ignore[assignment]
            rec.tool_results = tool_results
        if graph is not None:
            c = graph.call
            rec.call, rec.depth, rec.ready_s, rec.recorded_ms = c.call, c.depth, graph.ready_s, c.recorded_ms
        clock = time.perf_counter
        if run.pacer is not None:  # prepared ahead (the pacer's lead): now wait for the intended time
            run.pacer.wait_until(a.intended_s)
        req = _Request(spec.path, span, time.time(), clock())
        rec.sent_s = req.sent - run.epoch
        rec.lateness_ms = max(0.0, (rec.sent_s - a.intended_s) * 1000.0)
        if queue_wait_s is not None:  # never more than the lateness it is part of
            rec.queue_wait_ms = min(rec.lateness_ms, queue_wait_s * 1000.0)
        resp: Any = None
        try:
            resp = conn.post(spec.path, hdrs, spec.body if body is None else body)
            status = resp.status_code
            rec.status = status
            cache = resp.get(H.CACHE_STATUS)
            rec.cache = cache if isinstance(cache, str) else None
            if status == 200:
                # readline returns as soon as a whole line is in
                read_sse(iter(partial(resp.readline, b"\n"), b""), req.body, clock)
            else:
                rec.error = http_error(status, resp.read(MAX_ERROR_BODY), run.credentials)
        except GreenletExit:
            rec.error = "interrupted: the run stopped while this request was in flight"
            self._finish(run, rec, req, clock())
            raise
        except Exception as exc:  # refused, reset, timeout, mid-stream: the record says what happened
            rec.error = run.credentials.redact(f"{type(exc).__name__}: {exc}")
        finally:
            if resp is not None:
                resp.release()  # back to the pool (closed if the body was not read to its end)
        end = clock()
        return end, self._finish(run, rec, req, end), rec

    def _finish(self, run: LoadRun, rec: RequestRecord, req: _Request, end: float) -> StreamOutcome | None:
        """Parse the stream, fill the record's latencies and tokens, record and report it."""
        intended_abs = run.epoch + rec.intended_s
        sent = req.sent
        lines = req.body.lines
        out: StreamOutcome | None = None
        if lines:
            out = read_response(lines, run.opts.token_counting, run.tokenize)
            fill_stream_fields(rec, out, sent, intended_abs)
        if rec.error is None or lines:
            rec.e2e_ms = (end - sent) * 1000.0
            rec.e2e_from_intended_ms = (end - intended_abs) * 1000.0
        run.record(rec)
        if req.span is not None and run.tracing is not None:
            run.tracing.end(
                req.span,
                attributes={
                    "http.response.status_code": rec.status,
                    "harness.cache": rec.cache or "",
                    "harness.completion_tokens": rec.completion_tokens or 0,
                    "harness.lateness_ms": rec.lateness_ms,
                    "gen_ai.usage.input_tokens": rec.prompt_tokens or 0,
                    "gen_ai.usage.output_tokens": rec.completion_tokens or 0,
                },
                error=rec.error,
                end_ns=time.time_ns(),
            )
        self._report(rec, req)
        return out

    def _report(self, rec: RequestRecord, req: _Request) -> None:
        """One truthful entry in Locust's own statistics (its UI and ``--csv``) per request.

        TTFT and TPOT are not fired as extra request events: Locust counts every event as a request,
        and its RPS, request count and failure ratio would triple. They are in the "LLM load" tab
        and in ``summary.json``."""
        err = rec.error
        self.environment.events.request.fire(
            request_type="POST", name=req.path, response_time=rec.e2e_ms or 0.0,
            response_length=req.body.nbytes, exception=RuntimeError(err) if err is not None else None,
            context={}, response=None, start_time=req.start_time, url=(self.host or "") + req.path,
        )  # fmt: skip
