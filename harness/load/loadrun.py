"""One test of one Locust process (:class:`LoadRun`): it starts (epoch, inputs, pacer), records,
ticks and finalizes.

Its parts live beside it: worker messaging and the master's view of its workers in
:mod:`harness.load.messages`, run control (ladder, ``--run-time`` cap, precision stop) in
:mod:`harness.load.control`, the live view in :mod:`harness.load.live`, ``summary.json``'s assembly
in :mod:`harness.load.summary`. Locust's event hooks that create and end it are in
:mod:`harness.load.plugin`.

The master (or the single local process) fixes the run's epoch, ``start_delay`` seconds ahead on the
wall clock, and puts it on ``parsed_options``, which Locust ships to every worker with its spawn
message; each worker converts it to its own monotonic clock. Workers take their share of the
arrivals (see :mod:`harness.load.arrivals`).

The target's own telemetry: the local process or the master also scrapes the target's ``/metrics``
once a second into ``server_metrics.jsonl`` (:mod:`harness.load.telemetry`), takes a last scrape when
it finalizes and puts the counters' deltas per phase in ``summary.json`` (``server_metrics``).

Records flow: a local run writes them itself; workers batch them and send them to the master once a
second (custom message ``harness_records``), with their progress; the master writes the single
``records.jsonl``. A worker the master loses (missed heartbeats) is reported and its share marked
missing in ``summary.json``; the rest of the run goes on, and ends with exit 6 (incomplete: cannot be
judged). Losing the last worker ends the run, its results finalized.

``--until-precision``, ``--run-time`` and the ladder are run control (:mod:`harness.load.control`):
the local process or the master (which holds every record) decides, the shape asks
:meth:`LoadRun.advance` whether the run is over, and the workers apply what the master sends
(:mod:`harness.load.messages`).
"""

from __future__ import annotations

import gc
import logging
import math
import time
import uuid
from pathlib import Path
from typing import Any

import gevent
import locust  # noqa: F401  (patches gevent before requests/urllib3, which the OTLP exporter uses)
import psutil
from locust.env import Environment
from locust.runners import MasterRunner, WorkerRunner

from harness.common.host import HostSampler
from harness.load.arrivals import (
    ArrivalSource,
    RateArrivals,
    bypass_offset,
)
from harness.load.client import IDENTITY_TIMEOUT_S, fetch_identity, fetch_models, model_ids, preload
from harness.load.control import Control
from harness.load.inputs import Inputs
from harness.load.live import Live
from harness.load.liveness import HEALTH_PATHS, HEALTH_TIMEOUT_S, TargetWatch, probe_health
from harness.load.messages import (
    Batch,
    Role,
    Start,
    Workers,
    publish_start,
    read_start,
    ready_workers,
    send_batch,
)
from harness.load.pacer import Pacer
from harness.load.precision import PrecisionTracker, parse_precision_on
from harness.load.results import RECORDS_FILE, RecordWriter, RequestRecord, read_records
from harness.load.run_summary import (
    SUMMARY_FILE,
    RunSummary,
    ServerTelemetry,
    TargetDeath,
    target_identity,
    write_summary,
)
from harness.load.server_metrics import SERVER_METRICS_FILE, run_phases
from harness.load.stream import Tokenize, load_tokenizer
from harness.load.summary import build_summary
from harness.load.telemetry import Scraper
from harness.load.tracing import Tracing

log = logging.getLogger("harness.load")

BATCH_INTERVAL_S = 1.0
"""How often records are flushed (local / master) or sent to the master (worker)."""


