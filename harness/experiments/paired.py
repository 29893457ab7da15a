"""``harness run``: one paired cold / warm run, the command a CI job calls.

The same schedule is replayed twice against one target, and both result sets are handed to the
gates:

1. **check** every input before anything starts (corpus, schedule, plan, preload file, baseline,
   the load options and ``--serve-args``): a mistake costs milliseconds (exit 2–4), not a model load;
2. **target**: start ``harness serve SERVE_ARGS`` (a child process on a free port, its log and cache
   state under ``OUT/server/``) or use ``--url`` (any OpenAI-compatible server);
3. **flush** every cache level the target exposes (:data:`harness.experiments.target.FLUSH_LEVELS`: the
   response tiers and Bloom, the KV prefix cache); a level that answers 404 is named and skipped;
4. **cold**: replay the schedule (headless Locust, :func:`harness.load.runner.run_locust`) → ``OUT/cold``;
5. **warm up**: ``POST /cache/preload`` with ``--preload``, then the warmup ladder ``--plan``
   → ``OUT/ladder``;
6. **warm check** (:mod:`harness.experiments.warmcheck`): embedding → KV → response, the warm rate of
   probe requests, the verdict → ``OUT/warm-check.json``;
7. **warm**: the same schedule again → ``OUT/warm``; the server is stopped (with
   ``--until-precision`` each phase stops on its own once its watched percentiles are precise
   enough, so the two phases may send different numbers of the same planned requests);
8. **compare** (:mod:`harness.gates.compare`) → ``OUT/comparison.json``, and with ``--gate FILE``
   judge both phases (labels ``cold`` and ``warm``, :func:`harness.gates.gate_runs`) →
   ``OUT/gate.junit.xml``, ``OUT/gate.json``.

**Load relative to capacity.** ``--rate 50%`` (:attr:`PairedSpec.rate_share`) and ladder plans whose
stages give ``qps: 50%`` need the target's capacity: ``--capacity N``, or else it is measured first,
against the same target, by :class:`harness.experiments.capacity.CapacityRunner` (results under
``OUT/capacity/``), before the caches are flushed. The capacity and the absolute rate it gave are in
``run.json`` (``capacity``); a target that meets the capacity SLO at no rate cannot be loaded to a share
of it (exit 6).

``OUT/run.json`` (:class:`PairedRun`) is rewritten atomically after every step, so an interrupted
or failed run still says how far it got. Exit codes (:func:`exit_code_of`): 0 pass; 1 a gate proved
a regression; 6 the warm phase could not be called warm or a gate could not judge; 3/4/5 bad input,
bad configuration, target unavailable; 130 interrupted (Ctrl-C or SIGTERM: the running phase is
finalized, the server stopped, ``run.json`` written).

Locust runs in its own process (gevent never runs in this one); this process only polls the
results file for the progress bar.

The module holds the steps (:class:`PairedRunner`); what a run is configured with and the checks of
step 1 are :mod:`harness.experiments.paired_spec`, ``run.json`` and the layout of ``OUT``
:mod:`harness.experiments.paired_record`.
"""

from __future__ import annotations

import dataclasses
import shlex
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.markup import escape

from harness.common import console as cons
from harness.common.errors import ExitCode, HarnessError, TargetDied, UnavailableError
from harness.common.io import write_json
from harness.experiments.driver import (
    ERRORS_BY_CODE,
    Ui,
    clear_out_dir,
    log_tail,
    open_target,
    sigterm_interrupts,
)
from harness.experiments.paired_record import (
    CAPACITY_DIR,
    COMPARISON_FILE,
    JUNIT_FILE,
    OUTPUTS,
    RUN_FILE,
    SERVER_DIR,
    VERDICT_FILE,
    WARM_CHECK_FILE,
    CapacityRecord,
    FlushRecord,
    GateRecord,
    PairedRun,
    PhaseRecord,
    TargetRecord,
    exit_code_of,
)
from harness.experiments.paired_spec import PairedSpec, Prepared, prepare
from harness.experiments.recipe import write_recipe
from harness.experiments.target import Target, flush_all
from harness.experiments.warmcheck import check_warm
from harness.gates.compare import Comparison
from harness.gates.judge import GateReport
from harness.load.arrivals import RequestSpec
from harness.load.results import RECORDS_FILE, read_summary
from harness.load.runner import LoadSpec, run_locust
from harness.load.target import NotExposed

# ------------------------------------------------------------------------------------------ running


