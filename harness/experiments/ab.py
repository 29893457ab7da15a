"""``harness ab``'s runner: two targets measured side by side, block by block, judged on their ratio.

A stored baseline compares today's run with numbers measured earlier, on another day and maybe another
machine state, so drift and a neighbour's load enter the comparison. An A/B run needs no stored
latency: it measures a **base** (A) and a **candidate** (B) in the same job and judges the ratio
candidate ÷ base (:mod:`harness.gates.ab`).

1. **check** every input before anything starts (the corpus, the load options, both targets' serve
   arguments, ``--out``): a mistake costs milliseconds (exit 3/4), not two model loads;
2. **targets**: both are up for the whole run, each started from serve arguments (its log and cache
   state under ``OUT/server/<arm>/``) or reached at a URL; every cache level of both is flushed
   before the first block;
3. **blocks**: ``--blocks`` pairs, in the order A B B A A B B A … (each pair's first arm alternates, so
   a drift that is linear in time hits both arms alike). Every block is one headless Locust replay
   (:func:`harness.load.runner.run_locust`) at the recipe's rate into ``OUT/base/NN`` or
   ``OUT/candidate/NN``, an ordinary run directory. Block pair ``NN`` sends the requests of
   ``OUT/blocks/NN.jsonl`` to both arms: distinct requests (one per prompt) drawn, seeded, from the
   corpus, no two pairs sharing one, so neither arm's cache is warmed by the other's pair and the
   requests pair up by id. One target receives load at a time: the two never compete for the CPU,
   and what slows the machine during a pair slows both of its blocks;
4. **judge** (:func:`harness.gates.ab.judge_ab`) → ``OUT/ab.json`` (:class:`ABRun`, rewritten after
   every step) and the exit code: 0 pass, 1 fail, 6 cannot be judged.

By default every request carries ``Cache-Control: no-cache`` (``--bypass-cache``): the engine is
measured, not a response cache answering from memory.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

import numpy as np
import orjson
from pydantic import Field
from rich.console import Console
from rich.markup import escape

from harness.common import console as cons
from harness.common.errors import (
    ConfigError,
    ExitCode,
    HarnessError,
    InputError,
    TargetDied,
    UnavailableError,
)
from harness.common.io import atomic_write, write_json
from harness.common.model import StrictModel
from harness.corpus.model import CorpusRecord
from harness.experiments.driver import (
    ERRORS_BY_CODE,
    Ui,
    check_out_dir,
    check_serve_args,
    clear_out_dir,
    log_tail,
    open_target,
    sigterm_interrupts,
)
from harness.experiments.paired_record import FlushRecord
from harness.experiments.recipe import RECIPE_FILE, ABRecipe, Recipe, TargetRecipe, write_recipe
from harness.experiments.target import Target, flush_all
from harness.gates.ab import (
    DEFAULT_RESAMPLES,
    DEFAULT_SEED,
    ABJudgement,
    judge_ab,
    parse_ab_metrics,
    reachable,
)
from harness.gates.metrics import Metric
from harness.load.inputs import Inputs
from harness.load.options import LoadOptions
from harness.load.results import RECORDS_FILE, SUMMARY_FILE, InputRef, read_summary
from harness.load.runner import LoadSpec, run_locust

Arm = Literal["base", "candidate"]
ARMS: tuple[Arm, Arm] = ("base", "candidate")
AB_FILE = "ab.json"
BLOCKS_DIR = "blocks"
SERVER_DIR = "server"
OUTPUTS = (*ARMS, BLOCKS_DIR, SERVER_DIR, AB_FILE, RECIPE_FILE)
"""Everything ``harness ab`` writes under ``OUT`` (``--force`` removes exactly these)."""
DEFAULT_BLOCK_REQUESTS = 50
"""Requests per block when ``--block-requests`` is not given (fewer when the corpus is short)."""

UNUSED_LOAD: tuple[str, ...] = (
    "schedule", "duration", "max_requests", "speedup", "plan", "preload", "until_precision", "max_duration",
    "precision_on", "precision_confidence", "precision_min_samples", "history", "salt_per_pass",
    "bypass_fraction",
)  # fmt: skip
"""Load options a recipe file may hold that an A/B run sets itself or has no use for (warned about,
then unset): each block sends its own requests once, at the recipe's rate."""
UNUSED_SECTIONS: tuple[str, ...] = ("warmup", "capacity")


