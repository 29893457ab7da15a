"""The load stage inside a Locust process: options, the run's lifecycle, records, distribution.

Importing this module (the locustfiles do, through :mod:`harness.load.user`) registers event
listeners on Locust's global ``events``:

``init_command_line_parser``
    adds the load options (:func:`harness.load.options.add_arguments`).
``init``
    validates the options and input files early (a bad corpus fails before any load, with the
    documented exit code), registers the custom messages, mounts the web UI tab, and makes SIGTERM
    stop the run the way Ctrl-C does (see :func:`_sigterm_as_ctrl_c`).
``test_start``
    builds the :class:`LoadRun` of this process. The master (or the single local process) fixes the
    run's epoch, ``start_delay`` seconds ahead on the wall clock, and puts it on ``parsed_options``,
    which Locust ships to every worker with its spawn message; each worker converts it to its own
    monotonic clock. Workers take their share of the arrivals (see :mod:`harness.load.arrivals`).
``test_stop``
    finalizes: ``records.jsonl`` closed and ``summary.json`` written atomically, marked
    ``interrupted`` unless every arrival was sent and answered (or the ladder ended); the exit code
    goes to ``environment.process_exit_code``.

Records flow: a local run writes them itself; workers batch them and send them to the master once a
second (custom message ``harness_records``), with their progress; the master writes the single
``records.jsonl``. A worker the master loses (missed heartbeats) is reported and its share marked
missing in ``summary.json``; the rest of the run goes on, and ends with exit 6 (incomplete: cannot be
judged). Losing the last worker ends the run, its results finalized.

``--until-precision``: the local process or the master (which holds every record) checks the watched
percentiles once a second (:mod:`harness.load.precision`); when they are precise enough it stops its
pacer, or tells the workers to (custom message ``harness_stop``), and ``summary.json`` says why.
"""

from __future__ import annotations

import gc
import logging
import math
import signal
import sys
import threading
import time
import uuid
from collections import Counter, deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import gevent
import locust  # noqa: F401  (patches gevent before requests/urllib3, which the OTLP exporter uses)
import psutil
from locust import events
from locust.env import Environment
from locust.runners import MasterRunner, WorkerRunner

from harness.common.errors import ExitCode, HarnessError
from harness.common.fingerprint import current_environment
from harness.common.headers import CACHE_STATUSES
from harness.common.stats import Distribution
from harness.load.arrivals import (
    ArrivalSource,
    RateArrivals,
    RequestSpec,
    Segment,
    bypass_offset,
)
from harness.load.client import IDENTITY_TIMEOUT_S, fetch_identity, preload
from harness.load.inputs import Inputs
from harness.load.options import LoadOptions, add_arguments
from harness.load.pacer import Pacer
from harness.load.precision import PrecisionTracker, describe, parse_precision_on
from harness.load.results import (
    RECORDS_FILE,
    SUMMARY_FILE,
    InputRef,
    PrecisionState,
    Recipe,
    RecordWriter,
    RequestRecord,
    RunSummary,
    TargetInfo,
    WorkerShare,
    read_records,
    summarize,
    write_summary,
)
from harness.load.stream import Tokenize, load_tokenizer
from harness.load.tracing import Tracing

log = logging.getLogger("harness.load")

MSG_RECORDS = "harness_records"
MSG_SEGMENTS = "harness_segments"
MSG_STOP = "harness_stop"
"""Master → workers: release no more arrivals (``--until-precision`` was met); in-flight ones drain."""
BATCH_INTERVAL_S = 1.0
LIVE_WINDOW = 5000
"""Records the live view (web UI) keeps: the most recent ones."""
SEGMENT_LEAD_S = 0.5
"""How far ahead the master schedules a ladder change, so every worker has it in time."""

Role = Literal["local", "master", "worker"]


def _worker_index(runner: MasterRunner, client_id: str) -> int:
    return int(runner.get_worker_index(client_id))  # type: ignore[no-untyped-call]


def _role(env: Environment) -> Role:
    if isinstance(env.runner, MasterRunner):
        return "master"
    if isinstance(env.runner, WorkerRunner):
        return "worker"
    return "local"


