"""``harness analysis effect``: the three replays of :mod:`harness.analysis.effect` against one target.

The steps are a paired run's (:class:`harness.experiments.paired.PairedRunner`: check every input
first, start or reach the target, replay phases in headless Locust, ``run.json`` rewritten after
each step, Ctrl-C finalizes the running phase); only what happens between them differs:

1. the history and the window are written to ``OUT/history/corpus.jsonl`` and
   ``OUT/window/corpus.jsonl`` (the window is what every pass replays);
2. once the target is up, its prefix cache's capacity is read (``--cache-capacity`` or its
   ``/metrics``) and the plan is made (:func:`harness.analysis.effect.plan_effect`);
3. for each of ``cold``, ``planned``, ``oracle``: flush every cache level, send that pass's preload
   (``OUT/<pass>/preload.jsonl``: prefix-only requests, ``Cache-Control: no-cache``), replay the
   window → ``OUT/<pass>``;
4. ``OUT/effect.json`` (:class:`~harness.analysis.effect.EffectReport`), and with ``--gate`` the
   three passes judged (labels ``cold``, ``planned``, ``oracle``; ``reference`` is the cold pass, so
   ``warm_gain_ttft_p95`` and the ``*_rel`` ratios divide by it).

Exit codes: 0 pass (or measured, without ``--gate``); 1 a gate proved a regression; 6 a gate could not
judge; 2–5 and 130 as ``harness run``.
"""

from __future__ import annotations

import math
from pathlib import Path

from rich.console import Console
from rich.table import Table

from harness.analysis.effect import (
    HEADS,
    PASSES,
    EffectPlan,
    EffectReport,
    Split,
    block_tokens,
    measure_effect,
    pair_records,
    plan_effect,
    split_records,
    write_records,
)
from harness.common import headers as H
from harness.common.errors import ConfigError, ExitCode, InputError, UnavailableError
from harness.common.io import write_json
from harness.corpus.model import read_corpus
from harness.experiments.driver import check_out_dir, clear_out_dir
from harness.experiments.paired import PairedRunner
from harness.experiments.paired_record import FlushRecord, GateRecord
from harness.experiments.paired_spec import PairedSpec, Prepared
from harness.experiments.target import Target, flush_all
from harness.gates.judge import GateReport
from harness.load.arrivals import prepare_requests
from harness.load.results import read_records

EFFECT_FILE = "effect.json"
EFFECT_OUTPUTS = (*PASSES, "history", "window", EFFECT_FILE)
"""What ``harness analysis effect`` writes under ``OUT`` beside a paired run's files."""
PRELOAD_FILE = "preload.jsonl"


def _corpus_file(path: Path) -> Path:
    return path / "corpus.jsonl" if path.is_dir() else path


def read_split(corpus: Path, history: Path | None, split: float | None) -> Split:
    """The history and window of a run: ``history`` and ``corpus`` apart, or ``corpus`` cut at ``split``."""
    window_file = _corpus_file(corpus)
    records = list(read_corpus(window_file))
    if history is not None:
        hist_file = _corpus_file(history)
        return pair_records(list(read_corpus(hist_file)), records, (str(hist_file), str(window_file)))
    if split is None:
        raise ConfigError(
            "no history to plan from",
            field="--split",
            hint="--split 0.75 (the first 75 % of the time span is the history), or --history-corpus",
        )
    return split_records(records, split, str(window_file))


