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

**Errors are judged, never hidden.** A target that answers errors is failed on its error rate however
the run got there. The capacity search and the warm check count the errors they saw (with the exact
interval) instead of calling the target unreachable (exit 5 is a target that answered nothing); with
``--gate``, the baseline's ``error_rate`` gates are judged on those counts right away, by the gates'
own rule (:func:`judge_errors`), and one proven exceeded ends the run with exit 1 naming it
(``gate.json``, ``gate.junit.xml`` as a gated run writes them) before the next phase is sent. Errors
that prove nothing go on, named in the message the run ends with.

``OUT/run.json`` (:class:`PairedRun`) is rewritten atomically after every step, so an interrupted
or failed run still says how far it got. Exit codes (:func:`exit_code_of`): 0 pass; 1 a gate proved
a regression (the errors before the phases included); 6 the warm phase could not be called warm or a
gate could not judge; 3/4/5 bad input, bad configuration, target unavailable; 130 interrupted
(Ctrl-C or SIGTERM: the running phase is finalized, the server stopped, ``run.json`` written).

Locust runs in its own process (gevent never runs in this one); this process only polls the
results file for the progress bar.

The module holds the steps (:class:`PairedRunner`); what a run is configured with and the checks of
step 1 are :mod:`harness.experiments.paired_spec`, ``run.json`` and the layout of ``OUT``
:mod:`harness.experiments.paired_record`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.markup import escape