@dataclass
class Live:
    """What the web UI and the ladder need while the run goes: recent records and per-window counts."""

    recent: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=LIVE_WINDOW))
    outcomes: list[tuple[float, bool]] = field(default_factory=list)
    """``(intended_s, ok)`` of every completed request (the ladder's window statistics)."""
    cache: Counter[str] = field(default_factory=Counter)
    requests: int = 0
    errors: int = 0

    def add(self, row: dict[str, Any]) -> None:
        self.recent.append(row)
        ok = row["error"] is None and 200 <= row["status"] < 300
        self.outcomes.append((row["intended_s"], ok))
        self.requests += 1
        self.errors += not ok
        if row.get("cache"):
            self.cache[row["cache"]] += 1

    def window(self, start_s: float, end_s: float) -> tuple[int, int]:
        completed = failed = 0
        for t, ok in self.outcomes:
            if start_s <= t < end_s:
                completed += 1
                failed += not ok
        return completed, failed

    def distributions(self) -> dict[str, Distribution]:
        out: dict[str, Distribution] = {}
        for name in ("ttft_ms", "tpot_ms", "e2e_ms", "lateness_ms", "ttft_from_intended_ms"):
            out[name] = Distribution.of([r[name] for r in self.recent if r.get(name) is not None])
        out["itl_ms"] = Distribution.of([x for r in self.recent for x in r.get("itl_ms") or ()])
        return out

    def hit_rate(self) -> dict[str, float]:
        told = sum(self.cache.values())
        return {s: self.cache[s] / told for s in CACHE_STATUSES} if told else {}


@dataclass
class WorkerState:
    index: int
    slot: int
    scheduled: int | None = None
    sent: int = 0
    recorded: int = 0
    done: bool = False
    lost: bool = False
    cpu_pct: float | None = None