def process_role(env: Environment) -> Role:
    if isinstance(env.runner, MasterRunner):
        return "master"
    if isinstance(env.runner, WorkerRunner):
        return "worker"
    return "local"


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
        self.outbox: list[RequestRecord] = []
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
        self.workers = Workers()
        """The master's workers (empty elsewhere)."""
        self.started = False
        """:meth:`start` returned: the epoch is fixed, the pacer and the ladder run. Until then (a
        preload can take seconds) the shape must not judge stages or end the test."""
        self.completed = False
        """Every arrival was sent and answered (or the ladder ended): not interrupted."""
        self.finalized = False
        self.done_sent = False
        self.drain_from: float | None = None
        """``perf_counter`` when the share's last arrival had been taken (the drain timeout runs from it)."""
        self.last_turn_s = -math.inf
        """Session corpora: the latest intended time (s from the epoch) of any turn scheduled so far."""
        self.preload_result: dict[str, int] | None = None
        self.warnings: list[str] = []
        self.scraper: Scraper | None = None
        """Local / master: the target's ``/metrics`` into ``server_metrics.jsonl``."""
        self._proc = psutil.Process()
        self._cpu0 = 0.0
        self._wall0 = 0.0
        self.cpu_pct: float | None = None
        self.host_sampler = HostSampler(env.host) if role != "worker" else None
        """Local / master: how much of the machine other work took during the run (the gates' judge
        of whether a latency is the target's or a neighbour's)."""
        self._ticker: gevent.Greenlet[[], None] | None = None
        self._identity: gevent.Greenlet[[str], dict[str, Any] | None] | None = None
        self.identity: dict[str, Any] | None = None
        """What the target says it is (``GET /v1/models``), once known."""
        self.precision: PrecisionTracker | None = None
        """``--until-precision``: the watched percentiles (local / master: it holds every record)."""
        arrivals_end_s = math.inf
        if self.opts.until_precision is not None and role != "worker":
            arrivals_end_s = inputs.arrivals_end_s()
            self.precision = PrecisionTracker(
                parse_precision_on(self.opts.precision_on),
                self.opts.until_precision,
                confidence=self.opts.precision_confidence,
                min_samples=self.opts.precision_min_samples,
            )
        self.control = Control(
            role=role,
            runner=env.runner,
            ladder=self.ladder,
            precision=self.precision,
            arrivals_end_s=arrivals_end_s,
            now=self.now_s,
            window=self.live.window,
            warnings=self.warnings,
        )
        """The ladder, the ``--run-time`` cap and the precision stop."""
        self._watching: gevent.Greenlet[..., TargetDeath | None] | None = None
        """The health check in progress (it may take seconds; the ticker must not wait for it)."""
        self.watch: TargetWatch | None = None
        """Local / master: whether the target died (:mod:`harness.load.liveness`)."""
        if role != "worker":
            host, creds = env.host or "", self.credentials
            self.watch = TargetWatch(probe=lambda: probe_health(host, creds), on_death=self._target_died)

    # ------------------------------------------------------------------------------------ setup

    def start(self) -> None:
        po = self.env.parsed_options
        assert po is not None  # test_start only fires in a process that parsed its options
        shipped: Start | None = None
        indexes: list[int] | None = None
        if self.role == "worker":
            assert isinstance(self.env.runner, WorkerRunner)
            shipped = read_start(po)
            self.epoch_unix = shipped.epoch_unix
            self.warmup_id = shipped.warmup_id
            self.worker_index = self.env.runner.worker_index
            indexes = shipped.workers
            self.n_slots = len(indexes)
            self.slot = indexes.index(self.worker_index) if self.worker_index in indexes else 0
            self.inputs = self.inputs.with_default_model(shipped.model)
        elif self.opts.model is None:
            # Requests must name a model (the OpenAI API requires one): the target's first, asked
            # once before the epoch, and its answer is the identity too. None listed: none sent.
            models = fetch_models(self.env.host or "", self.credentials)
            self.identity = target_identity(models)
            self.inputs = self.inputs.with_default_model(next(iter(model_ids(models)), None))
        else:
            # Asked once, beside the run (never in its way): what the target says it is.
            self._identity = gevent.spawn(fetch_identity, self.env.host or "", self.credentials)
        if self.role != "worker":
            if self.watch is not None:  # alive at the start: a later death is a death, not "never there"
                watch = self.watch
                gevent.spawn(lambda: watch.note_start(watch.probe()))
            if self.inputs.preload is not None:
                self.preload_result = preload(self.env.host or "", self.inputs.preload, self.credentials)
            self.epoch_unix = time.time() + self.opts.start_delay
            if self.role == "master":
                assert isinstance(self.env.runner, MasterRunner)
                indexes = ready_workers(self.env.runner)
                self.n_slots = len(indexes)
                self.workers = Workers.of(indexes)
        # perf_counter and the wall clock are read together once; from here on only perf_counter.
        self.epoch = time.perf_counter() + (self.epoch_unix - time.time())
        segments = self.ladder.start(0.0) if self.ladder is not None else None
        if self.role != "worker":
            publish_start(
                po,
                epoch_unix=self.epoch_unix,
                warmup_id=self.warmup_id,
                workers=indexes,
                segments=segments if self.role == "master" else None,
                model=self.inputs.default_model,
            )
        if self.role in ("local", "master"):
            self.results_dir.mkdir(parents=True, exist_ok=True)
            (self.results_dir / SUMMARY_FILE).unlink(missing_ok=True)
            self.writer = RecordWriter(self.results_dir / RECORDS_FILE)
            if self.opts.server_metrics_interval > 0:
                self.scraper = Scraper(
                    self.env.host or "",
                    self.credentials,
                    self.results_dir / SERVER_METRICS_FILE,
                    interval_s=self.opts.server_metrics_interval,
                    now=self.now_s,
                    warn=self._warn,
                )
                self.scraper.start()
            if self.host_sampler is not None:  # before the pacer: finding the target's process blocks
                self.host_sampler.start()
        if self.role in ("local", "worker"):
            if self.opts.tokenizer is not None:
                self.tokenize = load_tokenizer(str(self.opts.tokenizer))
            self.tracing = Tracing(
                self.opts.otlp_endpoint,
                resource={"harness.warmup_id": self.warmup_id, "harness.worker": self.worker_index},
            )
            source, self.scheduled = self.inputs.source(self.slot, self.n_slots)
            if self.ladder is not None and isinstance(source, RateArrivals):
                shipped_segs = shipped.segments if shipped is not None else None
                source.set_segments(shipped_segs or self.ladder.segments(), final=False)
            self.source = source
            self.pacer = Pacer(source, lead_s=self.opts.pacer_lead_ms / 1000.0)
            self.control.attach(source, self.pacer)
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

    def _warn(self, msg: str) -> None:
        self.warnings.append(msg)
        log.warning("harness load: %s", msg)

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

    def record(self, rec: RequestRecord) -> None:
        """A finished request (called by the users)."""
        rec.worker = self.worker_index
        if self.role == "worker":
            self.outbox.append(rec)
        else:
            assert self.writer is not None
            self.writer.write(rec)
        self.live.add(rec)
        if self.watch is not None:
            self.watch.add((rec,))
        if self.precision is not None:
            self.precision.add(rec)

    def receive(self, batch: Batch) -> None:
        """Master: a worker's batch of records and its progress."""
        records = batch.records
        if self.writer is not None and not self.finalized:
            self.writer.write_many(records)
        for rec in records:
            self.live.add(rec)
        if self.watch is not None:
            self.watch.add(records)
        if self.precision is not None:
            self.precision.add_many(records)
        self.workers.receive(batch)

    def _send_batch(self, done: bool = False) -> None:
        assert self.env.runner is not None
        records, self.outbox = self.outbox, []
        batch = Batch(
            worker=self.worker_index,
            records=records,
            sent=self.pacer.taken if self.pacer else 0,
            scheduled=self.scheduled,
            cpu_pct=self.measure_cpu(),
            done=done,
        )
        send_batch(self.env.runner, batch)

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
        if self.precision is not None and self.started and not self.finalized:
            self.control.check_precision()
        watch, watching = self.watch, self._watching
        idle = watching is None or watching.ready()  # one health check at a time, beside the ticks
        if watch is not None and self.started and not self.finalized and idle and watch.due():
            self._watching = gevent.spawn(watch.check, self.now_s())

    def _target_died(self, death: TargetDeath) -> None:
        """The target is dead: send nothing more (it could only fail); the run then drains and ends."""
        if not self.finalized:
            self.control.halt(f"target died: {death.evidence}")

    def _share_finished(self) -> bool:
        """This process sent and got back everything it was given (or the drain timeout passed)."""
        p = self.pacer
        if p is None or not p.finished.is_set():
            return False
        if p.drained:
            return True
        now = time.perf_counter()
        if self.drain_from is None:
            self.drain_from = now
        # A session's conversation goes on long after its start (the last arrival): the timeout runs
        # from the latest turn any conversation has scheduled, which moves on while they do, so only a
        # turn that outlives it after the last turn is due is cut, never a conversation still going.
        return now > max(self.drain_from, self.epoch + self.last_turn_s) + self.opts.drain_timeout

    def note_turn(self, intended_s: float) -> None:
        """A session scheduled a turn at ``intended_s`` (s from the epoch): the drain waits for it."""
        self.last_turn_s = max(self.last_turn_s, intended_s)

    def _check_workers(self) -> None:
        runner = self.env.runner
        assert isinstance(runner, MasterRunner)
        for msg in self.workers.check(runner):
            self.warnings.append(msg)
            log.warning("harness load: %s", msg)

    # ------------------------------------------------------------------------------------ control

    def advance(self, elapsed_s: float) -> bool:
        """Local / master, each shape tick: apply the ``--run-time`` cap, step the ladder; whether the
        whole run is done (the shape then ends the test)."""
        if not self.started:
            return False  # before the epoch, "now" means nothing and no stage has begun
        po = self.env.parsed_options
        self.control.cap(elapsed_s, getattr(po, "run_time", None) if po is not None else None)
        self.control.ladder_tick()
        if self.finished():
            self.completed = True
        return self.completed

    def wait_settled(self, timeout_s: float) -> None:
        """Local: block this greenlet until the last request taken has been answered, at most
        ``timeout_s``, so that the shape asks :meth:`finished` the moment the run may be done rather
        than at its next one-second tick (each block of an A/B run, each capacity probe, ended half a
        second late on average). A master returns at once: its workers report once a second anyway."""
        if self.role == "local" and self.pacer is not None:
            self.pacer.settled.wait(timeout_s)

    def finished(self) -> bool:
        """Local / master: is the whole run done (the shape then ends the test)?"""
        if not self.started:
            return False
        if self.ladder is not None and not self.ladder.done:
            return False
        if self.role == "master":
            return self.workers.settled()
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
        # The run's CPU and duration end here: reading the records back for the summary is work
        # after the run, and counting it would call a client busy that was not while it sent.
        cpu = self.measure_cpu()
        interference = None
        if self.host_sampler is not None and self.started:
            interference = self.host_sampler.stop()
            if interference is None and self.host_sampler.hidden_target:
                self._warn(
                    f"what other work took of the machine is not measured: {self.host_sampler.why_not} "
                    "(its CPU would pass for a neighbour's); a latency gate cannot tell a busier machine "
                    "from a regression on this run"
                )
            elif interference is None:
                log.info("harness load: interference not measured: %s", self.host_sampler.why_not)
        if self.role == "master":
            cpu = max([cpu, *self.workers.cpu_pcts()])
        duration = time.perf_counter() - self._wall0  # nor is the identity's wait below the run's
        assert self.writer is not None
        self.writer.close()
        server = self._server_telemetry()
        records = (
            list(read_records(self.results_dir)) if (self.results_dir / RECORDS_FILE).stat().st_size else []
        )
        if self._watching is not None:
            self._watching.join(timeout=2 * HEALTH_TIMEOUT_S * len(HEALTH_PATHS))
        if self.watch is not None and not interrupted:
            self.watch.check(self.now_s(), final=True)  # a run that ended inside a streak: ask once
        identity = self.identity
        if self._identity is not None:
            self._identity.join(timeout=IDENTITY_TIMEOUT_S)
            identity = self._identity.value if self._identity.successful() else None
        summary = build_summary(
            records,
            inputs=self.inputs,
            control=self.control,
            host=self.env.host or "",
            epoch_unix=self.epoch_unix,
            duration_s=duration,
            client_cpu_pct=cpu,
            interrupted=interrupted,
            identity=identity,
            workers=self.workers.shares(),
            warnings=self.warnings,
            warmup_id=self.warmup_id,
            preload=self.preload_result,
            server_metrics=server,
            target_died=self.watch.death if self.watch is not None else None,
            interference=interference,
        )
        write_summary(self.results_dir, summary)
        for w in summary.warnings:
            log.warning("harness load: %s", w)
        log.info("harness load: %d records, summary in %s", summary.requests, self.results_dir / SUMMARY_FILE)
        return summary

    def _server_telemetry(self) -> ServerTelemetry | None:
        """The last scrape, then the counters' deltas per phase (the ladder's stages, else the run)."""
        if self.scraper is None:
            return None
        self.scraper.stop()
        stages = [(a.name, a.started_s, a.ended_s) for a in self.ladder.outcomes()] if self.ladder else None
        return self.scraper.summary(run_phases(self.opts.stage, stages))


# ---------------------------------------------------------------------------------------- process state
