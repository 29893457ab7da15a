"""``harness ab``'s runner: two targets measured side by side, block by block, judged on their ratio.

A stored baseline compares today's run with numbers measured earlier, on another day and maybe another
machine state, so drift and a neighbour's load enter the comparison. An A/B run needs no stored
latency: it measures a **base** (A) and a **candidate** (B) in the same job and judges the ratio
candidate ÷ base (:mod:`harness.gates.ab`).

1. **check** every input before anything starts (the corpus, the load options, both targets' serve
   arguments, the gate file, ``--out``; :func:`harness.experiments.ab_spec.prepare`): a mistake costs
   milliseconds (exit 3/4), not two model loads;
2. **targets**: both are up for the whole run, each started from serve arguments (its log and cache
   state under ``OUT/server/<arm>/``) or reached at a URL;
3. **capacity**: ``--rate 70%`` without ``--capacity`` measures the **base's** capacity first
   (:class:`harness.experiments.capacity.CapacityRunner`, ``OUT/capacity/``), and both arms get that
   share of it: the same absolute load, so a slower candidate queues more at it, as it would in
   production, instead of being loaded to the same share of its own smaller capacity. The candidate's
   is measured the same way (``OUT/capacity-candidate/``, recorded, not judged), so that both arms have
   served the same probe traffic before the first block. Then every cache level of both is flushed;
4. **blocks**: ``--blocks`` pairs a look, in the order A B B A A B B A … (each pair's first arm
   alternates, so a drift that is linear in time hits both arms alike). Every block is one headless
   Locust replay
   (:func:`harness.load.runner.run_locust`) at the recipe's rate into ``OUT/base/NN`` or
   ``OUT/candidate/NN``, an ordinary run directory. Block pair ``NN`` sends the requests of
   ``OUT/blocks/NN.jsonl`` to both arms: distinct requests (one per prompt) drawn, seeded, from the
   corpus, no two pairs sharing one, so neither arm's cache is warmed by the other's pair and the
   requests pair up by id. One target receives load at a time: the two never compete for the CPU,
   and what slows the machine during a pair slows both of its blocks. (Request-by-request
   alternation would need the two loads at once, and on cores the targets share, a slower candidate
   would then slow the base too and shrink the very ratio being judged: a short block is the finest
   grain at which one target is measured alone.);
5. **looks** (``--looks``): after each look's block pairs the verdict is judged
   (:func:`harness.gates.ab.judge_ab`); the run stops at the first look that decides (a regression
   proven, or every metric's slowdown of ``--detect`` ruled out), when the next look would end past
   ``--max-duration``, or after the last. Each look spends an equal share of the false-alarm rate, so
   looking early costs no false alarms (tachometer's auto-sampling, with the rate held);
6. **warm pass** (``--warm-requests N``): each arm sends N of its block requests again, now cached
   (``OUT/warm/<arm>``), at :data:`WARM_SPEEDUP` × the blocks' rate: hit and warm rates and errors,
   which do not depend on the runner's speed;
7. **judge**: the latency ratios and the candidate's error rate (:mod:`harness.gates.ab`), and, with
   ``--gate FILE``, the file's gates on the candidate's pooled cold blocks (``cold``) and warm pass
   (``warm``): its rates and bytes against their declared limits on any runner, its absolute
   latencies only where its fingerprint matches (skipped elsewhere, never failing the job). One
   family-wise false-alarm rate covers every test and look (:func:`harness.gates.ab_stats.levels`).
   ``OUT/ab.json`` (:class:`~harness.experiments.ab_record.ABRun`, rewritten after every step),
   ``OUT/gate.json`` and ``OUT/gate.junit.xml``, and the exit code: 0 pass, 1 fail, 6 cannot be judged.

By default every request carries ``Cache-Control: no-cache`` (``--bypass-cache``): the engine is
measured, not a response cache answering from memory.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import orjson
from rich.console import Console
from rich.markup import escape

from harness.common import console as cons
from harness.common.errors import ExitCode, HarnessError
from harness.common.io import atomic_write, write_json
from harness.corpus.model import CorpusRecord
from harness.experiments.ab_record import (
    AB_FILE,
    ARMS,
    BLOCKS_DIR,
    CANDIDATE_CAPACITY_DIR,
    CAPACITY_DIR,
    GATE_JSON,
    GATE_JUNIT,
    OUTPUTS,
    SERVER_DIR,
    WARM_DIR,
    ABRun,
    Arm,
    BlockRecord,
    CapacityNote,
    GateNote,
    LookRecord,
    TargetRecord,
)
from harness.experiments.ab_spec import ABPlan, ABSpec, chosen_metrics, order, prepare
from harness.experiments.capacity import CapacitySpec
from harness.experiments.capacity_result import CapacityResult
from harness.experiments.driver import TargetSpec, Ui, clear_out_dir, open_targets, sigterm_interrupts
from harness.experiments.paired_record import FlushRecord
from harness.experiments.phase import PhaseResult, run_phase
from harness.experiments.recipe import write_recipe
from harness.experiments.target import Target, flush_all
from harness.gates.ab import ABJudgement, judge_ab, parse_ab_metrics
from harness.gates.ab_stats import levels
from harness.gates.baseline import Baseline
from harness.gates.judge import EXIT_CODES, Overall
from harness.gates.runs import ResultSet
from harness.load.runner import LoadSpec
from harness.load.target import NotExposed

BLOCK_START_DELAY_S = 1.0
"""A block's start delay unless the recipe sets one: from the run's start to its first arrival. Not
shorter: at 0.5 s the Locust process's own start-up overlapped a block's first requests, and in one
CI run an unchanged target's TTFT block pairs scattered 55 % beyond their requests' noise (16 % at
1.0 s): the job could not judge it."""

WARM_SPEEDUP = 3.0
"""The warm pass sends at this many times the blocks' rate: it measures rates (hits, errors), which do
not depend on the load, and its requests are cache hits that cost the target little; at the blocks'
own rate it took as long as all the blocks of a look."""


# ---- running ----------------------------------------------------------------------------------------


class ABRunner:
    """Runs one :class:`~harness.experiments.ab_spec.ABSpec` (the module docstring's steps); :meth:`run`
    returns the record."""

    def __init__(self, spec: ABSpec, console: Console | None = None) -> None:
        self.spec = spec
        # Absolute: a started server runs in its log directory.
        self.out = spec.out.resolve()
        self.ui = Ui(console or cons.err())
        self.record = ABRun(
            started_at=datetime.now(UTC).isoformat(), out=str(spec.out), block_pairs=spec.ab.blocks,
            looks_planned=spec.ab.looks, bypass_cache=spec.ab.bypass_cache,
        )  # fmt: skip
        self.metrics = parse_ab_metrics(spec.ab.metrics)
        self.left_out: list[str] = []
        self.pairs_run = 0
        self.other_tests = 0
        """The gate file's tests, each taking its share of α (every gate counted, a skipped one too:
        conservative, and known before the run); set from the plan, which read the file once."""

    def save(self) -> None:
        write_json(self.out / AB_FILE, self.record.model_dump(mode="json"))

    def run(self) -> ABRun:
        """Check, start both targets, measure the base's capacity, flush, run the looks' blocks, the
        warm pass, judge; ``ab.json`` after each step."""
        spec = self.spec
        plan = prepare(spec)
        if spec.force:
            clear_out_dir(self.out, OUTPUTS)
        self.out.mkdir(parents=True, exist_ok=True)
        files = self._write_blocks(plan)
        self.other_tests = len(plan.baseline.gates) if plan.baseline is not None else 0
        rec = self.record
        rec.corpus, rec.distinct_requests = plan.corpus, plan.distinct
        rec.block_requests, rec.rate_rps = len(plan.blocks[0]), plan.rate_rps
        rec.load = plan.load.to_args()
        rec.unused = spec.unused()
        rec.order = [f"{arm}/{pair:02d}" for pair, arm in order(len(plan.blocks))]
        write_recipe(self.out, spec.recipe, source=spec.source)
        self.save()
        if rec.unused:
            self.ui.say(
                f"[yellow]note:[/] harness ab does not use the recipe's {escape(', '.join(rec.unused))}"
            )
        self.metrics, self.left_out = chosen_metrics(spec.ab, sum(len(b) for b in plan.blocks))
        for note in self.left_out:
            self.ui.say(f"[yellow]note:[/] {escape(note)}")
        try:
            with sigterm_interrupts(), self.ui.progress, self._targets(plan) as targets:
                if plan.share is not None:
                    plan = self._capacity(plan, targets)
                self._flush(targets)
                self._looks(plan, targets, files)
                if spec.ab.warm_requests:
                    self._warm(plan, targets)
        except KeyboardInterrupt:
            self._finish(int(ExitCode.INTERRUPTED), "interrupted: the running block was finalized and the "
                         "servers stopped", interrupted=True)  # fmt: skip
            raise
        except HarnessError as exc:
            self._finish(int(exc.exit_code), str(exc))
            raise
        self._conclude(plan)
        return self.record

    def _finish(self, code: int, message: str, *, interrupted: bool = False) -> None:
        self.record.exit_code, self.record.message = code, message
        self.record.interrupted = interrupted
        self.record.finished_at = datetime.now(UTC).isoformat()
        self.save()

    def _write_blocks(self, plan: ABPlan) -> list[Path]:
        """``OUT/blocks/NN.jsonl``: block pair NN's requests, a corpus both arms replay."""
        folder = self.out / BLOCKS_DIR
        folder.mkdir(parents=True, exist_ok=True)
        return [
            self._write_corpus(folder / f"{j + 1:02d}.jsonl", records)
            for j, records in enumerate(plan.blocks)
        ]

    @staticmethod
    def _write_corpus(path: Path, records: list[CorpusRecord]) -> Path:
        with atomic_write(path, "wb", encoding=None) as fh:
            for r in records:
                fh.write(orjson.dumps(r.model_dump(mode="json", exclude_none=True)) + b"\n")
        return path

    @contextmanager
    def _targets(self, plan: ABPlan) -> Iterator[dict[Arm, Target]]:
        """Both arms' targets, up at once for the whole run (both servers started together, the base
        first; each stopped on every exit path, the candidate first)."""
        creds = plan.load.credentials()
        specs = [TargetSpec(plan.targets[a].url, plan.serve_args[a], self.out / SERVER_DIR / a) for a in ARMS]
        with open_targets(specs, self.ui, self.spec.server_timeout_s, credentials=creds) as opened:
            out = dict(zip(ARMS, opened, strict=True))
            for arm, target in out.items():
                started = target.server is not None
                self.record.targets[arm] = TargetRecord(
                    url=target.url, model=target.model, started=started,
                    serve_args=plan.serve_args[arm] if started else None,
                    log=str(self.out / SERVER_DIR / arm / "server.log") if started else None,
                )  # fmt: skip
                self.ui.say(f"[bold]{arm}[/]: {escape(target.url)}")
            self.save()
            yield out

    def _capacity(self, plan: ABPlan, targets: dict[Arm, Target]) -> ABPlan:
        """The base's capacity, and the rate both arms get: the same share of the *base's* capacity.
        Then the candidate's, measured the same way: for the record, and because a target that has
        served a capacity search is not in the state of one that has not (measured: with the search
        on the base alone, unchanged A/A runs put the candidate 4–5 % faster on every median; with
        none, 1.00), so both arms serve the same probe traffic. Before the flush: the probes warm the
        caches."""
        from harness.common.errors import CannotJudge
        from harness.experiments.capacity import CapacityRunner

        assert plan.share is not None
        # The probes take the path the blocks take: cached (and embedded) misses, or the engine alone.
        recipe = self.spec.recipe
        recipe = recipe.model_copy(
            update={
                "capacity": recipe.capacity.model_copy(update={"bypass_cache": self.spec.ab.bypass_cache})
            }
        )
        results: dict[Arm, CapacityResult] = {}
        folders: dict[Arm, str] = {"base": CAPACITY_DIR, "candidate": CANDIDATE_CAPACITY_DIR}
        for arm, folder in folders.items():
            cspec = CapacitySpec(recipe, out=self.out / folder)
            self.ui.say(
                f"[dim]measuring the {arm}'s capacity (SLO {escape(recipe.capacity.slo)}) → {cspec.out}[/]"
            )
            results[arm] = CapacityRunner(cspec, ui=self.ui).measure(targets[arm])
            if arm == "base" and results[arm].capacity_rps <= 0:
                raise CannotJudge(
                    f"no rate meets the capacity SLO on the base, so a share of its capacity means nothing: "
                    f"{results[arm].reason}", file=cspec.out / "capacity.json",
                )  # fmt: skip
        base, cand = results["base"], results["candidate"]
        cap = base.capacity_rps
        rate = plan.share.of(cap)
        self.record.capacity = CapacityNote(
            capacity_rps=cap, share=plan.share.fraction, rate_rps=rate,
            file=str(self.out / CAPACITY_DIR / "capacity.json"), bounded=base.bounded,
            candidate_capacity_rps=cand.capacity_rps,
            candidate_file=str(self.out / CANDIDATE_CAPACITY_DIR / "capacity.json"),
            candidate_reason=cand.reason,
        )  # fmt: skip
        self.record.rate_rps = rate
        load = plan.load.evolve(capacity=cap)
        self.record.load = load.to_args()
        self.save()
        self.ui.say(
            f"[green]✓[/] base capacity {cap:.4g} req/s (the candidate's: {cand.capacity_rps:.4g}): "
            f"both arms at {plan.share} of the base's → {rate:g} req/s"
        )
        return replace(plan, load=load, rate_rps=rate)

    def _flush(self, targets: dict[Arm, Target]) -> None:
        for arm, target in targets.items():
            with self.ui.step(f"flushing the {arm}'s caches"):
                flushed = flush_all(target.client)
            self.record.flush[arm] = [FlushRecord.of(f) for f in flushed]
            for f in flushed:
                mark = "[green]✓[/] flushed" if f.status == "flushed" else "[yellow]–[/] not flushed:"
                self.ui.say(f"{mark} {arm}: {escape(f.detail)}")
        self.save()

    def _looks(self, plan: ABPlan, targets: dict[Arm, Target], files: list[Path]) -> None:
        """Each look's block pairs, then its verdict; stop at the first that decides, or before a look
        that would end past the budget (``--max-duration``)."""
        ab, budget = self.spec.ab, self.spec.recipe.load.max_duration
        steps = order(len(plan.blocks))
        started = time.monotonic()
        for look in range(1, ab.looks + 1):
            elapsed = time.monotonic() - started
            if look > 1 and budget is not None and elapsed + elapsed / (look - 1) > budget:
                self.record.stop_reason = (
                    f"budget: look {look} would end past --max-duration {budget:g} s "
                    f"({elapsed:.0f} s spent on {look - 1})"
                )
                break
            t0 = time.monotonic()
            for pair, arm in steps[(look - 1) * ab.blocks * 2 : look * ab.blocks * 2]:
                self._block(plan, targets[arm], arm, pair, files[pair - 1])
            self.pairs_run = look * ab.blocks
            j = self._judge(look)
            self.record.looks.append(
                LookRecord(look=look, block_pairs=self.pairs_run, verdict=j.verdict, headline=j.headline,
                           seconds=round(time.monotonic() - t0, 3))
            )  # fmt: skip
            self.save()
            self.ui.say(f"look {look}: {escape(j.headline)}")
            # A pass stops early only once the blocks sent hold the warm pass's requests: a warm pass
            # of fewer could not judge its limits.
            sent = sum(len(b) for b in plan.blocks[: self.pairs_run])
            if j.verdict == "fail" or (j.verdict == "pass" and sent >= ab.warm_requests):
                self.record.stop_reason = f"look {look} decided: {j.verdict}"
                break
        else:
            self.record.stop_reason = f"the last look ({ab.looks})"
        self.save()

    def _block(self, plan: ABPlan, target: Target, arm: Arm, pair: int, corpus: Path) -> None:
        results = self.out / arm / f"{pair:02d}"
        n = len(plan.blocks[pair - 1])
        self._replay(
            plan, target, arm, corpus=corpus, results=results, n=n, label=f"pair {pair}: {arm}", pair=pair,
            name=f"the {arm}'s block {pair}",
        )  # fmt: skip

    def _warm(self, plan: ABPlan, targets: dict[Arm, Target]) -> None:
        """Each arm sends ``--warm-requests`` of the requests its blocks sent (a seeded sample), again:
        now they are cached. Rates, not latencies, are judged on it, so one block an arm will do."""
        sent = [r for block in plan.blocks[: self.pairs_run] for r in block]
        k = min(self.spec.ab.warm_requests, len(sent))
        rng = np.random.default_rng(plan.load.seed)
        chosen = [sent[i] for i in sorted(rng.choice(len(sent), size=k, replace=False).tolist())]
        corpus = self._write_corpus(self.out / BLOCKS_DIR / "warm.jsonl", chosen)
        assert plan.rate_rps is not None
        warm = replace(plan, rate_rps=round(plan.rate_rps * WARM_SPEEDUP, 4))
        for target in targets.values():
            # The blocks' cache write-backs land first (a busy runner lags them): the warm pass judges
            # what the cache keeps, not how far behind its writer is.
            with contextlib.suppress(NotExposed):
                target.client.cache_drain(60.0)
        for arm in ARMS:
            results = self.out / WARM_DIR / arm
            self._replay(
                warm, targets[arm], arm, corpus=corpus, results=results, n=k, label=f"warm: {arm}", pair=0,
                name=f"the {arm}'s warm pass",
            )  # fmt: skip

    def _replay(
        self, plan: ABPlan, target: Target, arm: Arm, *, corpus: Path, results: Path, n: int, label: str,
        pair: int, name: str,
    ) -> None:  # fmt: skip
        """One block (``pair`` ≥ 1) or warm pass (``pair`` 0) of ``arm``, recorded in ``ab.json`` whatever
        its end; the error its exit code means, raised."""
        spec = self.spec
        given = spec.recipe.load
        assert plan.rate_rps is not None
        opts = plan.load.evolve(
            corpus=corpus, max_requests=n, stage=arm, results_dir=results, rate=plan.rate_rps, capacity=None,
            max_duration=None, bypass_fraction=1.0 if spec.ab.bypass_cache else None,
            start_delay=given.start_delay if given.is_set("start_delay") else BLOCK_START_DELAY_S,
        )  # fmt: skip
        load = LoadSpec(host=target.url, options=opts, processes=spec.recipe.launch.processes)

        def note(result: PhaseResult) -> None:
            rec = BlockRecord(
                pair=pair, arm=arm, dir=str(results), exit_code=result.exit_code, seconds=result.seconds
            )
            if (s := result.summary) is not None:
                rec = rec.model_copy(
                    update={"requests": s.requests, "errors": s.errors, "client_bound": s.client_bound,
                            "interrupted": s.interrupted}
                )  # fmt: skip
            (self.record.warm if pair == 0 else self.record.blocks).append(rec)
            self.save()

        result = run_phase(
            load, name, ui=self.ui, label=label, total=n, timeout_s=spec.recipe.phase_timeout, note=note,
            hint="a larger --phase-timeout, or smaller blocks",
        )  # fmt: skip
        self.ui.say(result.line(name))

    # ---- judging ---------------------------------------------------------------------------------

    @property
    def _family_looks(self) -> int:
        """Looks the family's α is split over: every look at the blocks, and the final one after a warm
        pass (its errors count in the candidate's error rate)."""
        return self.spec.ab.looks + (1 if self.spec.ab.warm_requests else 0)

    def _judge(self, look: int, more: Sequence[tuple[ResultSet, ResultSet]] = ()) -> ABJudgement:
        from harness.gates.runs import load_result_set

        spec, ab = self.spec, self.spec.ab
        pairs = [
            (
                load_result_set(self.out / "base" / f"{j:02d}", f"base-{j:02d}"),
                load_result_set(self.out / "candidate" / f"{j:02d}", f"candidate-{j:02d}"),
            )
            for j in range(1, self.pairs_run + 1)
        ]
        with self.ui.step("judging the ratios"):
            j = judge_ab(
                pairs, metrics=self.metrics, limit=ab.limit, detect=ab.detect,
                max_error_rate=ab.max_error_rate, detect_error_rate=ab.detect_error_rate,
                confidence=spec.recipe.gate.confidence, resamples=spec.resamples, seed=spec.seed,
                left_out=self.left_out, look=look, looks=self._family_looks, other_tests=self.other_tests,
                more_errors=more,
            )  # fmt: skip
        self.record.judgement = j
        self.record.verdict = j.verdict
        self.save()
        return j

    def _conclude(self, plan: ABPlan) -> None:
        """The final verdict: the last look's ratios with the warm pass's errors counted, and the gate
        file on the candidate; ``ab.json``, ``gate.json`` and the exit code."""
        from harness.gates.runs import load_result_set

        more: list[tuple[ResultSet, ResultSet]] = []
        if self.record.warm:
            more = [(load_result_set(self.out / WARM_DIR / "base", "warm-base"),
                     load_result_set(self.out / WARM_DIR / "candidate", "warm-candidate"))]  # fmt: skip
        j = self._judge(len(self.record.looks) + (1 if more else 0), more) if more else self.record.judgement
        assert j is not None
        verdicts: list[str] = [j.verdict]
        messages = [j.headline]
        if plan.baseline is not None:
            note = self._gate(plan.baseline)
            verdicts.append(note.verdict)
            messages.append(f"--gate {note.baseline}: {note.verdict} ({_counts_text(note.counts)})")
        overall: Overall = (
            "fail" if "fail" in verdicts else "unjudgeable" if set(verdicts) - {"pass"} else "pass"
        )
        self.record.verdict = overall
        self._finish(int(EXIT_CODES[overall]), "; ".join(messages))

    def _gate(self, baseline: Baseline) -> GateNote:
        """``--gate FILE`` on the candidate's pooled cold blocks (``cold``) and warm pass (``warm``), each
        gate at its share of the family's α."""
        from harness.gates.judge import judge, write_report_json
        from harness.gates.output import write_junit
        from harness.gates.runs import load_result_set, pooled_set

        assert self.record.judgement is not None
        tests = self.record.judgement.tests
        # Two-sided confidence whose one-sided tail is this gate's α / tests.
        confidence = 1.0 - 2.0 * levels(1.0 - self.spec.recipe.gate.confidence, tests)
        cold = pooled_set(
            [load_result_set(self.out / "candidate" / f"{j:02d}") for j in range(1, self.pairs_run + 1)],
            "cold",
        )
        sets = [cold]
        if self.record.warm:
            sets.append(load_result_set(self.out / WARM_DIR / "candidate", "warm"))
        path = self.spec.recipe.gate.baseline
        report = judge(baseline.model_copy(update={"confidence": confidence}), sets, baseline_path=path)
        write_report_json(self.out / GATE_JSON, report)
        write_junit(self.out / GATE_JUNIT, report)
        counts = {k: v for k, v in report.counts().items() if v}
        note = GateNote(
            baseline=str(path), verdict=report.verdict, exit_code=report.exit_code, counts=counts,
            confidence=confidence, file=str(self.out / GATE_JSON),
        )  # fmt: skip
        self.record.gate = note
        self.save()
        return note


def _counts_text(counts: dict[str, int]) -> str:
    words = {
        "pass": "passed",
        "fail": "failed",
        "inconclusive": "inconclusive",
        "unjudgeable": "cannot be judged",
    }
    return ", ".join(f"{n} {words.get(k, k)}" for k, n in counts.items()) or "no gates"