class LoadRun:
    """One test of one process: inputs, pacer, records, and (local / master) the summary."""

    def __init__(self, env: Environment, inputs: Inputs, role: Role, results_dir: Path) -> None:
        self.env = env
        self.inputs = inputs
        self.opts = inputs.opts
        self.role = role
        self.results_dir = results_dir
        self.ladder = inputs.ladder
        self.live = Live()
        self.pacer: Pacer | None = None
        self.source: ArrivalSource | None = None
        self.writer: RecordWriter | None = None
        self.outbox: list[dict[str, Any]] = []
        self.tracing: Tracing | None = None
        self.tokenize: Tokenize | None = None
        self.epoch_unix = math.nan
        self.epoch = math.nan
        self.warmup_id = self.opts.warmup_id or uuid.uuid4().hex
        self.credentials = self.opts.credentials()
        self.request_headers = self.credentials.request_headers()
        """Added to every request (``--api-key``, ``--header``); never recorded."""
        self.bypass_offset = bypass_offset(self.opts.seed)
        """Start of the bypass sequence (:func:`harness.load.arrivals.bypasses`)."""
        self.worker_index = 0
        self.slot = 0
        self.n_slots = 1
        self.scheduled: int | None = None
        self.workers: dict[int, WorkerState] = {}
        self.started = False
        """:meth:`start` returned: the epoch is fixed, the pacer and the ladder run. Until then (a
        preload can take seconds) the shape must not judge stages or end the test."""
        self.completed = False
        """Every arrival was sent and answered (or the ladder ended): not interrupted."""
        self.finalized = False
        self.done_sent = False
        self.drain_deadline: float | None = None
        self.preload_result: dict[str, int] | None = None
        self.warnings: list[str] = []
        self._proc = psutil.Process()
        self._cpu0 = 0.0
        self._wall0 = 0.0
        self.cpu_pct: float | None = None
        self._ticker: gevent.Greenlet[[], None] | None = None
        self._identity: gevent.Greenlet[[str], dict[str, Any] | None] | None = None
        self.precision: PrecisionTracker | None = None
        """``--until-precision``: the watched percentiles (local / master: it holds every record)."""
        self.stop_reason: str | None = None
        """Why sending stopped early (precision reached), set when it did."""
        self.capped = False
        """``--run-time`` stopped the sending (set by the shape)."""
        self._arrivals_end_s = math.inf
        """No arrival is intended later (a precision met after it did not stop the sending)."""
        if self.opts.until_precision is not None and role != "worker":
            self._arrivals_end_s = inputs.arrivals_end_s()
            self.precision = PrecisionTracker(
                parse_precision_on(self.opts.precision_on),
                self.opts.until_precision,
                confidence=self.opts.precision_confidence,
                min_samples=self.opts.precision_min_samples,
            )

    # ------------------------------------------------------------------------------------ setup

    def start(self) -> None:
        po = self.env.parsed_options
        assert po is not None  # test_start only fires in a process that parsed its options
        if self.role == "worker":
            assert isinstance(self.env.runner, WorkerRunner)
            self.epoch_unix = float(po.harness_epoch)
            self.warmup_id = str(po.harness_warmup_id)
            self.worker_index = self.env.runner.worker_index
            indexes: list[int] = list(po.harness_workers)
            self.n_slots = len(indexes)
            self.slot = indexes.index(self.worker_index) if self.worker_index in indexes else 0
        else:
            # Asked once, beside the run (never in its way): what the target says it is.
            self._identity = gevent.spawn(fetch_identity, self.env.host or "", self.credentials)
            if self.inputs.preload is not None:
                self.preload_result = preload(self.env.host or "", self.inputs.preload, self.credentials)
            self.epoch_unix = time.time() + self.opts.start_delay
            po.harness_epoch = self.epoch_unix
            po.harness_warmup_id = self.warmup_id
            if self.role == "master":
                assert isinstance(self.env.runner, MasterRunner)
                runner = self.env.runner
                ready = runner.clients.ready + runner.clients.running + runner.clients.spawning
                indexes = sorted(_worker_index(runner, c.id) for c in ready)
                po.harness_workers = indexes
                self.n_slots = len(indexes)
                self.workers = {ix: WorkerState(ix, slot) for slot, ix in enumerate(indexes)}
        # perf_counter and the wall clock are read together once; from here on only perf_counter.
        self.epoch = time.perf_counter() + (self.epoch_unix - time.time())
        if self.ladder is not None:
            segments = self.ladder.start(0.0)
            if self.role == "master":
                po.harness_segments = [[s.start_s, s.end_s, s.rate, s.stage] for s in segments]
        if self.role in ("local", "master"):
            self.results_dir.mkdir(parents=True, exist_ok=True)
            (self.results_dir / SUMMARY_FILE).unlink(missing_ok=True)
            self.writer = RecordWriter(self.results_dir / RECORDS_FILE)
        if self.role in ("local", "worker"):
            if self.opts.tokenizer is not None:
                self.tokenize = load_tokenizer(str(self.opts.tokenizer))
            self.tracing = Tracing(
                self.opts.otlp_endpoint,
                resource={"harness.warmup_id": self.warmup_id, "harness.worker": self.worker_index},
            )
            source, self.scheduled = self.inputs.source(self.slot, self.n_slots)
            if self.ladder is not None and isinstance(source, RateArrivals):
                raw = getattr(po, "harness_segments", None)
                segs = (
                    [Segment(a, b, r, s) for a, b, r, s in raw]
                    if self.role == "worker" and raw
                    else self.ladder.segments()
                )
                source.set_segments(segs, final=False)
            self.source = source
            self.pacer = Pacer(source, lead_s=self.opts.pacer_lead_ms / 1000.0)
            # Everything loaded so far (Locust, the corpus, the request bodies) lives for the whole
            # run: collect once now and move it out of the collector's sight, so that a full
            # collection during the run scans only what the run allocates, not the whole process
            # (measured: an early one made a request 5-10 ms late).
            gc.collect()
            gc.freeze()
            self.pacer.start(self.epoch)
        self._cpu0 = self._cpu_s()
        self._wall0 = time.perf_counter()
        self._ticker = gevent.spawn(self._tick_loop)
        self.started = True
        log.info(
            "harness load: %s run %s, epoch in %.2f s, results %s",
            self.role,
            self.warmup_id,
            self.epoch_unix - time.time(),
            self.results_dir,
        )

    def _cpu_s(self) -> float:
        t = self._proc.cpu_times()
        return float(t.user + t.system)

    def measure_cpu(self) -> float:
        """This process's CPU use since the start, %, without the pacer's idle busy-wait."""
        wall = time.perf_counter() - self._wall0
        spin = self.pacer.idle_spin_s if self.pacer is not None else 0.0
        used = max(0.0, self._cpu_s() - self._cpu0 - spin)
        self.cpu_pct = 100.0 * used / wall if wall > 0 else None
        return self.cpu_pct or 0.0

    # ------------------------------------------------------------------------------------ records

    def now_s(self) -> float:
        return time.perf_counter() - self.epoch

    def record(self, row: dict[str, Any]) -> None:
        """A finished request (called by the users)."""
        row["worker"] = self.worker_index
        if self.role == "worker":
            self.outbox.append(row)
        else:
            assert self.writer is not None
            self.writer.write(row)
        self.live.add(row)
        if self.precision is not None:
            self.precision.add(row)

    def receive(self, data: dict[str, Any]) -> None:
        """Master: a worker's batch of records and its progress."""
        ws = self.workers.get(int(data["worker"]))
        rows: list[dict[str, Any]] = data.get("rows") or []
        if self.writer is not None and not self.finalized:
            self.writer.write_many(rows)
        for row in rows:
            self.live.add(row)
        if self.precision is not None:
            self.precision.add_many(rows)
        if ws is not None:
            ws.recorded += len(rows)
            ws.sent = int(data.get("sent", ws.sent))
            sched = data.get("scheduled")
            ws.scheduled = int(sched) if sched is not None else None
            ws.cpu_pct = data.get("cpu_pct")
            ws.done = ws.done or bool(data.get("done"))

    def _send_batch(self, done: bool = False) -> None:
        rows, self.outbox = self.outbox, []
        self.env.runner.send_message(  # type: ignore[union-attr]
            MSG_RECORDS,
            {
                "worker": self.worker_index,
                "rows": rows,
                "sent": self.pacer.taken if self.pacer else 0,
                "scheduled": self.scheduled,
                "cpu_pct": self.measure_cpu(),
                "done": done,
            },
        )

    def _tick_loop(self) -> None:
        while not self.finalized:
            gevent.sleep(BATCH_INTERVAL_S)
            try:
                self.tick()
            except Exception:  # a bug here must not kill the run silently
                log.exception("harness load: tick failed")

    def tick(self) -> None:
        """Once a second: flush / send records; workers report when their share is done."""
        if self.writer is not None:
            self.writer.flush()
        if self.role == "worker" and not self.finalized:
            finished = self._share_finished()
            self._send_batch(done=finished and not self.done_sent)
            if finished:
                self.done_sent = True
        if self.role == "master":
            self._check_workers()
        if self.precision is not None and self.started:
            self.check_precision()

    def check_precision(self) -> bool:
        """Local / master: once every watched percentile is known well enough, stop sending.

        Stopping releases no more arrivals (the pacer's queue of released-but-untaken ones is dropped,
        as at a ``--run-time`` cap); requests in flight drain as usual and the run then completes.
        """
        if self.precision is None or self.stop_reason is not None or self.finalized:
            return self.stop_reason is not None
        if (
            self.capped
            or self.now_s() > self._arrivals_end_s
            or (self.pacer and self.pacer.finished.is_set())
        ):
            return False  # sending already ended (schedule, --max-duration, --run-time): not our doing
        if not self.precision.met():
            return False
        self.stop_reason = (
            f"precision reached: {describe(self.precision.states())} after {max(0.0, self.now_s()):.1f} s"
        )
        log.info("harness load: %s", self.stop_reason)
        if self.role == "master":
            self.env.runner.send_message(MSG_STOP, {"reason": self.stop_reason})  # type: ignore[union-attr]
        else:
            self.stop_sending()
        return True

    def stop_sending(self) -> None:
        """Release no more arrivals (a worker told by the master, or a local run whose precision is met)."""
        if self.pacer is not None and not self.pacer.finished.is_set():
            self.pacer.stop()

    def _share_finished(self) -> bool:
        """This process sent and got back everything it was given (or the drain timeout passed)."""
        p = self.pacer
        if p is None or not p.finished.is_set():
            return False
        if p.drained:
            return True
        if self.drain_deadline is None:
            self.drain_deadline = time.perf_counter() + self.opts.drain_timeout
        return time.perf_counter() > self.drain_deadline

    def _check_workers(self) -> None:
        runner = self.env.runner
        assert isinstance(runner, MasterRunner)
        alive = {_worker_index(runner, c.id) for c in runner.clients.all if c.state not in ("missing",)}
        for ws in self.workers.values():
            if not ws.done and not ws.lost and ws.index not in alive:
                ws.lost = True
                msg = (
                    f"worker {ws.index} was lost; its share is marked missing "
                    f"({ws.recorded} records received)"
                )
                self.warnings.append(msg)
                log.warning("harness load: %s", msg)

    # ------------------------------------------------------------------------------------ control

    def ladder_tick(self) -> None:
        """Local / master: advance the ladder; push changed segments to the pacer or the workers."""
        if not self.started or self.ladder is None or self.ladder.done:
            return  # before the epoch, "now" means nothing and no stage has begun
        now = self.now_s()
        changed = self.ladder.tick(now, self.live.window)
        if changed is None and not self.ladder.done:
            return
        segs = changed if changed is not None else []
        if self.ladder.done and not changed:
            segs = []
        final = self.ladder.done or self.ladder.stopped
        if self.role == "master":
            self.env.runner.send_message(  # type: ignore[union-attr]
                MSG_SEGMENTS,
                {"segments": [[s.start_s, s.end_s, s.rate, s.stage] for s in segs], "final": final},
            )
        else:
            self.apply_segments(segs, final=final)

    def apply_segments(self, segs: list[Segment], *, final: bool) -> None:
        if isinstance(self.source, RateArrivals) and self.pacer is not None:
            self.source.set_segments(segs, final=final)
            self.pacer.changed()

    def finished(self) -> bool:
        """Local / master: is the whole run done (the shape then ends the test)?"""
        if not self.started:
            return False
        if self.ladder is not None and not self.ladder.done:
            return False
        if self.role == "master":
            return all(ws.done or ws.lost for ws in self.workers.values())
        return self._share_finished()

    def users(self) -> int:
        """Users for the shape: the concurrency pool of every process."""
        return self.opts.concurrency * max(1, self.n_slots)

    # ------------------------------------------------------------------------------------ finalize

    def finalize(self) -> RunSummary | None:
        """Local / master: close the records and write ``summary.json`` (atomically). Idempotent."""
        if self.finalized:
            return None
        self.finalized = True
        if self.pacer is not None:
            self.pacer.stop()
        if self.tracing is not None:
            self.tracing.shutdown()
        if self.role == "worker":
            self._send_batch(done=True)
            return None
        if self.role == "master":
            # Locust stops the test itself when its last worker goes missing, before a tick noticed:
            # such a run ended because every share is done or lost, not because someone stopped it.
            self._check_workers()
            self.completed = self.completed or (self.started and self.finished())
        interrupted = not self.completed
        if self.ladder is not None:
            if interrupted:
                self.ladder.interrupt(self.now_s())
            for a in self.ladder.attempts:  # final counts: requests that completed after the verdict too
                a.requests, a.errors = self.live.window(a.start_s, a.end_s)
        assert self.writer is not None
        self.writer.close()
        records = (
            list(read_records(self.results_dir)) if (self.results_dir / RECORDS_FILE).stat().st_size else []
        )
        cpu = self.measure_cpu()
        if self.role == "master":
            worker_cpu = [w.cpu_pct for w in self.workers.values() if w.cpu_pct is not None]
            cpu = max([cpu, *worker_cpu])
        o = self.opts
        duration = time.perf_counter() - self._wall0
        target_rate = None
        if self.ladder is None and o.rate is not None:
            target_rate = o.rate
        elif self.ladder is None and records:
            span = max(r.intended_s for r in records) - min(r.intended_s for r in records)
            target_rate = (len(records) - 1) / span if span > 0 else None
        identity = None
        if self._identity is not None:
            self._identity.join(timeout=IDENTITY_TIMEOUT_S)
            identity = self._identity.value if self._identity.successful() else None
        workers = [
            WorkerShare(
                worker=w.index,
                scheduled=w.scheduled if w.scheduled is not None else w.recorded,
                recorded=w.recorded,
                missing=w.lost,
            )
            for w in self.workers.values()
        ]
        api: Literal["chat", "completions"] = (
            ("chat" if o.api == "chat" else "completions")
            if o.api != "auto"
            else _api_of(self.inputs.requests)
        )
        corpus = InputRef.of(_corpus_file(o.corpus)) if o.corpus else None
        schedule = InputRef.of(o.schedule) if o.schedule else None
        precision = self._final_precision(records)
        summary = summarize(
            records,
            started_at=datetime.fromtimestamp(self.epoch_unix, UTC).isoformat(),
            duration_s=duration,
            target=TargetInfo(url=self.env.host or "", model=o.model, api=api, identity=identity),
            target_rate=target_rate,
            client_cpu_pct=cpu,
            interrupted=interrupted,
            corpus=corpus,
            schedule=schedule,
            stages=self.ladder.outcomes() if self.ladder is not None else None,
            workers=workers,
            warnings=self.warnings,
            warmup_id=self.warmup_id,
            plan=InputRef.of(o.plan) if o.plan and self.ladder is not None else None,
            preload=self.preload_result,
            environment=current_environment(),
            recipe=recipe_of(o, api=api, corpus=corpus, schedule=schedule),
            stop_reason=self._final_stop_reason(interrupted, precision),
            precision=precision,
        )
        write_summary(self.results_dir, summary)
        for w in summary.warnings:
            log.warning("harness load: %s", w)
        log.info("harness load: %d records, summary in %s", summary.requests, self.results_dir / SUMMARY_FILE)
        return summary

    def _final_precision(self, records: list[RequestRecord]) -> dict[str, PrecisionState] | None:
        """The watched percentiles over every record of the run (requests that completed after the
        decision too), from the records file, so it agrees with the summary's metrics."""
        if self.precision is None:
            return None
        final = PrecisionTracker(
            self.precision.targets,
            self.precision.rel_target,
            confidence=self.precision.confidence,
            min_samples=self.precision.min_samples,
        )
        names = {t.field for t in final.targets}
        final.add_many(
            {"status": r.status, "error": r.error, **{f: getattr(r, f) for f in names}} for r in records
        )
        return final.states()

    def _final_stop_reason(
        self, interrupted: bool, precision: dict[str, PrecisionState] | None
    ) -> str | None:
        o = self.opts
        if o.until_precision is None and o.max_duration is None:
            return None
        if self.stop_reason is not None:
            return self.stop_reason
        short = ""
        if precision is not None and not all(s.met for s in precision.values()):
            short = f" before precision: {describe(precision)}"
        if self.capped:
            return f"--run-time reached{short}"
        if interrupted:
            return f"interrupted{short}"
        if self.inputs.ends_by_max_duration():
            return f"max duration {o.max_duration:g} s reached{short}"
        return f"schedule ended{short}"