from harness.common import console as cons
from harness.common.errors import CheckFailed, ExitCode, HarnessError
from harness.common.io import write_json
from harness.experiments.capacity_result import ErrorCount
from harness.experiments.driver import (
    Ui,
    clear_out_dir,
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
from harness.experiments.phase import PhaseResult, run_phase
from harness.experiments.recipe import write_recipe
from harness.experiments.target import Target, flush_all
from harness.experiments.warmcheck import check_warm
from harness.gates.compare import Comparison
from harness.gates.judge import GateReport
from harness.gates.metrics import format_value
from harness.load.arrivals import RequestSpec
from harness.load.runner import LoadSpec
from harness.load.target import NotExposed

# ------------------------------------------------------------------------------------------ errors


def judge_errors(baseline: Path, label: str, seen: ErrorCount, where: Path) -> GateReport | None:
    """The baseline's ``error_rate`` gates judged on errors counted outside the phases (the capacity
    search's, the warm check's probes), by the gates' own rule and exact test
    (:func:`harness.gates.judge.judge`) on a result set labelled ``label`` of ``seen.requests``
    requests, ``seen.errors`` of them failed; ``None`` when no gate applies.

    Every at-most ``error_rate`` gate applies whatever its phase: the error rate is the target's, and
    these requests went to the same target (gates with one limit and ``detect`` are judged once). A
    gate that selects a scenario or a stage does not: it judges part of a phase's traffic, and these
    counts are of the whole. ``min_samples`` is lifted to 1: it keeps a run too small to see the
    regression from *passing*; a count that proves the limit exceeded proves it at any size, and only
    a fail is acted on (:meth:`PairedRunner._judge_errors`)."""
    import numpy as np

    from harness.gates import judge, read_baseline
    from harness.gates.runs import ResultSet, RunFrame

    spec = read_baseline(baseline)
    gates = []
    judged: set[tuple[float, float | None]] = set()
    for g in spec.gates:
        if g.metric != "error_rate" or g.effective_direction != "at_most" or g.scenario or g.stage:
            continue
        if (g.limit, g.detect) in judged:
            continue
        judged.add((g.limit, g.detect))
        gates.append(g.model_copy(update={"phase": label, "min_samples": 1}))
    if not gates:
        return None
    ok = np.arange(seen.requests) >= seen.errors  # which requests failed does not matter to a count
    frame = RunFrame.from_columns(seen.requests, ok=ok)
    counted = ResultSet(label=label, path=where, summary=None, frame=frame)
    return judge(spec.model_copy(update={"gates": gates}), [counted], baseline_path=baseline)


# ------------------------------------------------------------------------------------------ running


class PairedRunner:
    """Runs one :class:`PairedSpec` (see the module docstring); :meth:`run` returns the record."""

    def __init__(self, spec: PairedSpec, console: Console | None = None) -> None:
        self.spec = spec
        # Absolute: the server runs in its log directory, so a relative ready-file path given to it
        # would be resolved there (harness.target.server.launch passes the path through as it is).
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
                file=str(cspec.out / "capacity.json"), rate_share=spec.rate_share, errors=result.errors,
                limited_by_errors=result.limited_by_errors,
            )  # fmt: skip
            self.record.capacity = record
            self.save()
            unproven = self._judge_errors(
                "capacity", result.errors, "the capacity search's requests, before any phase", cspec.out
            )
            if cap <= 0:
                why = (
                    "the target's errors leave no capacity to take a share of"
                    if result.limited_by_errors
                    else "no rate meets the capacity SLO, so a share of capacity means nothing"
                )
                raise CannotJudge(
                    f"{why}: {result.reason}" + (f"; {unproven}" if unproven else ""),
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
        self._judge_errors(
            "warm-check", check.errors, "the warm check's probes, before the warm phase",
            self.out / WARM_CHECK_FILE,
        )  # fmt: skip
        warm = replay.replace(stage="warm", **prep.phase_load.get("warm", {}))
        self._phase("warm", warm, len(prep.planned))

    def _judge_errors(self, label: str, seen: ErrorCount | None, what: str, where: Path) -> str | None:
        """Judge the gate's ``error_rate`` limits on errors seen outside the phases
        (:func:`judge_errors`). Proven exceeded: the verdict is written as a gated run writes it and the
        run ends here (:class:`CheckFailed`, exit 1, naming the gate and the numbers); the phases to come
        could not undo it. Not proven: the run goes on, and the sentence saying so is returned for the
        message it may end with (``None``: no errors, no gate, or no ``error_rate`` gate)."""
        from harness.gates import write_report_json
        from harness.gates.output import write_junit

        if seen is None or not seen.errors or self.spec.gate is None:
            return None
        report = judge_errors(self.spec.gate, label, seen, where)
        if report is None:
            return None
        failed = [g for g in report.gates if g.verdict == "fail"]
        if not failed:
            limits = ", ".join(f"{g.id} ≤ {format_value(g.limit, g.unit)}" for g in report.gates)
            note = f"the gate's {limits} is not proven exceeded by {what} ({seen.text()})"
            self.ui.say(f"[yellow]![/] {escape(note)}")
            return note
        # Only the failing gates: the lifted min_samples makes a pass here mean nothing.
        report = report.model_copy(update={"gates": failed})
        junit, verdict = self.out / JUNIT_FILE, self.out / VERDICT_FILE
        write_junit(junit, report)
        write_report_json(verdict, report)
        self.gate_report = report
        self.record.gate = GateRecord(
            verdict=report.verdict, exit_code=report.exit_code, headline=report.headline(),
            junit=str(junit), verdict_json=str(verdict),
        )  # fmt: skip
        reasons = "; ".join(f"{g.id}: {g.reason}" for g in failed)
        raise CheckFailed(f"gate: {report.headline()}, judged on {what}: {reasons}", file=verdict)

    def _errors_seen(self) -> list[str]:
        """The errors the capacity search and the warm check counted, for the message the run ends with
        (the warm check's only where its own reason, already in the message, does not say them)."""
        notes = []
        cap = self.record.capacity
        if cap is not None and cap.errors is not None and cap.errors.errors:
            notes.append(f"the capacity search's requests: {cap.errors.text()}")
        check = self.record.warm_check
        if check is not None and check.warm and check.errors is not None and check.errors.errors:
            notes.append(f"the warm check's probes: {check.errors.text()}")
        return notes

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
        result = run_phase(
            load.replace(results_dir=results), f"the {name} phase", ui=self.ui, label=f"{name} phase",
            total=total, timeout_s=self.spec.recipe.phase_timeout, note=lambda r: self._note_phase(name, r),
            hint="a larger --phase-timeout, or a shorter schedule",
        )  # fmt: skip
        self.ui.say(result.line(name))
        rec = self.record.phases[name]
        if rec.stop_reason:
            self.ui.say(f"  [dim]{escape(rec.stop_reason)}[/]")

    def _note_phase(self, name: str, result: PhaseResult) -> None:
        """Record a finished (or interrupted) phase in ``run.json``, with its summary's counts."""
        rec = PhaseRecord(dir=str(result.results), exit_code=result.exit_code, seconds=result.seconds)
        if (s := result.summary) is not None:
            rec = rec.model_copy(
                update={"requests": s.requests, "errors": s.errors, "interrupted": s.interrupted,
                        "client_bound": s.client_bound, "stop_reason": s.stop_reason}
            )  # fmt: skip
        self.record.phases[name] = rec
        self.save()

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
        seen = self._errors_seen()
        if seen:  # judged where a gate could (above, and before the phases); said in every case
            message += "; errors before the phases: " + "; ".join(seen)
        self.record.exit_code, self.record.message = int(code), message