class PairedRunner:
    """Runs one :class:`PairedSpec` (see the module docstring); :meth:`run` returns the record."""

    def __init__(self, spec: PairedSpec, console: Console | None = None) -> None:
        self.spec = spec
        # Absolute: the server runs in its log directory, so a relative ready-file path given to it
        # would be resolved there (harness.server.launch passes the path through as it is).
        self.out = spec.out.resolve()
        self.ui = Ui(console or cons.err())
        self.record = PairedRun(started_at=datetime.now(UTC).isoformat(), out=str(spec.out))
        self.gate_report: GateReport | None = None
        self.comparison: Comparison | None = None

    def save(self) -> None:
        write_json(self.out / RUN_FILE, self.record.model_dump(mode="json"))

    def run(self) -> PairedRun:
        """Check, start, flush, cold, warm up, check warm, warm, compare, gate; ``run.json`` after each."""
        spec = self.spec
        prep = prepare(spec)
        if spec.force:
            clear_out_dir(self.out, OUTPUTS)
        self.out.mkdir(parents=True, exist_ok=True)
        self.record.inputs = prep.refs
        self._record_load()
        write_recipe(self.out, spec.recipe, source=spec.source)
        self.save()
        try:
            with sigterm_interrupts(), self.ui.progress, self._target(prep) as target:
                if spec.needs_capacity():
                    self._resolve_capacity(target, prep)
                self._measure(target, prep)
        except KeyboardInterrupt:
            self.record.interrupted = True
            self.record.exit_code = int(ExitCode.INTERRUPTED)
            self.record.message = "interrupted: the running phase was finalized and the server stopped"
            self.record.finished_at = datetime.now(UTC).isoformat()
            self.save()
            raise
        except HarnessError as exc:
            self.record.exit_code = int(exc.exit_code)
            self.record.message = str(exc)
            self.record.finished_at = datetime.now(UTC).isoformat()
            self.save()
            raise
        self._judge()
        self.record.finished_at = datetime.now(UTC).isoformat()
        self.save()
        return self.record

    # ---- steps ---------------------------------------------------------------------------------

    def _record_load(self) -> None:
        opts = self.spec.load.options
        args = opts.to_args()
        at = args.index("--out") if "--out" in args else -1
        access = opts.credentials().describe()  # which are set, never the values
        self.record.load = {"args": args[:at] + args[at + 2 :] if at >= 0 else args, "access": access}

    def _resolve_capacity(self, target: Target, prep: Prepared) -> None:
        """Measure the capacity (unless ``--capacity`` gave it), then turn ``--rate N%`` into a rate and
        hand the capacity to the ladder; before the flush, so the cold phase is still cold."""
        from harness.common.errors import CannotJudge
        from harness.experiments.capacity import CapacityRunner, CapacitySpec
        from harness.load.plan import read_plan

        spec = self.spec
        cap, source = spec.capacity, "given"
        record = CapacityRecord(capacity_rps=0.0, source="given", rate_share=spec.rate_share)
        if cap is None:
            source = "measured"
            cspec = CapacitySpec(spec.recipe, out=self.out / CAPACITY_DIR)
            slo = spec.recipe.capacity.slo
            self.ui.say(f"[dim]measuring capacity first (SLO {escape(slo)}) → {cspec.out}[/]")
            result = CapacityRunner(cspec, ui=self.ui).measure(target, requests=prep.inputs.requests)
            cap = result.capacity_rps
            record = CapacityRecord(
                capacity_rps=cap, source="measured", low=result.low, high=result.high, bounded=result.bounded,
                file=str(cspec.out / "capacity.json"), rate_share=spec.rate_share,
            )  # fmt: skip
            if cap <= 0:
                self.record.capacity = record
                raise CannotJudge(
                    f"no rate meets the capacity SLO, so a share of capacity means nothing: {result.reason}",
                    file=cspec.out / "capacity.json",
                )
        assert cap is not None
        shares = spec.plan_shares()
        # The phases' recipes record the share (summary.json: recipe.rate_of_capacity), which a
        # baseline compares instead of the absolute rate (spec.load keeps the capacity for shares).
        if spec.capacity != cap:  # measured: the phases' options change (else they were made already)
            self.spec = spec = dataclasses.replace(spec, recipe=spec.recipe.with_load(capacity=cap))
        load = spec.load
        rate_rps = load.options.rate_rps() if spec.rate_share is not None else None
        record = record.model_copy(
            update={"capacity_rps": cap, "source": source, "rate_rps": rate_rps, "plan_shares": shares}
        )
        self.record.capacity = record
        # What the phases send follows from the rate now known (the corpus read once, in prepare).
        prep.inputs = prep.inputs.with_options(load.options)
        prep.planned = prep.inputs.planned() or []
        if spec.plan is not None:
            plan = read_plan(spec.plan, capacity=cap)
            prep.ladder_requests = round(sum(s.qps * s.duration_s for s in plan.stages))
        self._record_load()
        write_recipe(self.out, spec.recipe, source=spec.source)
        self.save()
        at_least = "at least " if record.bounded is False else ""
        rate = f": --rate {spec.rate_share:.0%} → {rate_rps:g} req/s" if rate_rps is not None else ""
        ladder = "; the ladder's stages in shares of it" if shares else ""
        self.ui.say(f"[green]✓[/] capacity {at_least}{cap:.4g} req/s ({source}){rate}{ladder}")

    @contextmanager
    def _target(self, prep: Prepared) -> Iterator[Target]:
        spec = self.spec
        log_dir = self.out / SERVER_DIR
        creds = spec.load.options.credentials()
        with open_target(
            spec.recipe.target.url,
            prep.serve_args,
            log_dir,
            self.ui,
            spec.server_timeout_s,
            credentials=creds,
        ) as target:
            started = target.server is not None
            # The probes and the capacity calibration send from here: the same model the phases'
            # Locust processes will ask the target for, when --model names none.
            prep.inputs = prep.inputs.with_default_model(target.model)
            self.record.target = TargetRecord(
                url=target.url, model=target.model, started=started,
                serve_args=list(prep.serve_args or ()) if started else None,
                log=str(log_dir / "server.log") if started else None,
            )  # fmt: skip
            self.save()
            yield target

    def _measure(self, target: Target, prep: Prepared) -> None:
        spec = self.spec
        with self.ui.step("flushing every cache level"):
            flushed = flush_all(target.client)
        self.record.flush = [FlushRecord.of(f) for f in flushed]
        self.record.skipped_levels = [f.level for f in flushed if f.status == "not exposed"]
        for f in flushed:
            mark = "[green]✓[/] flushed" if f.status == "flushed" else "[yellow]–[/] not flushed:"
            self.ui.say(f"{mark} {escape(f.detail)}")
        self.save()

        # The phases' own admin call (a plan's preload) uses the target's token: a server started
        # here has one only this run knows.
        replay = spec.load.replace(host=target.url, admin_token=target.credentials.admin_token)
        cold = replay.replace(stage="cold", **prep.phase_load.get("cold", {}))
        self._phase("cold", cold, len(prep.planned))
        if spec.preload is not None:
            self._preload(target, spec.preload)
        if spec.plan is not None:
            ladder = replay.replace(
                locustfile="warmup", plan=spec.plan, capacity=spec.capacity, stage=None, schedule=None,
                rate=None, duration=None,
                max_requests=None, speedup=None, until_precision=None, max_duration=None, precision_on=None,
                precision_confidence=None, precision_min_samples=None,
            )  # fmt: skip
            self._phase("ladder", ladder, prep.ladder_requests)
        sample = self._probe_sample(prep)
        with self.ui.step(f"warm check: {len(sample)} probe requests"):
            check = check_warm(
                target.client, sample, min_warm_rate=spec.recipe.warmup.min_warm_rate,
                confidence=spec.confidence, concurrency=min(4, spec.load.options.concurrency),
            )  # fmt: skip
        write_json(self.out / WARM_CHECK_FILE, check.model_dump(mode="json"))
        self.record.warm_check = check.model_copy(update={"probes": []})  # the probes are in warm-check.json
        for lv in check.levels:
            colour = {"warm": "green", "partial": "yellow", "cold": "red", "skipped": "dim"}[lv.status]
            self.ui.say(f"  [{colour}]{lv.level:<9} {lv.status:<8}[/] {escape(lv.detail)}")
        if check.warm:
            self.ui.say(f"[green]✓[/] {escape(check.reason)}")
        else:
            self.ui.say(f"[bold red]✗ not calling this run warm[/]: {escape(check.reason)} (measured anyway)")
        self.save()
        warm = replay.replace(stage="warm", **prep.phase_load.get("warm", {}))
        self._phase("warm", warm, len(prep.planned))

    def _probe_sample(self, prep: Prepared) -> list[RequestSpec]:
        """A seeded sample of the distinct requests the warm phase will send."""
        distinct = list(dict.fromkeys(prep.planned))
        k = min(self.spec.recipe.warmup.probes, len(distinct))
        rng = np.random.default_rng(self.spec.seed)
        picked = sorted(rng.choice(len(distinct), size=k, replace=False).tolist())
        return [prep.inputs.requests[distinct[i]] for i in picked]

    def _preload(self, target: Target, path: Path) -> None:
        with self.ui.step(f"preloading {path.name}"):
            try:
                answer = target.client.cache_preload(path)
            except NotExposed as exc:
                self.record.preload = {"skipped": f"the target has no response cache to preload ({exc})"}
                self.ui.say(f"[yellow]–[/] preload skipped: {escape(str(exc))}")
            else:
                self.record.preload = answer
                self.ui.say(f"[green]✓[/] preloaded: {escape(str(self.record.preload))}")
        self.save()

    def _phase(self, name: str, load: LoadSpec, total: int | None) -> None:
        results = self.out / name
        load = load.replace(results_dir=results)
        started = time.monotonic()
        self.ui.say(f"[dim]$ locust {escape(shlex.join(load.command()[3:]))}[/]")
        try:
            with self.ui.phase(f"{name} phase", results / RECORDS_FILE, total):
                code = run_locust(load, timeout_s=self.spec.recipe.phase_timeout)
        except KeyboardInterrupt:  # run_locust let the child finalize its results first
            self._note_phase(name, results, int(ExitCode.INTERRUPTED), started)
            raise
        rec = self._note_phase(name, results, code, started)
        summary_path = results / "summary.json"
        log = results / "locust.log"
        if code == int(ExitCode.TARGET_DIED) and summary_path.exists():
            died = read_summary(results).target_died
            if died is not None:  # the summary says what died and when; the log's tail may not
                raise TargetDied(f"the {name} phase: {died.describe()}", file=summary_path)
        if code in ERRORS_BY_CODE:
            raise ERRORS_BY_CODE[code](f"the {name} phase exited with {code}: {log_tail(log)}", file=log)
        if code == int(ExitCode.INTERRUPTED):
            raise UnavailableError(
                f"the {name} phase did not end within {self.spec.recipe.phase_timeout:g} s and was stopped",
                file=log,
                hint="a larger --phase-timeout, or a shorter schedule",
            )
        if not summary_path.exists():
            raise UnavailableError(
                f"the {name} phase wrote no summary (exit {code}): {log_tail(log)}", file=log
            )
        mark, extra = "[green]✓[/]", ""
        if code:  # 1: requests failed, or the ladder stopped on a failed stage; the gate judges errors
            mark, extra = "[yellow]![/]", f" (exit {code}: see {log})"
        self.ui.say(
            f"{mark} {name}: {rec.requests} requests, {rec.errors} errors{extra}"
            + (", client-bound" if rec.client_bound else "")
            + f" → {results}"
        )
        if rec.stop_reason:
            self.ui.say(f"  [dim]{escape(rec.stop_reason)}[/]")

    def _note_phase(self, name: str, results: Path, code: int, started: float) -> PhaseRecord:
        """Record a finished (or interrupted) phase in ``run.json``, with its summary's counts."""
        rec = PhaseRecord(dir=str(results), exit_code=code, seconds=round(time.monotonic() - started, 3))
        if (results / "summary.json").exists():
            s = read_summary(results)
            rec = rec.model_copy(
                update={"requests": s.requests, "errors": s.errors, "interrupted": s.interrupted,
                        "client_bound": s.client_bound, "stop_reason": s.stop_reason}
            )  # fmt: skip
        self.record.phases[name] = rec
        self.save()
        return rec

    def _judge(self) -> None:
        from harness.gates import gate_runs
        from harness.gates.compare import compare
        from harness.gates.runs import load_result_set

        cold, warm = self.out / "cold", self.out / "warm"
        cmp = compare(
            load_result_set(cold, "cold"), load_result_set(warm, "warm"), confidence=self.spec.confidence
        )
        write_json(self.out / COMPARISON_FILE, cmp.model_dump(mode="json"))
        self.record.comparison = str(self.out / COMPARISON_FILE)
        self.comparison = cmp
        if self.spec.gate is not None:
            junit, verdict = self.out / JUNIT_FILE, self.out / VERDICT_FILE
            self.gate_report = gate_runs(
                {"cold": cold, "warm": warm}, self.spec.gate, junit=junit, json_path=verdict
            )
            self.record.gate = GateRecord(
                verdict=self.gate_report.verdict, exit_code=self.gate_report.exit_code,
                headline=self.gate_report.headline(), junit=str(junit), verdict_json=str(verdict),
            )  # fmt: skip
        code, message = exit_code_of(self.record.warm_check, self.gate_report)
        self.record.exit_code, self.record.message = int(code), message