def recipe_of(o: LoadOptions, *, api: str, corpus: InputRef | None, schedule: InputRef | None) -> Recipe:
    """The load a run offered, from its options (``summary.json``: ``recipe``)."""
    return Recipe(
        corpus_sha256=corpus.sha256 if corpus else None,
        schedule_sha256=schedule.sha256 if schedule else None,
        rate=o.rate,
        rate_of_capacity=round(o.rate / o.capacity, 4) if o.rate is not None and o.capacity else None,
        arrival=o.arrival if o.rate is not None else None,
        duration=o.duration,
        max_requests=o.max_requests,
        max_tokens_cap=o.max_tokens_cap,
        api=api,
        speedup=o.speedup,
        concurrency=o.concurrency,
        seed=o.seed if o.rate is not None and o.arrival == "poisson" else None,
        bypass_fraction=o.bypass_fraction,
    )


def _corpus_file(p: Path) -> Path:
    return p / "corpus.jsonl" if p.is_dir() else p


def _api_of(requests: list[RequestSpec]) -> Literal["chat", "completions"]:
    return "chat" if requests and requests[0].path.endswith("chat/completions") else "completions"


# ---------------------------------------------------------------------------------------- process state


class _State:
    run: LoadRun | None = None
    runs: int = 0
    """Tests started in this process (a web UI session may run several)."""


