"""What a paired run (:mod:`harness.experiments.paired`) is configured with (a
:class:`~harness.experiments.recipe.Recipe`), and the checks of every input and option before a server
starts or a request is sent (step 1, "check"). The steps that follow are
:class:`~harness.experiments.paired.PairedRunner`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from harness.common.errors import ConfigError, InputError
from harness.common.io import iter_jsonl, validation_input_error
from harness.common.openai import ChatCompletionRequest, CompletionRequest
from harness.experiments.driver import check_out_dir, check_serve_args
from harness.experiments.paired_record import OUTPUTS
from harness.experiments.recipe import Recipe
from harness.load.inputs import Inputs
from harness.load.options import Share
from harness.load.run_summary import InputRef
from harness.load.runner import LoadSpec

if TYPE_CHECKING:
    from harness.gates.baseline import Baseline


@dataclass
class PairedSpec:
    """A paired run: the :class:`~harness.experiments.recipe.Recipe` it runs, where its results go,
    and the few settings that are the runner's own."""

    recipe: Recipe
    out: Path
    force: bool = False
    """Replace the outputs of an earlier run in ``out``."""
    source: Path | None = None
    """The recipe file it was read from (``None``: flags only), for the recipe written to ``out``."""
    server_timeout_s: float = 300.0
    seed: int = 0
    """Seed of the warm check's probe sample."""

    @cached_property
    def load(self) -> LoadSpec:
        """The load options of both phases (corpus, schedule or rate, caps …); ``host``,
        ``results_dir`` and ``stage`` are set per phase. The warm-up's (``plan``, ``preload``) are the
        run's to post between the phases, not a phase's; the capacity only where a share needs it."""
        opts = self.recipe.load
        strip: dict[str, None] = {"plan": None, "preload": None}
        if not self.needs_capacity():
            strip["capacity"] = None  # the phases' recipes record rate_of_capacity only for shares
        return LoadSpec(host="", options=opts.evolve(**strip), processes=self.recipe.launch.processes)

    @property
    def rate_share(self) -> float | None:
        """``--rate 50%``: the constant rate is this share of the target's capacity."""
        rate = self.recipe.load.rate
        return rate.fraction if isinstance(rate, Share) else None

    @property
    def plan(self) -> Path | None:
        return self.recipe.load.plan

    @property
    def preload(self) -> Path | None:
        return self.recipe.load.preload

    @property
    def capacity(self) -> float | None:
        """``--capacity N`` (requests/s); ``None``: measured first when a share of it is asked for."""
        return self.recipe.load.capacity

    @property
    def gate(self) -> Path | None:
        return self.recipe.gate.baseline

    @property
    def confidence(self) -> float:
        return self.recipe.gate.confidence

    def plan_shares(self) -> bool:
        """Whether the ladder plan gives stages as shares of capacity (``qps: 50%``)."""
        from harness.load.plan import share_stages

        return self.plan is not None and bool(share_stages(self.plan))

    def needs_capacity(self) -> bool:
        return self.rate_share is not None or self.plan_shares()


@dataclass
class Prepared:
    """What the checks read and computed, for the run."""

    inputs: Inputs
    """The corpus and schedule, read once here and handed on (the warm check's probes, a capacity
    measurement, the phases planned again once the rate is known)."""
    planned: list[int]
    """The request index of each arrival of a phase (cold and warm send the same)."""
    ladder_requests: int | None
    serve_args: list[str] | None
    refs: dict[str, InputRef] = field(default_factory=dict)
    phase_load: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per-phase load options on top of the spec's (``cold``/``warm``: what ``--until-precision``
    watches in that phase, from the baseline's gates)."""


