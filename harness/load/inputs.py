"""The validated inputs of a load run, read once, and the arrivals they make (no gevent here).

:meth:`Inputs.load` reads the corpus, schedule and plan a run's options name and checks them the
way the run will use them, so a mistake is a :class:`~harness.common.errors.HarnessError` before any
request is sent; :meth:`Inputs.with_options` checks a variant of the options (another rate) against
the files already read, so a process reads its corpus once and hands it on.
:meth:`Inputs.source` gives one worker's arrival source (its share of a schedule, or
of a rate); :meth:`Inputs.planned` the whole run's sequence of requests. The Locust plugin
(:mod:`harness.load.plugin`) and callers outside Locust (``harness run``) share this module, so they
apply the same rules; it imports nothing that patches gevent.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.common.errors import ConfigError, InputError
from harness.common.io import iter_jsonl
from harness.corpus.model import CorpusRecord, read_corpus
from harness.load.arrivals import (
    Arrival,
    ArrivalSource,
    ListArrivals,
    RateArrivals,
    RequestSpec,
    Segment,
    from_corpus_offsets,
    from_schedule,
    prepare_requests,
    share,
)
from harness.load.options import LoadOptions
from harness.load.plan import Ladder, plan_preload, read_plan
from harness.load.sessions import SessionPlan, plan_sessions
from harness.traces.model import ScheduleEntry


def _read_schedule(path: Path) -> list[ScheduleEntry]:
    return [e for _, e in iter_jsonl(path, ScheduleEntry, expected="a schedule entry")]


def _check_live_shape(records: list[CorpusRecord], api: str, corpus: Path | None) -> None:
    """Live history swaps a turn's ``session.history_at`` range inside its own body, messages (chat)
    or a prompt's characters (completions): ``--api`` of the other shape would send a body whose
    history cannot be placed. The first record of the other shape is a :class:`ConfigError` naming
    it, before any request."""
    want = "messages" if api == "chat" else "prompt"
    for i, r in enumerate(records):
        if (r.messages is not None) != (want == "messages"):
            has = "messages" if r.messages is not None else "prompt"
            raise ConfigError(
                f"record {r.id!r} holds its history in {has!r} (a "
                f"{'chat' if has == 'messages' else 'completions'} body); --api {api} would send "
                f"{want!r}, where live history cannot be placed",
                file=corpus,
                line=i + 1,
                field=has,
                hint=f"--api {'chat' if has == 'messages' else 'completions'} or auto, --history log, "
                "or build the corpus with the other session template",
            )


@dataclass
class Inputs:
    """The validated input files of a run (read once per test start)."""

    opts: LoadOptions
    records: list[CorpusRecord]
    requests: list[RequestSpec]
    schedule: list[ScheduleEntry] | None
    ladder: Ladder | None
    preload: Path | None = None
    """The JSONL to post to ``/cache/preload`` first: ``--preload``, else the plan's ``preload``."""
    sessions: list[SessionPlan] | None = None
    """A session corpus's conversations (:mod:`harness.load.sessions`): then an arrival's ``request``
    is a session index, and the arrival starts that whole conversation."""
    rate: float | None = None
    """``--rate`` in requests/s (a share of capacity resolved with ``--capacity``); ``None``: no rate."""
    default_model: str | None = None
    """The ``model`` the requests name when the options give none: the target's first
    ``GET /v1/models`` id (:meth:`with_default_model`). ``None``: no ``model`` is sent."""

    @property
    def model(self) -> str | None:
        """The ``model`` every request names: ``--model``, else :attr:`default_model`."""
        return self.opts.model or self.default_model

    def with_default_model(self, model: str | None) -> Inputs:
        """These inputs with ``model`` named by every request that ``--model`` does not name (the
        request bodies serialized again; the same inputs when nothing changes)."""
        if model == self.default_model:
            return self
        changed = dataclasses.replace(self, default_model=model)
        if self.opts.model is None:
            changed.requests = _prepare(self.opts, self.records, model)
        return changed

    @classmethod
    def load(cls, opts: LoadOptions, *, ladder: bool, posts_preload: bool = True) -> Inputs:
        """Read and check the inputs; ``posts_preload``: this process posts the preload (not a
        worker), so the file must exist here."""
        if opts.corpus is None:
            raise ConfigError("no corpus given", field="--corpus", hint="--corpus runs/corpus/corpus.jsonl")
        records = list(read_corpus(opts.corpus))
        if not records:
            raise InputError("the corpus has no records", file=opts.corpus)
        schedule = _read_schedule(opts.schedule) if opts.schedule is not None else None
        return cls._checked(opts, records, schedule, None, ladder=ladder, posts_preload=posts_preload)

    def with_options(self, opts: LoadOptions, *, ladder: bool = False, posts_preload: bool = True) -> Inputs:
        """The inputs of a variant of this run's options (another rate, a phase's precision
        options …), checked as :meth:`load` checks them, without reading the corpus and schedule
        again: they are handed on (the same files: a variant naming others is refused)."""
        if opts.corpus != self.opts.corpus or opts.schedule != self.opts.schedule:
            raise ValueError("with_options keeps the corpus and schedule; Inputs.load reads others")
        same_requests = all(
            getattr(opts, k) == getattr(self.opts, k)
            for k in ("api", "model", "max_tokens_cap", "token_counting", "seed_policy")
        )
        requests = self.requests if same_requests else None
        return self._checked(
            opts,
            self.records,
            self.schedule,
            requests,
            ladder=ladder,
            posts_preload=posts_preload,
            default_model=self.default_model,
        )

    @classmethod
    def _checked(
        cls,
        opts: LoadOptions,
        records: list[CorpusRecord],
        schedule: list[ScheduleEntry] | None,
        requests: list[RequestSpec] | None,
        *,
        ladder: bool,
        posts_preload: bool,
        default_model: str | None = None,
    ) -> Inputs:
        """The run's rules applied to inputs already read."""
        if requests is None:
            requests = _prepare(opts, records, default_model)
        if opts.schedule is not None and opts.rate is not None:
            raise ConfigError("give --schedule or --rate, not both", field="--rate")
        rate = None if ladder else opts.rate_rps()  # a share without --capacity is refused here
        sessions = plan_sessions(records, file=opts.corpus)
        if sessions is not None and ladder:
            raise ConfigError(
                "the warmup ladder replays single requests, not a session corpus", field="--corpus"
            )
        if sessions is not None and not sessions[0].graph and opts.history == "live" and opts.api != "auto":
            _check_live_shape(records, opts.api, opts.corpus)
        starts = [records[s.turns[0]] for s in sessions] if sessions is not None else records
        if ladder and (opts.until_precision is not None or opts.max_duration is not None):
            # The ladder's plan decides its stages and their lengths; a run-wide stop would cut a
            # stage short and make its verdict mean nothing.
            flag = "--until-precision" if opts.until_precision is not None else "--max-duration"
            raise ConfigError("does not apply to the warmup ladder (its plan sets the stages)", field=flag)
        plan = None
        if ladder:
            if opts.plan is None:
                raise ConfigError(
                    "the warmup ladder needs a plan", field="--plan", hint="fixtures/plans/tiny.yaml"
                )
            plan = Ladder(read_plan(opts.plan, capacity=opts.capacity))
        elif schedule is None and opts.rate is None and any(r.arrival_offset_s is None for r in starts):
            raise ConfigError(
                "nothing says when to send: give --schedule or --rate, or a corpus with arrival offsets",
                field="--schedule",
            )
        if (
            not ladder
            and opts.rate is not None
            and schedule is None
            and opts.duration is None
            and not opts.max_requests
            and opts.max_duration is None
        ):
            if opts.until_precision is not None:
                raise ConfigError(
                    "--until-precision with --rate needs --max-duration (or --duration) to bound the run",
                    field="--max-duration",
                )
            raise ConfigError(
                "--rate needs --duration (or --max-requests, or --max-duration)", field="--duration"
            )
        if opts.token_counting == "tokenizer" and opts.tokenizer is None:
            raise ConfigError(
                "--token-counting tokenizer needs --tokenizer tokenizer.json", field="--tokenizer"
            )
        preload_file = opts.preload
        if preload_file is None and plan is not None and opts.plan is not None:
            preload_file = plan_preload(plan.plan, opts.plan)
            if posts_preload and preload_file is not None and not preload_file.is_file():
                raise InputError(
                    f"the plan's preload file {preload_file} does not exist", file=opts.plan, field="preload"
                )
        return cls(
            opts,
            records,
            requests,
            schedule,
            plan,
            preload_file,
            sessions,
            rate=rate,
            default_model=default_model,
        )

    def units(self) -> tuple[list[CorpusRecord], list[RequestSpec]]:
        """What one arrival starts: a record and its request, or a session's first turn's."""
        if self.sessions is None:
            return self.records, self.requests
        first = [s.turns[0] for s in self.sessions]
        return [self.records[i] for i in first], [self.requests[i] for i in first]

    def send_window(self) -> float | None:
        """Seconds of schedule to send: ``--duration`` cut by ``--max-duration`` (``None``: all)."""
        o = self.opts
        ends = [d for d in (o.duration, o.max_duration) if d is not None]
        return min(ends) if ends else None

    def ends_by_max_duration(self) -> bool:
        """Whether ``--max-duration`` (not the schedule, ``--duration`` or ``--max-requests``) is what
        ends the arrivals: the run's stop reason says so."""
        o = self.opts
        if o.max_duration is None or self.ladder is not None:
            return False
        if o.duration is not None and o.duration <= o.max_duration:
            return False
        if self.schedule is None and self.rate is not None:
            if o.max_requests is not None and o.arrival == "constant":
                return o.max_requests / self.rate > o.max_duration
            return True
        uncut = self._arrivals(o.duration)
        return any(a.intended_s >= o.max_duration for a in uncut)

    def arrivals_end_s(self) -> float:
        """No arrival of the run is intended later than this (``inf``: open-ended, or not known ahead)."""
        o = self.opts
        window = self.send_window()
        if self.ladder is not None:
            return math.inf
        if self.schedule is None and self.rate is not None:
            ends = [window if window is not None else math.inf]
            if o.max_requests is not None and o.arrival == "constant":
                ends.append((o.max_requests - 1) / self.rate)
            return min(ends)
        return max((a.intended_s for a in self._arrivals(window)), default=0.0)

    def _arrivals(self, duration_s: float | None) -> list[Arrival]:
        """The whole run's arrivals from a schedule or the corpus offsets (not a rate)."""
        o = self.opts
        records, requests = self.units()
        if self.schedule is not None:
            return from_schedule(
                self.schedule,
                requests,
                speedup=o.speedup,
                duration_s=duration_s,
                max_requests=o.max_requests,
            )
        offsets = from_corpus_offsets(
            records,
            requests,
            speedup=o.speedup,
            duration_s=duration_s,
            max_requests=o.max_requests,
        )
        assert offsets is not None  # checked in load()
        return offsets

    def source(self, slot: int, n: int) -> tuple[ArrivalSource, int | None]:
        """This worker's arrival source and how many requests it will send (``None``: open-ended rate;
        for a session corpus, every turn of the sessions its arrivals start)."""
        o = self.opts
        _, requests = self.units()
        if self.ladder is not None:
            return RateArrivals(len(requests), process=o.arrival, slot=slot, n=n, seed=o.seed), None
        window = self.send_window()
        if self.schedule is None and self.rate is not None:
            src = RateArrivals(len(requests), process=o.arrival, slot=slot, n=n, seed=o.seed)
            end = window if window is not None else math.inf
            src.set_segments([Segment(0.0, end, self.rate, None)], final=True)
            if o.max_requests is not None:
                return _Capped(src, o.max_requests, slot, n), None
            return src, None
        arrivals = self._arrivals(window)
        mine = share(arrivals, requests, slot, n)
        if self.sessions is not None:  # what the worker will record: every turn of its sessions
            return ListArrivals(mine), sum(len(self.sessions[a.request].turns) for a in mine)
        return ListArrivals(mine), len(mine)

    def planned(self) -> list[int] | None:
        """The request index of every arrival a one-process run sends, in order (``None`` for the
        ladder, whose arrivals depend on how its stages go). Drains the very source the run uses, so
        a caller planning ahead (``harness run``'s warm probes) follows the same rules."""
        if self.ladder is not None:
            return None
        src, _ = self.source(0, 1)
        out: list[int] = []
        while src.peek() is not None:
            unit = src.pop().request
            out.extend(self.sessions[unit].turns if self.sessions is not None else (unit,))
        return out


def _prepare(opts: LoadOptions, records: list[CorpusRecord], default_model: str | None) -> list[RequestSpec]:
    """The request bodies of ``records`` as ``opts`` shape them, naming ``--model`` or else
    ``default_model``."""
    return prepare_requests(
        records,
        api=opts.api,
        model=opts.model or default_model,
        max_tokens_cap=opts.max_tokens_cap,
        token_counting=opts.token_counting,
        seed_policy=opts.seed_policy,
    )


class _Capped:
    """A rate source cut after ``limit`` arrivals in total (this worker's part of them)."""

    def __init__(self, inner: RateArrivals, limit: int, slot: int, n: int) -> None:
        self.inner = inner
        self.left = limit // n + (1 if slot < limit % n else 0)

    def peek(self) -> float | None:
        return self.inner.peek() if self.left > 0 else None

    def pop(self) -> Any:
        self.left -= 1
        return self.inner.pop()

    def finish(self) -> None:
        self.inner.finish()