STATE = _State()


def current() -> LoadRun | None:
    """The run of this process, once its test started."""
    return STATE.run


def _results_dir(base: Path, n: int) -> Path:
    # A second test in the same process (web UI) must not overwrite the first one's results.
    return base if n <= 1 else base.with_name(f"{base.name}-{n}")


def _is_ladder(env: Environment) -> bool:
    return bool(getattr(env.shape_class, "ladder", False))


def _fail(env: Environment, exc: HarnessError) -> None:
    log.error("harness: error: %s", exc)
    env.process_exit_code = int(exc.exit_code)
    if env.runner is not None:
        gevent.spawn(env.runner.quit)


def _on_parser(parser: Any, **_kw: Any) -> None:
    add_arguments(parser)


def _on_init(environment: Environment, **_kw: Any) -> None:
    env = environment
    if env.parsed_options is None:
        return
    role = _role(env)
    if role != "worker" and getattr(env.parsed_options, "corpus", None):
        try:  # fail before any load, with the documented exit code
            Inputs.load(LoadOptions.from_namespace(env.parsed_options), ladder=_is_ladder(env))
        except HarnessError as exc:
            sys.stderr.write(f"harness: error: {exc}\n")
            sys.exit(int(exc.exit_code))
    if role != "worker" and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _sigterm_as_ctrl_c)
    if env.runner is not None and role == "master":
        env.runner.register_message(MSG_RECORDS, _on_records)
    if env.runner is not None and role == "worker":
        env.runner.register_message(MSG_SEGMENTS, _on_segments)
        env.runner.register_message(MSG_STOP, _on_stop)
    if env.web_ui is not None:
        from harness.load.web import mount

        mount(env)