def check_preload(path: Path) -> int:
    """Validate a preload file as the server will (one OpenAI request body a line, plus optional
    ``completion`` and ``tenant``), naming file, line and field; returns its number of lines."""
    n = 0
    for number, obj in iter_jsonl(path, expected="an OpenAI request body"):
        body = dict(obj)
        for key in ("completion", "tenant"):
            if body.get(key) is not None and not isinstance(body[key], str):
                raise InputError(f"'{key}' must be a string", file=path, line=number, field=key)
            body.pop(key, None)
        body.pop("stream", None)
        body.pop("stream_options", None)
        cls = ChatCompletionRequest if "messages" in body else CompletionRequest
        if "messages" not in body and "prompt" not in body:
            raise InputError("expected 'prompt' or 'messages'", file=path, line=number)
        try:
            cls.model_validate(body)
        except ValidationError as exc:
            raise validation_input_error(
                exc, file=path, line=number, expected="an OpenAI request body"
            ) from None
        n += 1
    if n == 0:
        raise InputError("the preload file has no lines", file=path)
    return n


def prepare(spec: PairedSpec) -> Prepared:
    """Check every input and option before a server starts or a request is sent."""
    from harness.gates.baseline import read_baseline
    from harness.load.plan import read_plan

    check_out_dir(spec.out, OUTPUTS, force=spec.force, holds="an earlier run")
    opts = spec.load.options
    if spec.rate_share is not None and spec.capacity is None:
        # Until the capacity is measured (once the target is up) any capacity checks the other inputs.
        opts = opts.evolve(capacity=1.0)
    # The load stage's own checks and arrival rules: what is planned here is what the replay sends.
    inputs = Inputs.load(opts, ladder=False)
    planned = inputs.planned() or []
    if not planned:
        raise ConfigError(
            "the schedule sends no request (check --duration / --max-requests)", field="--duration"
        )
    refs: dict[str, InputRef] = {}
    assert opts.corpus is not None  # Inputs.load refuses a run without one
    corpus_file = opts.corpus / "corpus.jsonl" if opts.corpus.is_dir() else opts.corpus
    refs["corpus"] = InputRef.of(corpus_file)
    if opts.schedule is not None:
        refs["schedule"] = InputRef.of(opts.schedule)
    ladder_requests = None
    if spec.plan is not None:
        # A plan in shares of capacity is checked against a stand-in until the capacity is known.
        plan = read_plan(spec.plan, capacity=spec.capacity or (1.0 if spec.plan_shares() else None))
        ladder_requests = round(sum(s.qps * s.duration_s for s in plan.stages))
        refs["plan"] = InputRef.of(spec.plan)
    if spec.preload is not None:
        check_preload(spec.preload)
        refs["preload"] = InputRef.of(spec.preload)
    baseline = None
    if spec.gate is not None:
        baseline = read_baseline(spec.gate)
        refs["baseline"] = InputRef.of(spec.gate)
    argv = spec.recipe.target.serve_argv()
    serve_args = None if argv is None else check_serve_args(argv)
    phase_load = _precision_per_phase(spec, baseline)
    return Prepared(inputs, planned, ladder_requests, serve_args, refs, phase_load)


def _precision_per_phase(spec: PairedSpec, baseline: Baseline | None) -> dict[str, dict[str, Any]]:
    """With ``--until-precision`` and ``--gate`` but no ``--precision-on``: each phase watches the
    percentiles its gates judge, at the baseline's confidence and ``min_samples``, so it stops as
    soon as those gates can judge it. A phase with no percentile gate watches the load default."""
    from harness.gates.baseline import precision_min_samples, precision_targets
    from harness.load.precision import format_precision_on

    load = spec.load.options
    if load.until_precision is None or baseline is None:
        return {}
    out: dict[str, dict[str, Any]] = {}
    for phase in ("cold", "warm"):
        opts: dict[str, Any] = {}
        targets = precision_targets(baseline, phase)
        # What the command line gave stays; what it left to the defaults follows the baseline.
        if not load.is_set("precision_on") and targets:
            opts["precision_on"] = format_precision_on(targets)
        if not load.is_set("precision_confidence"):
            opts["precision_confidence"] = baseline.confidence
        floor = precision_min_samples(baseline, phase)
        if not load.is_set("precision_min_samples") and floor is not None:
            opts["precision_min_samples"] = floor
        out[phase] = opts
    return out