# ---- what a run is configured with, and the checks before it starts ---------------------------------


@dataclass
class ABSpec:
    """An A/B run: the :class:`~harness.experiments.recipe.Recipe` it runs (its ``ab`` section, load,
    launcher and ``gate.confidence``), where its results go, and the runner's own settings."""

    recipe: Recipe
    out: Path
    force: bool = False
    source: Path | None = None
    """The recipe file it was read from (``None``: flags only)."""
    server_timeout_s: float = 300.0
    resamples: int = DEFAULT_RESAMPLES
    seed: int = DEFAULT_SEED
    """Seed of the verdict's bootstrap."""

    @property
    def ab(self) -> ABRecipe:
        return self.recipe.ab

    def targets(self) -> dict[Arm, TargetRecipe]:
        """Both arms' targets: the ``ab`` section's, the base falling back to the recipe's ``target``."""
        base = self.ab.side("base")
        if base is None and (self.recipe.target.serve_args is not None or self.recipe.target.url is not None):
            base = self.recipe.target
        if base is None:
            raise ConfigError(
                "no base target", field="--base-serve-args", hint='--base-serve-args "--preset tiny --cache" '
                "or --base-url http://host:port",
            )  # fmt: skip
        candidate = self.ab.side("candidate")
        if candidate is None:
            raise ConfigError(
                "no candidate target", field="--candidate-serve-args",
                hint="--candidate-serve-args ARGS or --candidate-url http://host:port",
            )  # fmt: skip
        if base.url is not None and base.url.rstrip("/") == (candidate.url or "").rstrip("/"):
            raise ConfigError(
                "the base and the candidate are the same server: the second arm would find the first one's "
                "requests in its caches", field="--candidate-url",
                hint="for an A/A check, start two with the same serve args",
            )  # fmt: skip
        return {"base": base, "candidate": candidate}

    def unused(self) -> list[str]:
        """The recipe's settings an A/B run does not use (``load.duration``, ``gate.baseline`` …)."""
        r = self.recipe
        out = [f"load.{name}" for name in UNUSED_LOAD if r.load.is_set(name)]
        out += [f"{s}.{name}" for s in UNUSED_SECTIONS for name in sorted(getattr(r, s).model_fields_set)]
        if r.gate.baseline is not None:
            out.append("gate.baseline")
        return out


@dataclass
class ABPlan:
    """What the checks read and decided, for the run."""

    load: LoadOptions
    """Every block's load options but its corpus, size, stage and results directory."""
    blocks: list[list[CorpusRecord]]
    """Block pair ``j``'s records (distinct prompts; no two pairs share one)."""
    distinct: int
    """Distinct prompts in the corpus."""
    rate_rps: float
    serve_args: dict[Arm, list[str] | None]
    targets: dict[Arm, TargetRecipe]
    corpus: InputRef


def order(blocks: int) -> list[tuple[int, Arm]]:
    """``(pair, arm)`` in the order they run: A B, B A, A B, … (pairs numbered from 1)."""
    out: list[tuple[int, Arm]] = []
    for j in range(blocks):
        first, second = ARMS if j % 2 == 0 else ARMS[::-1]
        out += [(j + 1, first), (j + 1, second)]
    return out


def distinct_records(records: list[CorpusRecord], corpus: Path) -> list[CorpusRecord]:
    """One record per prompt, in corpus order; ids must then be unique (they pair the arms' requests)."""
    seen: set[str] = set()
    out: list[CorpusRecord] = []
    for r in records:
        key = r.text()
        if key not in seen:
            seen.add(key)
            out.append(r)
    ids: dict[str, int] = {}
    for i, r in enumerate(out):
        if r.id in ids:
            raise InputError(
                f"two distinct prompts share the id {r.id!r}: an A/B run pairs the arms' requests by id",
                file=corpus, field="id",
            )  # fmt: skip
        ids[r.id] = i
    return out