def _sigterm_as_ctrl_c(signum: int, frame: object) -> None:
    """SIGTERM raises KeyboardInterrupt, as Ctrl-C does: the run stops, finalized, exit 130.

    Headless, Locust installs its own SIGTERM handler only after a ``LoadTestShape`` run has
    returned; until then SIGTERM (a CI job's timeout, ``kill``, a launcher whose child inherited
    SIGINT ignored) would end the process where it stood, with no ``summary.json``. Locust's later
    handler, where it installs one, replaces this one and also shuts down gracefully.
    """
    raise KeyboardInterrupt


def _on_records(environment: Environment, msg: Any, **_kw: Any) -> None:
    run = STATE.run
    if run is not None:
        run.receive(msg.data)


def _on_segments(environment: Environment, msg: Any, **_kw: Any) -> None:
    run = STATE.run
    if run is not None:
        segs = [Segment(a, b, r, s) for a, b, r, s in msg.data["segments"]]
        run.apply_segments(segs, final=bool(msg.data["final"]))


def _on_stop(environment: Environment, msg: Any, **_kw: Any) -> None:
    run = STATE.run
    if run is not None:
        run.stop_reason = str(msg.data.get("reason") or "stopped by the master")
        run.stop_sending()


def _on_test_start(environment: Environment, **_kw: Any) -> None:
    env = environment
    role = _role(env)
    try:
        opts = LoadOptions.from_namespace(env.parsed_options)
        inputs = Inputs.load(opts, ladder=_is_ladder(env), posts_preload=role != "worker")
    except HarnessError as exc:
        STATE.run = None
        _fail(env, exc)
        return
    STATE.runs += 1
    run = LoadRun(env, inputs, role, _results_dir(opts.results_dir, STATE.runs))
    STATE.run = run
    try:
        run.start()
    except HarnessError as exc:
        STATE.run = None
        _fail(env, exc)