def target_capacity(target: Target, tokens_per_block: int) -> tuple[int, str]:
    """The target's prefix-cache capacity in blocks of ``tokens_per_block`` tokens, from its
    ``/metrics`` (ours: ``harness_engine_kv_blocks_total`` × ``harness_engine_block_size``)."""
    from harness.common.prometheus import parse_exposition

    names = ("harness_engine_kv_blocks_total", "harness_engine_block_size")
    try:
        samples = parse_exposition(target.client.metrics(), names)
    except UnavailableError as exc:
        raise ConfigError(
            f"the target's capacity cannot be read ({exc})", field="--cache-capacity",
            hint="give it: --cache-capacity BLOCKS",
        ) from None  # fmt: skip
    got = {s.name: s.value for s in samples}
    if not all(n in got for n in names):
        raise ConfigError(
            "the target's /metrics does not say how many KV blocks its prefix cache holds",
            field="--cache-capacity",
            hint="give it: --cache-capacity BLOCKS (in blocks of the corpus's block size)",
        )
    tokens = got["harness_engine_kv_blocks_total"] * got["harness_engine_block_size"]
    return max(1, int(tokens // tokens_per_block)), "the target's /metrics"


class EffectRunner(PairedRunner):
    """A paired run whose phases are the window's cold, planned and oracle passes (module docstring)."""

    def __init__(self, spec: PairedSpec, split: Split, console: Console | None = None) -> None:
        tokens_per_block = block_tokens([*split.window, *split.history])
        if tokens_per_block is None:
            raise InputError(
                "no record carries shared KV blocks (prefix_block_ids): no preload can differ from none",
                file=spec.recipe.load.corpus,
                hint="build it from a trace with hash_ids: harness corpus build --trace T --block-tokens 16",
            )
        out = spec.out
        check_out_dir(out, EFFECT_OUTPUTS, force=spec.force, holds="an earlier effect run")
        if spec.force:
            clear_out_dir(out, EFFECT_OUTPUTS)
        out.mkdir(parents=True, exist_ok=True)
        write_records(out / "history" / "corpus.jsonl", split.history)
        window = write_records(out / "window" / "corpus.jsonl", split.window)
        recipe = spec.recipe.with_load(corpus=window)
        super().__init__(
            PairedSpec(recipe, out=out, force=spec.force, source=spec.source, seed=spec.seed), console
        )
        self.split = split
        self.tokens_per_block = tokens_per_block
        source = spec.recipe.load.corpus
        load_tok = spec.recipe.load.tokenizer
        self.tokenizer = (corpus_tokenizer(source) if source is not None else None) or (
            str(load_tok) if load_tok is not None else None
        )
        self.capacity = spec.recipe.effect.cache_capacity
        self.capacity_source = "given"
        self.predictor = spec.recipe.effect.predictor
        self.plan: EffectPlan | None = None
        self.report: EffectReport | None = None

    def _measure(self, target: Target, prep: Prepared) -> None:
        spec = self.spec
        if self.capacity is None:
            self.capacity, self.capacity_source = target_capacity(target, self.tokens_per_block)
        with self.ui.step(
            f"planning from {len(self.split.history)} history requests ({self.capacity} blocks)"
        ):
            self.plan = plan = plan_effect(
                self.split,
                self.capacity,
                predictor=self.predictor,
                policy=spec.recipe.effect.policy,
                tokenizer=self.tokenizer,
            )
        self.ui.say(
            f"[green]✓[/] plan: {len(plan.planned)} prefix requests ({plan.planned_blocks} blocks) planned, "
            f"{len(plan.oracle)} ({plan.oracle_blocks} blocks) for the oracle; simulated block hit rate "
            f"cold {plan.prediction.cold:.1%}, planned {plan.prediction.planned:.1%}, "
            f"oracle {plan.prediction.oracle:.1%}"
        )
        replay = spec.load.replace(host=target.url, admin_token=target.credentials.admin_token)
        opts = spec.load.options
        for name in PASSES:
            with self.ui.step(f"{name}: flushing every cache level"):
                flushed = flush_all(target.client)
            self.record.flush = [FlushRecord.of(f) for f in flushed]
            preload = {"cold": [], "planned": plan.planned, "oracle": plan.oracle}[name]
            if preload:
                (self.out / name).mkdir(parents=True, exist_ok=True)
                write_records(self.out / name / PRELOAD_FILE, preload)
                specs = prepare_requests(
                    preload, api=opts.api, model=prep.inputs.model, max_tokens_cap=1,
                    token_counting=opts.token_counting, seed_policy=opts.seed_policy,
                )  # fmt: skip
                with self.ui.step(f"{name}: preloading {len(specs)} prefixes"):
                    got = target.client.probe(
                        specs, no_cache=True, concurrency=min(4, opts.concurrency), stage="preload",
                        priority=H.PRELOAD_PRIORITY,
                    )  # fmt: skip
                failed = [p for p in got if not p.ok]
                if failed:
                    raise UnavailableError(
                        f"{len(failed)} of {len(got)} preload requests failed: "
                        f"{failed[0].error or failed[0].status}",
                        file=self.out / name / PRELOAD_FILE,
                    )
                self.ui.say(f"[green]✓[/] {name}: {len(specs)} prefixes preloaded")
            self.save()
            self._phase(name, replay.replace(stage=name), len(prep.planned))

    def _judge(self) -> None:
        from harness.gates import gate_runs

        assert self.plan is not None
        plan, spec = self.plan, self.spec
        passes = {name: list(read_records(self.out / name)) for name in PASSES}
        heads = measure_effect(passes, self.split.window, confidence=spec.confidence, seed=spec.seed)
        window = self.split.window
        notes = [
            f"capacity {plan.capacity} blocks of {self.tokens_per_block} tokens ({self.capacity_source})",
            "preloads are prefix-only requests sent with Cache-Control: no-cache: only the KV prefix cache "
            "differs between the passes",
        ]
        self.report = EffectReport(
            history_requests=len(self.split.history),
            window_requests=len(window),
            window_span_s=float(window[-1].arrival_offset_s or 0.0) if window else 0.0,
            cut_s=None if math.isnan(self.split.cut_s) else self.split.cut_s,
            capacity_blocks=plan.capacity,
            block_tokens=self.tokens_per_block,
            predictor=self.predictor,
            preload_requests={"cold": 0, "planned": len(plan.planned), "oracle": len(plan.oracle)},
            preload_blocks={"cold": 0, "planned": plan.planned_blocks, "oracle": plan.oracle_blocks},
            preload_used=plan.preload_used,
            predicted_block_hit_rate=plan.prediction,
            simulated=plan.report,
            heads=heads,
            confidence=spec.confidence,
            notes=notes,
        )
        write_json(self.out / EFFECT_FILE, self.report.model_dump(mode="json"))
        code, message = ExitCode.OK, _headline(self.report)
        if spec.gate is not None:
            junit, verdict = self.out / "gate.junit.xml", self.out / "gate.json"
            runs = {name: self.out / name for name in PASSES} | {"reference": self.out / "cold"}
            report: GateReport = gate_runs(runs, spec.gate, junit=junit, json_path=verdict)
            self.gate_report = report
            self.record.gate = GateRecord(
                verdict=report.verdict, exit_code=report.exit_code, headline=report.headline(),
                junit=str(junit), verdict_json=str(verdict),
            )  # fmt: skip
            code = ExitCode(report.exit_code)
            message = f"{message}; gate: {report.headline()}"
        self.record.exit_code, self.record.message = int(code), message


def corpus_tokenizer(corpus: Path) -> str | None:
    """The tokenizer a corpus was built with (its ``manifest.json``, when beside it and the file is
    there): the one its ``prefix_tokens`` count in, so the one a prefix is cut with."""
    import orjson

    manifest = (corpus if corpus.is_dir() else corpus.parent) / "manifest.json"
    try:
        path = orjson.loads(manifest.read_bytes()).get("tokenizer")
    except (OSError, orjson.JSONDecodeError, AttributeError):
        return None
    return str(path) if isinstance(path, str) and Path(path).exists() else None


def _headline(report: EffectReport) -> str:
    first = report.head(HEADS[0])
    g = first.gain_p95.get("planned")
    o = first.gain_p95.get("oracle")
    if g is None or g.value is None:
        return "measured (no planned gain: too few requests in the first window)"
    share = report.realized_share_of_oracle(HEADS[0])
    of = (
        f", {share:.0%} of the oracle's {o.value:.0%}"
        if share is not None and o is not None and o.value
        else ""
    )
    return f"first {HEADS[0]:.0%} of the window: planned preload cut TTFT P95 by {g.value:.0%}{of}"


def effect_table(report: EffectReport) -> Table:
    """The effect as a rich table (:meth:`EffectReport.rows`)."""
    from harness.common.console import table

    return table(
        f"Warmup effect: {report.window_requests} window requests, capacity {report.capacity_blocks} blocks",
        report.COLUMNS,
        report.rows(),
    )