def prepare(spec: ABSpec) -> ABPlan:
    """Check every input and option before a server starts or a request is sent; the plan."""
    check_out_dir(spec.out, OUTPUTS, force=spec.force, holds="an earlier A/B run")
    targets = spec.targets()
    load = spec.recipe.load.evolve(**dict.fromkeys(UNUSED_LOAD))
    if load.corpus is None:
        raise ConfigError("no corpus to replay", field="--corpus", hint="--corpus runs/corpus")
    if load.rate is None:
        raise ConfigError(
            "an A/B run sends every block at a constant rate", field="--rate",
            hint="--rate 4 (requests/s), or --rate 70% with --capacity N",
        )  # fmt: skip
    # The load stage's own checks (a share without --capacity, a tokenizer …) on the corpus, read once.
    inputs = Inputs.load(load.evolve(max_requests=1), ladder=False)
    corpus_file = load.corpus / "corpus.jsonl" if load.corpus.is_dir() else load.corpus
    if inputs.sessions is not None:
        raise ConfigError(
            "an A/B run replays single requests; a session corpus's turns depend on each other's answers",
            file=corpus_file, field="--corpus",
        )  # fmt: skip
    distinct = distinct_records(inputs.records, corpus_file)
    ab = spec.ab
    n = ab.block_requests
    if n is None:
        n = min(DEFAULT_BLOCK_REQUESTS, len(distinct) // ab.blocks)
    if n < 1 or n * ab.blocks > len(distinct):
        raise ConfigError(
            f"{ab.blocks} block pairs of {n} distinct requests need {ab.blocks * n}; the corpus has "
            f"{len(distinct)} distinct prompts",
            field="--block-requests" if ab.block_requests is not None else "--blocks",
            hint="fewer --blocks or --block-requests, or a larger corpus (harness corpus build --n)",
        )
    # Seeded, so the blocks are a fair sample of a corpus ordered by scenario, and a rerun sends the same.
    picked = np.random.default_rng(load.seed).permutation(len(distinct))[: n * ab.blocks]
    blocks = [[distinct[i] for i in sorted(picked[j * n : (j + 1) * n].tolist())] for j in range(ab.blocks)]
    rate = inputs.rate
    assert rate is not None  # checked above; a share is resolved by Inputs
    serve_args: dict[Arm, list[str] | None] = {}
    for arm in ARMS:
        argv = targets[arm].serve_argv()
        serve_args[arm] = None if argv is None else _checked_serve_args(argv, arm)
    return ABPlan(load, blocks, len(distinct), rate, serve_args, targets, InputRef.of(corpus_file))


def _checked_serve_args(argv: list[str], arm: Arm) -> list[str]:
    try:
        return check_serve_args(argv)
    except ConfigError as exc:
        raise ConfigError(exc.message, field=f"--{arm}-serve-args", hint=exc.hint) from None


# ---- what ab.json holds -----------------------------------------------------------------------------


class TargetRecord(StrictModel):
    url: str
    model: str | None
    started: bool
    serve_args: list[str] | None = None
    log: str | None = None


class BlockRecord(StrictModel):
    """One block: one arm's replay of one pair's requests."""

    pair: int
    arm: Arm
    dir: str
    exit_code: int
    seconds: float
    requests: int = 0
    errors: int = 0
    client_bound: bool = False
    interrupted: bool = False


class ABRun(StrictModel):
    """``OUT/ab.json``: what the A/B run did, rewritten after every step, and its verdict."""

    schema_version: Literal[1] = 1
    started_at: str
    finished_at: str | None = None
    out: str
    corpus: InputRef | None = None
    distinct_requests: int | None = None
    block_pairs: int
    block_requests: int | None = None
    rate_rps: float | None = None
    bypass_cache: bool
    load: list[str] = Field(default_factory=list)
    """Every block's load options as flags (its corpus, size and stage aside; secrets never)."""
    unused: list[str] = Field(default_factory=list)
    """The recipe's settings an A/B run does not use."""
    order: list[str] = Field(default_factory=list)
    """The blocks in the order they run (``base/01``, ``candidate/01``, ``candidate/02`` …)."""
    targets: dict[str, TargetRecord] = Field(default_factory=dict)
    flush: dict[str, list[FlushRecord]] = Field(default_factory=dict)
    blocks: list[BlockRecord] = Field(default_factory=list)
    judgement: ABJudgement | None = None
    verdict: str | None = None
    exit_code: int | None = None
    message: str | None = None
    interrupted: bool = False


def chosen_metrics(ab: ABRecipe, pairs: int) -> tuple[list[Metric], list[str]]:
    """The metrics an A/B run of ``pairs`` request pairs judges, and the notes of those it leaves out:
    metrics named (``--metrics`` or the recipe) are all judged; of the defaults, only those the
    design can reach (:func:`harness.gates.ab.reachable`)."""
    metrics = parse_ab_metrics(ab.metrics)
    if "metrics" in ab.model_fields_set:
        return metrics, []
    return reachable(metrics, pairs)


# ---- running ----------------------------------------------------------------------------------------


class ABRunner:
    """Runs one :class:`ABSpec` (the module docstring's steps); :meth:`run` returns the record."""

    def __init__(self, spec: ABSpec, console: Console | None = None) -> None:
        self.spec = spec
        # Absolute: a started server runs in its log directory.
        self.out = spec.out.resolve()
        self.ui = Ui(console or cons.err())
        self.record = ABRun(
            started_at=datetime.now(UTC).isoformat(), out=str(spec.out), block_pairs=spec.ab.blocks,
            bypass_cache=spec.ab.bypass_cache,
        )  # fmt: skip
        self.metrics = parse_ab_metrics(spec.ab.metrics)
        self.left_out: list[str] = []

    def save(self) -> None:
        write_json(self.out / AB_FILE, self.record.model_dump(mode="json"))

    def run(self) -> ABRun:
        """Check, start both targets, flush, run the blocks, judge; ``ab.json`` after each step."""
        spec = self.spec
        plan = prepare(spec)
        if spec.force:
            clear_out_dir(self.out, OUTPUTS)
        self.out.mkdir(parents=True, exist_ok=True)
        files = self._write_blocks(plan)
        rec = self.record
        rec.corpus, rec.distinct_requests = plan.corpus, plan.distinct
        rec.block_requests, rec.rate_rps = len(plan.blocks[0]), plan.rate_rps
        rec.load = plan.load.to_args()
        rec.unused = spec.unused()
        rec.order = [f"{arm}/{pair:02d}" for pair, arm in order(spec.ab.blocks)]
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
                self._flush(targets)
                for pair, arm in order(spec.ab.blocks):
                    self._block(plan, targets[arm], arm, pair, files[pair - 1])
        except KeyboardInterrupt:
            self._finish(int(ExitCode.INTERRUPTED), "interrupted: the running block was finalized and the "
                         "servers stopped", interrupted=True)  # fmt: skip
            raise
        except HarnessError as exc:
            self._finish(int(exc.exit_code), str(exc))
            raise
        self._judge()
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
        files = []
        for j, records in enumerate(plan.blocks):
            path = folder / f"{j + 1:02d}.jsonl"
            with atomic_write(path, "wb", encoding=None) as fh:
                for r in records:
                    fh.write(orjson.dumps(r.model_dump(mode="json", exclude_none=True)) + b"\n")
            files.append(path)
        return files

    @contextmanager
    def _targets(self, plan: ABPlan) -> Iterator[dict[Arm, Target]]:
        """Both arms' targets, up at once for the whole run (base first; each stopped on every exit
        path, the candidate first)."""
        creds = plan.load.credentials()
        with ExitStack() as stack:
            out: dict[Arm, Target] = {}
            for arm in ARMS:
                log_dir = self.out / SERVER_DIR / arm
                self.ui.say(f"[bold]{arm}[/]")
                target = stack.enter_context(
                    open_target(
                        plan.targets[arm].url, plan.serve_args[arm], log_dir, self.ui,
                        self.spec.server_timeout_s, credentials=creds,
                    )
                )  # fmt: skip
                started = target.server is not None
                self.record.targets[arm] = TargetRecord(
                    url=target.url, model=target.model, started=started,
                    serve_args=plan.serve_args[arm] if started else None,
                    log=str(log_dir / "server.log") if started else None,
                )  # fmt: skip
                self.save()
                out[arm] = target
            yield out

    def _flush(self, targets: dict[Arm, Target]) -> None:
        for arm, target in targets.items():
            with self.ui.step(f"flushing the {arm}'s caches"):
                flushed = flush_all(target.client)
            self.record.flush[arm] = [FlushRecord.of(f) for f in flushed]
            for f in flushed:
                mark = "[green]✓[/] flushed" if f.status == "flushed" else "[yellow]–[/] not flushed:"
                self.ui.say(f"{mark} {arm}: {escape(f.detail)}")
        self.save()

    def _block(self, plan: ABPlan, target: Target, arm: Arm, pair: int, corpus: Path) -> None:
        spec = self.spec
        results = self.out / arm / f"{pair:02d}"
        n = len(plan.blocks[pair - 1])
        given = spec.recipe.load
        opts = plan.load.evolve(
            corpus=corpus, max_requests=n, stage=arm, results_dir=results,
            bypass_fraction=1.0 if spec.ab.bypass_cache else None,
            # A block is short: Locust's own start-up already gives the users time to spawn.
            start_delay=given.start_delay if given.is_set("start_delay") else 1.0,
        )  # fmt: skip
        load = LoadSpec(host=target.url, options=opts, processes=spec.recipe.launch.processes)
        self.ui.say(f"[dim]$ locust {escape(shlex.join(load.command()[3:]))}[/]")
        started = time.monotonic()
        try:
            with self.ui.phase(f"pair {pair}: {arm}", results / RECORDS_FILE, n):
                code = run_locust(load, timeout_s=spec.recipe.phase_timeout)
        except KeyboardInterrupt:  # run_locust let the child finalize its results first
            self._note_block(pair, arm, results, int(ExitCode.INTERRUPTED), started)
            raise
        block = self._note_block(pair, arm, results, code, started)
        summary_path, log = results / SUMMARY_FILE, results / "locust.log"
        name = f"the {arm}'s block {pair}"
        if code == int(ExitCode.TARGET_DIED) and summary_path.exists():
            died = read_summary(results).target_died
            if died is not None:
                raise TargetDied(f"{name}: {died.describe()}", file=summary_path)
        if code in ERRORS_BY_CODE:
            raise ERRORS_BY_CODE[code](f"{name} exited with {code}: {log_tail(log)}", file=log)
        if code == int(ExitCode.INTERRUPTED):
            raise UnavailableError(
                f"{name} did not end within {spec.recipe.phase_timeout:g} s and was stopped", file=log,
                hint="a larger --phase-timeout, or smaller blocks",
            )  # fmt: skip
        if not summary_path.exists():
            raise UnavailableError(f"{name} wrote no summary (exit {code}): {log_tail(log)}", file=log)
        mark = "[green]✓[/]" if code == 0 else "[yellow]![/]"
        self.ui.say(
            f"{mark} pair {pair} {arm}: {block.requests} requests, {block.errors} errors"
            + (", client-bound" if block.client_bound else "")
            + f" → {results}"
        )

    def _note_block(self, pair: int, arm: Arm, results: Path, code: int, started: float) -> BlockRecord:
        rec = BlockRecord(
            pair=pair, arm=arm, dir=str(results), exit_code=code, seconds=round(time.monotonic() - started, 3)
        )
        if (results / SUMMARY_FILE).exists():
            s = read_summary(results)
            rec = rec.model_copy(
                update={"requests": s.requests, "errors": s.errors, "client_bound": s.client_bound,
                        "interrupted": s.interrupted}
            )  # fmt: skip
        self.record.blocks.append(rec)
        self.save()
        return rec

    def _judge(self) -> None:
        from harness.gates.runs import load_result_set

        spec, ab = self.spec, self.spec.ab
        pairs = [
            (
                load_result_set(self.out / "base" / f"{j:02d}", f"base-{j:02d}"),
                load_result_set(self.out / "candidate" / f"{j:02d}", f"candidate-{j:02d}"),
            )
            for j in range(1, ab.blocks + 1)
        ]
        with self.ui.step("judging the ratios"):
            j = judge_ab(
                pairs, metrics=self.metrics, limit=ab.limit, detect=ab.detect,
                max_error_rate=ab.max_error_rate, confidence=spec.recipe.gate.confidence,
                resamples=spec.resamples, seed=spec.seed, left_out=self.left_out,
            )  # fmt: skip
        self.record.judgement = j
        self.record.verdict = j.verdict
        self._finish(j.exit_code, j.headline)