def _on_test_stop(environment: Environment, **_kw: Any) -> None:
    run = STATE.run
    if run is None:
        return
    summary = run.finalize()
    if summary is None:
        return
    if summary.interrupted:
        environment.process_exit_code = int(ExitCode.INTERRUPTED)
    elif any(w.missing for w in summary.workers):
        # A share of the schedule was never sent: what was measured is not the load asked for.
        environment.process_exit_code = int(ExitCode.UNJUDGEABLE)
    elif run.ladder is not None:
        environment.process_exit_code = int(ExitCode.CHECK_FAILED if run.ladder.stopped else ExitCode.OK)


def _on_quitting(environment: Environment, **_kw: Any) -> None:
    # Ctrl-C / SIGTERM while the test still runs: the exit code is read right after this event,
    # before the runner stops (test_stop then writes the summary marked interrupted).
    run = STATE.run
    if run is not None and not run.finalized and not run.completed:
        environment.process_exit_code = int(ExitCode.INTERRUPTED)


# Locust's EventHook is untyped; registered once, when a locustfile imports the load stage.
for _hook, _listener in (
    (events.init_command_line_parser, _on_parser),
    (events.init, _on_init),
    (events.test_start, _on_test_start),
    (events.test_stop, _on_test_stop),
    (events.quitting, _on_quitting),
):
    _hook.add_listener(_listener)  # type: ignore[no-untyped-call]


def results_path(env: Environment) -> Path | None:
    """Where the current run writes (for the web UI)."""
    run = STATE.run
    return run.results_dir if run is not None else None
