"""What an A/B run (:mod:`harness.experiments.ab`) is configured with, and its step 1, "check".

:class:`ABSpec` is a :class:`~harness.experiments.recipe.Recipe` (its ``ab`` section, load, launcher,
``capacity`` and ``gate``), ``--out`` and the runner's own settings. :func:`prepare` reads and checks
every input and option (the corpus, the load options, both targets' serve arguments, the gate file,
``--out``) before a server starts or a request is sent, and returns the :class:`ABPlan`: each block
pair's distinct requests (one per prompt, drawn seeded from the corpus, no two pairs sharing one), the
blocks' rate, both targets and the gate file, read once. :func:`order` is the order the blocks run in
(A B, B A, A B …) and :func:`chosen_metrics` the metrics the design can judge. The steps that follow
are :class:`~harness.experiments.ab.ABRunner`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from harness.common.errors import ConfigError, InputError
from harness.corpus.model import CorpusRecord
from harness.experiments.ab_record import ARMS, CAPACITY_DIR, OUTPUTS, Arm
from harness.experiments.capacity import CapacitySpec
from harness.experiments.driver import check_out_dir, check_serve_args
from harness.experiments.recipe import ABRecipe, Recipe, TargetRecipe
from harness.gates.ab import parse_ab_metrics, reachable
from harness.gates.ab_stats import DEFAULT_RESAMPLES, DEFAULT_SEED
from harness.gates.baseline import Baseline, read_baseline
from harness.gates.metrics import Metric
from harness.load.inputs import Inputs
from harness.load.options import LoadOptions, Share
from harness.load.run_summary import InputRef

DEFAULT_BLOCK_REQUESTS = 50
"""Requests per block when ``--block-requests`` is not given (fewer when the corpus is short)."""
UNUSED_LOAD: tuple[str, ...] = (
    "schedule", "duration", "max_requests", "speedup", "plan", "preload", "until_precision",
    "precision_on", "precision_confidence", "precision_min_samples", "history", "salt_per_pass",
    "bypass_fraction",
)  # fmt: skip
"""Load options a recipe file may hold that an A/B run sets itself or has no use for (warned about,
then unset): each block sends its own requests once, at the recipe's rate."""
UNUSED_SECTIONS: tuple[str, ...] = ("warmup",)


@dataclass
class ABSpec:
    """An A/B run: the :class:`~harness.experiments.recipe.Recipe` it runs (its ``ab`` section, load,
    launcher, ``capacity`` section when a share of capacity is asked for, and ``gate``), where its
    results go, and the runner's own settings."""

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

    def measures_capacity(self) -> bool:
        """``--rate N%`` without ``--capacity``: the base's capacity is measured first."""
        load = self.recipe.load
        return isinstance(load.rate, Share) and load.capacity is None

    def unused(self) -> list[str]:
        """The recipe's settings an A/B run does not use (``load.duration``, ``warmup.plan`` …)."""
        r = self.recipe
        out = [f"load.{name}" for name in UNUSED_LOAD if r.load.is_set(name)]
        out += [f"{s}.{name}" for s in UNUSED_SECTIONS for name in sorted(getattr(r, s).model_fields_set)]
        if not self.measures_capacity():
            out += [f"capacity.{name}" for name in sorted(r.capacity.model_fields_set)]
        return out


@dataclass
class ABPlan:
    """What the checks read and decided, for the run."""

    load: LoadOptions
    """Every block's load options but its corpus, size, stage and results directory."""
    blocks: list[list[CorpusRecord]]
    """Block pair ``j``'s records (distinct prompts; no two pairs share one), for every look."""
    distinct: int
    """Distinct prompts in the corpus."""
    rate_rps: float | None
    """Each block's rate; ``None`` until the base's capacity is measured (:attr:`share`)."""
    serve_args: dict[Arm, list[str] | None]
    targets: dict[Arm, TargetRecipe]
    corpus: InputRef
    share: Share | None = None
    """``--rate N%`` of the base's capacity, measured in the run."""
    baseline: Baseline | None = None
    """``--gate FILE``: judged on the candidate's pooled blocks and warm pass."""


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
            hint="--rate 4 (requests/s), or --rate 70% (of the base's capacity, measured first)",
        )  # fmt: skip
    share = load.rate if spec.measures_capacity() and isinstance(load.rate, Share) else None
    if share is not None:
        from harness.experiments.capacity import check_spec

        check_spec(CapacitySpec(spec.recipe, out=spec.out / CAPACITY_DIR))  # the SLO, before anything starts
    # The load stage's own checks (a tokenizer …) on the corpus, read once; a share of a capacity still
    # to be measured is checked at a placeholder capacity.
    probe = load.evolve(max_requests=1, capacity=1.0) if share is not None else load.evolve(max_requests=1)
    inputs = Inputs.load(probe, ladder=False)
    corpus_file = load.corpus / "corpus.jsonl" if load.corpus.is_dir() else load.corpus
    if inputs.sessions is not None:
        raise ConfigError(
            "an A/B run replays single requests; a session corpus's turns depend on each other's answers",
            file=corpus_file, field="--corpus",
        )  # fmt: skip
    distinct = distinct_records(inputs.records, corpus_file)
    ab = spec.ab
    pairs = ab.blocks * ab.looks
    n = ab.block_requests
    if n is None:
        n = min(DEFAULT_BLOCK_REQUESTS, len(distinct) // pairs)
    if n < 1 or n * pairs > len(distinct):
        raise ConfigError(
            f"{ab.looks} look(s) of {ab.blocks} block pairs of {n} distinct requests need {pairs * n}; the "
            f"corpus has {len(distinct)} distinct prompts",
            field="--block-requests" if ab.block_requests is not None else "--blocks",
            hint="fewer --looks, --blocks or --block-requests, or a larger corpus (harness corpus build --n)",
        )
    if ab.warm_requests > n * pairs:
        raise ConfigError(
            f"a warm pass of {ab.warm_requests} requests a side needs as many block requests; the blocks "
            f"hold {n * pairs}", field="--warm-requests",
        )  # fmt: skip
    # Seeded, so the blocks are a fair sample of a corpus ordered by scenario, and a rerun sends the same.
    picked = np.random.default_rng(load.seed).permutation(len(distinct))[: n * pairs]
    blocks = [[distinct[i] for i in sorted(picked[j * n : (j + 1) * n].tolist())] for j in range(pairs)]
    rate = None if share is not None else inputs.rate
    serve_args: dict[Arm, list[str] | None] = {}
    for arm in ARMS:
        argv = targets[arm].serve_argv()
        serve_args[arm] = None if argv is None else _checked_serve_args(argv, arm)
    baseline = read_baseline(spec.recipe.gate.baseline) if spec.recipe.gate.baseline is not None else None
    return ABPlan(
        load, blocks, len(distinct), rate, serve_args, targets, InputRef.of(corpus_file), share, baseline
    )


def _checked_serve_args(argv: list[str], arm: Arm) -> list[str]:
    try:
        return check_serve_args(argv)
    except ConfigError as exc:
        raise ConfigError(exc.message, field=f"--{arm}-serve-args", hint=exc.hint) from None


def chosen_metrics(ab: ABRecipe, pairs: int) -> tuple[list[Metric], list[str]]:
    """The metrics an A/B run of ``pairs`` request pairs judges, and the notes of those it leaves out:
    metrics named (``--metrics`` or the recipe) are all judged; of the defaults, only those the
    design can reach (:func:`harness.gates.ab.reachable`)."""
    metrics = parse_ab_metrics(ab.metrics)
    if "metrics" in ab.model_fields_set:
        return metrics, []
    return reachable(metrics, pairs)
