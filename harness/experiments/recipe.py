"""A run as a file: the target, the load, the warm-up, the capacity search and the gate, each option
declared once.

A :class:`Recipe` is what ``harness run``, ``harness capacity``, ``harness ab`` (its ``ab`` section: two
targets, the blocks and the verdict's terms) and ``harness baseline calibrate`` are configured with (and
the target and load of ``harness analysis decay-sweep``). Every field is an
option, declared once with its type, default, validation and help; the commands' flags are generated
from the fields (:mod:`harness.common.options`), so ``--max-tokens-cap`` is the same option, with the
same words, in every command and in a recipe file::

    # a recipe for harness run (fixtures/recipes/paired.yaml is another)
    target:
      serve_args: --preset tiny --cache
    load:
      corpus: runs/corpus
      rate: 4
      duration: 100
      max_tokens_cap: 16
      plan: fixtures/plans/tiny.yaml
    gate:
      baseline: my-runner.yaml

``--recipe FILE`` reads such a file; flags given beside it override its values (:func:`resolve`). Paths
in a file are relative to the working directory, as on a command line. Secrets never go in a file
(``--api-key`` and ``--header`` values come from flags or the environment): a file that holds one is
refused, except the ``***`` that a written recipe shows in their place. Every run writes the recipe it
ran beside its results (:func:`write_recipe`: ``OUT/recipe.yaml``), so ``--recipe OUT/recipe.yaml``
runs it again.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from harness.common.auth import REDACTED, SECRET_OPTIONS
from harness.common.errors import ConfigError
from harness.common.io import atomic_write, read_yaml, yaml_line
from harness.common.model import StrictModel
from harness.common.options import Flag, Option, flag_for, merge, options_of
from harness.experiments.warmcheck import SEED_WARM_RATE
from harness.gates.ab import DEFAULT_METRICS, parse_ab_metrics
from harness.gates.slo import DEFAULT_SLO, parse_slo
from harness.load.options import LaunchOptions, LoadOptions, load_flags

RECIPE_FILE = "recipe.yaml"
DEFAULT_SERVE_ARGS = ("--preset", "tiny", "--cache")
TARGET_PANEL = "Target"
WARM_PANEL = "Warm-up and warm check"
CAPACITY_PANEL = "Capacity search"
GATE_PANEL = "Gate"
AB_TARGETS_PANEL = "Targets"
AB_PANEL = "A/B blocks and verdict"
EFFECT_PANEL = "Warmup effect"


class TargetRecipe(StrictModel):
    """The target: a ``harness serve`` to start, or a running OpenAI-compatible server."""

    serve_args: Annotated[str | None, Flag(panel=TARGET_PANEL, metavar="ARGS")] = Field(
        None,
        description='Start `harness serve` with these arguments (default "--preset tiny --cache"), on a '
        "free port, stopped at the end",
    )
    url: Annotated[str | None, Flag(panel=TARGET_PANEL)] = Field(
        None, description="Use this running OpenAI-compatible server instead of starting one"
    )

    @model_validator(mode="after")
    def _one_target(self) -> TargetRecipe:
        if self.url is not None and self.serve_args is not None:
            raise ValueError(
                "give a server to start (--serve-args, target.serve_args) or one to use (--url, target.url), "
                "not both"
            )
        return self

    @field_validator("serve_args", mode="before")
    @classmethod
    def _splits(cls, v: str | Mapping[str, Any] | None) -> str | None:
        return _check_split(v)

    def serve_argv(self) -> list[str] | None:
        """The ``harness serve`` arguments to start (``None``: ``url`` is used instead)."""
        if self.url is not None:
            return None
        return shlex.split(self.serve_args) if self.serve_args is not None else list(DEFAULT_SERVE_ARGS)


class WarmupRecipe(StrictModel):
    """The warm check before the warm phase (the warm-up itself is ``load.preload`` and ``load.plan``)."""

    probes: Annotated[int, Flag(panel=WARM_PANEL)] = Field(
        20, ge=1, description="Probe requests of the warm check (a seeded sample of the warm phase's)"
    )
    min_warm_rate: Annotated[float, Flag(panel=WARM_PANEL)] = Field(
        SEED_WARM_RATE, gt=0, le=1, description="Warm rate needed to call the target warm"
    )


class CapacityRecipe(StrictModel):
    """The capacity search (``harness capacity``, and ``harness run`` with ``--rate 50%``)."""

    slo: Annotated[str, Flag(panel=CAPACITY_PANEL)] = Field(
        DEFAULT_SLO,
        description="Comma-separated metric<=value terms: ttft/e2e/tpot/itl_p50|90|95|99 in ms or Nx the "
        "reference probe's, error_rate a share",
    )
    min_rate: Annotated[float | None, Flag(panel=CAPACITY_PANEL)] = Field(
        None, gt=0, description="First (reference) probe's rate; default: half of what one stream sustains"
    )
    max_rate: Annotated[float | None, Flag(panel=CAPACITY_PANEL)] = Field(
        None, gt=0, description="Probe no faster than this"
    )
    resolution: Annotated[float, Flag(panel=CAPACITY_PANEL)] = Field(
        0.10, gt=0, description="Stop when the bracket's high/low ≤ 1 + this"
    )
    max_probes: Annotated[int, Flag(panel=CAPACITY_PANEL)] = Field(12, ge=1, description="Probes at most")
    growth: Annotated[float, Flag(panel=CAPACITY_PANEL)] = Field(
        2.0, gt=1, description="Rate factor while bracketing"
    )
    probe_requests: Annotated[int, Flag(panel=CAPACITY_PANEL)] = Field(
        100, ge=1, description="Requests per probe (at least)"
    )
    probe_seconds: Annotated[float, Flag(panel=CAPACITY_PANEL)] = Field(
        5.0, ge=0, description="A probe lasts at least this long (more requests at high rates)"
    )
    flush: Annotated[bool, Flag(names=("--flush/--no-flush",), panel=CAPACITY_PANEL)] = Field(
        True, description="Empty the target's cache levels before each probe"
    )
    bypass_cache: Annotated[bool, Flag(names=("--bypass-cache/--use-cache",), panel=CAPACITY_PANEL)] = Field(
        True, description="Send probes with Cache-Control: no-cache (measure serving, not the response cache)"
    )
    calibration_requests: Annotated[int, Flag(panel=CAPACITY_PANEL)] = Field(
        4, ge=2, description="Requests sent one at a time to pick the start rate when --min-rate is not given"
    )

    @field_validator("slo")
    @classmethod
    def _slo_parses(cls, v: str) -> str:
        try:
            parse_slo(v)
        except ConfigError as exc:
            raise ValueError(exc.message) from None
        return v

    @model_validator(mode="after")
    def _rates_ordered(self) -> CapacityRecipe:
        if self.min_rate is not None and self.max_rate is not None and self.min_rate > self.max_rate:
            raise ValueError("min_rate is above max_rate")
        return self


class GateRecipe(StrictModel):
    """What judges the run: a baseline, and the confidence of every interval the run reports."""

    baseline: Annotated[Path | None, Flag(names=("--gate",), panel=GATE_PANEL)] = Field(
        None, description="Baseline YAML: judge both phases (cold, warm); JUnit + JSON in OUT"
    )
    confidence: Annotated[float, Flag(panel=GATE_PANEL)] = Field(
        0.95, ge=0.5, le=0.999, description="Confidence of every interval: the comparison, the warm check, "
        "the capacity probes, the A/B ratios",
    )  # fmt: skip


def _check_split(v: str | Mapping[str, Any] | None) -> str | None:
    """Serve arguments as one shell string: ``v`` when shell-style splitting takes it, or a mapping of
    ``harness serve``'s options by name (``{preset: tiny, cache: true}``) joined into one; else
    ``ValueError``."""
    if isinstance(v, Mapping):
        from harness.target.server.cli import serve_argv

        return shlex.join(serve_argv(dict(v)))
    if v is not None:
        try:
            shlex.split(v)
        except ValueError as exc:
            raise ValueError(f"cannot split: {exc}") from None
    return v


class ABTargets(StrictModel):
    """The two targets of ``harness ab``, declared once: each side a ``harness serve`` to start or a
    running server to reach (the base falls back to the recipe's ``target`` when neither is given)."""

    base_serve_args: Annotated[str | None, Flag(panel=AB_TARGETS_PANEL, metavar="ARGS")] = Field(
        None, description="Start the base (A) as `harness serve` with these arguments, on a free port"
    )
    base_url: Annotated[str | None, Flag(panel=AB_TARGETS_PANEL)] = Field(
        None, description="Use this running OpenAI-compatible server as the base (A)"
    )
    candidate_serve_args: Annotated[str | None, Flag(panel=AB_TARGETS_PANEL, metavar="ARGS")] = Field(
        None, description="Start the candidate (B) as `harness serve` with these arguments, on a free port"
    )
    candidate_url: Annotated[str | None, Flag(panel=AB_TARGETS_PANEL)] = Field(
        None, description="Use this running OpenAI-compatible server as the candidate (B)"
    )

    @field_validator("base_serve_args", "candidate_serve_args", mode="before")
    @classmethod
    def _splits(cls, v: str | Mapping[str, Any] | None) -> str | None:
        return _check_split(v)

    @model_validator(mode="after")
    def _one_per_side(self) -> ABTargets:
        for side in ("base", "candidate"):
            if getattr(self, f"{side}_serve_args") is not None and getattr(self, f"{side}_url") is not None:
                raise ValueError(f"give the {side} a server to start or one to use, not both")
        if self.base_url is not None and self.base_url.rstrip("/") == (self.candidate_url or "").rstrip("/"):
            raise ValueError(
                "the base and the candidate are the same server: the second arm would find the first "
                "one's requests in its caches (for an A/A check, start two with the same serve args)"
            )
        return self

    def side(self, arm: str) -> TargetRecipe | None:
        """``arm``'s target (``base`` or ``candidate``); ``None`` when neither flag gives it."""
        serve, url = getattr(self, f"{arm}_serve_args"), getattr(self, f"{arm}_url")
        if serve is None and url is None:
            return None
        return TargetRecipe(serve_args=serve, url=url)


class ABRecipe(ABTargets):
    """``harness ab``: the two targets, the blocks it interleaves, when it looks at them, and the
    verdict's terms (:mod:`harness.gates.ab`)."""

    blocks: Annotated[int, Flag(panel=AB_PANEL)] = Field(
        8, ge=2, description="Block pairs a look: each sends the same distinct requests to both targets, "
        "in the order A B B A A B …; no two pairs share a request. The verdict's t test has one degree "
        "of freedom fewer than the pairs: 4 leave it little power, 8 or more do not",
    )  # fmt: skip
    block_requests: Annotated[int | None, Flag(panel=AB_PANEL)] = Field(
        None, ge=1, description="Requests per block (default: the corpus's distinct requests split over "
        "every look's blocks, at most 50)",
    )  # fmt: skip
    looks: Annotated[int, Flag(panel=AB_PANEL)] = Field(
        1, ge=1, le=20, description="Looks at the verdict, one after every --blocks block pairs: the run "
        "stops at the first that decides; each spends an equal share of the false-alarm rate",
    )  # fmt: skip
    limit: Annotated[float, Flag(panel=AB_PANEL)] = Field(
        1.10, gt=0, description="Fail when a latency ratio candidate/base is proven above this"
    )
    detect: Annotated[float, Flag(panel=AB_PANEL)] = Field(
        1.30, gt=0, description="Pass only when a latency ratio of this size is ruled out"
    )
    metrics: Annotated[str, Flag(panel=AB_PANEL)] = Field(
        DEFAULT_METRICS, description="Comma-separated latency percentiles to compare (ttft/tpot/itl/e2e_pNN)"
    )
    max_error_rate: Annotated[float, Flag(panel=AB_PANEL)] = Field(
        0.01, ge=0, lt=1, description="Fail when the candidate's error rate is proven above this share"
    )
    detect_error_rate: Annotated[float, Flag(panel=AB_PANEL)] = Field(
        0.05, gt=0, lt=1, description="The candidate error rate whose detection power the verdict prints"
    )
    bypass_cache: Annotated[bool, Flag(names=("--bypass-cache/--use-cache",), panel=AB_PANEL)] = Field(
        True, description="Send every request with Cache-Control: no-cache (measure the engine, not the "
        "response cache)",
    )  # fmt: skip
    warm_requests: Annotated[int, Flag(panel=AB_PANEL)] = Field(
        0, ge=0, description="After the blocks, each arm sends this many of its requests again (the warm "
        "pass: hit and warm rates, errors; --gate judges them); 0: none. Needs --use-cache",
    )  # fmt: skip

    @model_validator(mode="after")
    def _warm_needs_cache(self) -> ABRecipe:
        if self.warm_requests and self.bypass_cache:
            raise ValueError(
                "a warm pass replays what the blocks stored: give --use-cache (bypass_cache: false)"
            )
        return self

    @field_validator("metrics")
    @classmethod
    def _metrics_known(cls, v: str) -> str:
        parse_ab_metrics(v)  # raises ValueError naming the unknown one
        return v

    @model_validator(mode="after")
    def _limit_below_detect(self) -> ABRecipe:
        if self.limit >= self.detect:
            raise ValueError(
                f"limit {self.limit:g} must be below detect {self.detect:g} (fail above the one, pass only "
                "when the other is ruled out)"
            )
        return self


class EffectRecipe(StrictModel):
    """``harness analysis effect``: a warmup planned from a history, measured on the window after it."""

    history_corpus: Annotated[Path | None, Flag(panel=EFFECT_PANEL)] = Field(
        None,
        description="Corpus of the traffic before the window (the plan's history); without it --split cuts "
        "the --corpus in time",
    )
    split: Annotated[float | None, Flag(panel=EFFECT_PANEL)] = Field(
        None, gt=0, lt=1, description="Cut the --corpus at this fraction of its time span: before is the "
        "history, after is the window replayed",
    )  # fmt: skip
    cache_capacity: Annotated[int | None, Flag(panel=EFFECT_PANEL)] = Field(
        None, ge=1, description="KV blocks (of the corpus's block size) the preload may fill; default: the "
        "target's prefix cache, read from its /metrics",
    )  # fmt: skip
    predictor: Annotated[str, Flag(panel=EFFECT_PANEL)] = Field(
        "recent", description="Reuse predictor of the plan: recent, frequency or replay"
    )
    policy: Annotated[str, Flag(panel=EFFECT_PANEL)] = Field(
        "lru", description="Eviction policy of the target's prefix cache, for the simulated prediction "
        "beside the measured hit rates (ours: HARNESS__ENGINE__PREFIX_EVICTION, lru or s3fifo)",
    )  # fmt: skip

    @model_validator(mode="after")
    def _one_history(self) -> EffectRecipe:
        if self.history_corpus is not None and self.split is not None:
            raise ValueError(
                "give a history corpus (--history-corpus) or a split of --corpus (--split), not both"
            )
        return self


class Recipe(StrictModel):
    """One experiment, as a file or as flags (module docstring)."""

    target: TargetRecipe = Field(default_factory=TargetRecipe)
    load: LoadOptions = Field(default_factory=LoadOptions)
    launch: LaunchOptions = Field(default_factory=LaunchOptions)
    warmup: WarmupRecipe = Field(default_factory=WarmupRecipe)
    capacity: CapacityRecipe = Field(default_factory=CapacityRecipe)
    gate: GateRecipe = Field(default_factory=GateRecipe)
    ab: ABRecipe = Field(default_factory=ABRecipe)
    effect: EffectRecipe = Field(default_factory=EffectRecipe)
    phase_timeout: float = Field(
        3600.0, ge=1, description="Seconds a load phase (or a capacity probe) may take at most"
    )

    def with_load(self, **changes: Any) -> Recipe:
        """This recipe with load options changed (validated: :meth:`LoadOptions.evolve`)."""
        return self.model_copy(update={"load": self.load.evolve(**changes)})


# ---- the commands' options ------------------------------------------------------------------------

EITHER: tuple[tuple[str, str, str], ...] = (
    ("target", "url", "serve_args"),
    ("ab", "base_url", "base_serve_args"),
    ("ab", "candidate_url", "candidate_serve_args"),
)
"""``(section, one, other)``: a target is a server to use or one to start, never both. A flag that
gives one replaces the recipe file's other (flags override the file: ``--candidate-url`` on the CI
recipe, which starts its candidate, uses that server instead)."""

RUN_OWN = frozenset({"results_dir", "stage", "warmup_id"})
"""Load options a run sets itself, per phase or probe: not the recipe's."""


def recipe_options(*, uses: Sequence[str], sections: Sequence[str], target: bool = True) -> list[Option]:
    """The options of a command that runs a recipe: the target (unless ``target`` is false: ``harness
    ab`` has two, its ``ab`` section's), the load options of its ``uses`` (:func:`load_flags`), the
    launcher's, and the recipe ``sections`` named (``warmup``, ``capacity``, ``gate``, ``ab``,
    ``phase_timeout``; ``gate.confidence`` alone as ``confidence``)."""
    opts = [
        *(options_of(TargetRecipe, at=("target",)) if target else []),
        *options_of(LoadOptions, at=("load",), only=load_flags(*uses)),
        *options_of(LaunchOptions, at=("launch",)),
    ]
    for section in sections:
        if section == "phase_timeout":
            opts += options_of(Recipe, only=["phase_timeout"])
        elif section == "confidence":
            opts += options_of(GateRecipe, at=("gate",), only=["confidence"])
        else:
            model = Recipe.model_fields[section].annotation
            assert isinstance(model, type)
            opts += options_of(model, at=(section,))
    return opts


RecipeFile = Annotated[
    Path | None,
    typer.Option(
        "--recipe",
        help="Recipe YAML (target, load, warmup, capacity, gate, ab: docs/cli.md); the flags given override "
        "it.",
    ),
]
"""``--recipe FILE``, the same on every command that runs a recipe."""


# ---- reading, resolving, writing ------------------------------------------------------------------


def resolve(file: Path | None, given: Mapping[str, Any], options: Sequence[Option] = ()) -> Recipe:
    """The recipe a command runs: ``file``'s (when given), with the flags ``given`` on top (a nested
    mapping by section, :func:`harness.common.options.with_options`), validated.

    A bad value names the flag that gave it (``ConfigError``, exit 4), or the file, line and field
    (``load.rate``) it came from."""
    data: dict[str, Any] = {}
    if file is not None:
        data = read_yaml(file, expected="a recipe (target, load, warmup, capacity, gate)", error=ConfigError)
        _check_no_secrets(file, data)
    for section, *pair in EITHER:
        for one, other in (pair, pair[::-1]):
            if _at(given, (section, one)) and _at(data, (section, other)):
                data = {**data, section: {k: v for k, v in data[section].items() if k != other}}
    merged = merge(data, given)
    for key in RUN_OWN:
        if key in merged.get("load", {}):
            raise ConfigError(
                "is set by the run itself (per phase or probe)",
                file=file,
                field=f"load.{key}",
                hint="--out names where the results go",
            )
    try:
        return Recipe.model_validate(merged)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = tuple(str(x) for x in err.get("loc", ()))
        msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
        dotted = ".".join(loc) or "recipe"
        flag = flag_for(options, loc) if _at(given, loc) else None
        if flag is not None:
            raise ConfigError(msg, field=flag) from None
        if file is not None and _at(data, loc):
            raise ConfigError(msg, file=file, line=yaml_line(file, loc), field=dotted) from None
        raise ConfigError(msg, field=dotted) from None


def check_corpus(recipe: Recipe, file: Path | None) -> Recipe:
    """``recipe``, refused when it names no corpus (every command that runs one replays a corpus)."""
    if recipe.load.corpus is None:
        raise ConfigError(
            "no corpus to replay", file=file, field="--corpus", hint="--corpus runs/corpus, or load.corpus"
        )
    return recipe


def _at(mapping: Mapping[str, Any], path: Sequence[str]) -> bool:
    """Whether ``mapping`` has a value at ``path``."""
    node: Any = mapping
    for part in path:
        if not isinstance(node, Mapping) or part not in node:
            return False
        node = node[part]
    return True


def _check_no_secrets(file: Path, data: Mapping[str, Any]) -> None:
    """Refuse a secret's value in a recipe file (``***``, a written recipe's placeholder, is dropped)."""
    load = data.get("load")
    if not isinstance(load, dict):
        return
    for name in SECRET_OPTIONS:
        value = load.get(name)
        if value is None:
            continue
        if value == REDACTED or (isinstance(value, list) and all(v == REDACTED for v in value)):
            del load[name]
            continue
        raise ConfigError(
            "a secret does not belong in a recipe file (it is shared, committed, printed)",
            file=file,
            field=f"load.{name}",
            hint=f"give --{name.replace('_', '-')} or its environment variable instead",
        )


def recipe_dump(recipe: Recipe) -> dict[str, Any]:
    """The recipe as a file holds it: the values that differ from the defaults, secrets as ``***``."""
    doc = recipe.model_dump(mode="json", exclude_defaults=True)
    load = doc.get("load", {})
    for name in SECRET_OPTIONS:
        value = getattr(recipe.load, name)
        if value:
            load[name] = [REDACTED] * len(value) if isinstance(value, list) else REDACTED
    return doc


def recipe_args(recipe: Recipe, options: Sequence[Option]) -> list[str]:
    """The flags that give ``recipe`` (its values that differ from the defaults), as a user would type
    them, secrets as ``***``: how a baseline's header names the recipe it was calibrated from."""
    doc = recipe_dump(recipe)
    args: list[str] = []
    for opt in options:
        node: Any = doc
        for part in opt.path:
            node = node.get(part) if isinstance(node, dict) else None
        if node is None or node == []:
            continue
        flag = opt.long
        if isinstance(node, bool):
            names = opt.flag.names[0] if opt.flag.names else flag
            on, _, off = names.partition("/")
            args.append(on if node else off or on)
            continue
        for value in node if isinstance(node, list) else [node]:
            args += [flag, str(value)]
    return args


def write_recipe(out: Path, recipe: Recipe, *, source: Path | None = None) -> Path:
    """Write ``OUT/recipe.yaml``: the recipe this run ran (``--recipe`` it to run it again)."""
    path = out / RECIPE_FILE
    header = [
        "# The recipe this run ran (harness.experiments.recipe): values that differ from the defaults.",
        f"# Resolved from {source} and the flags given." if source else "# Resolved from the flags given.",
        "# Secrets show as ***: give them again as flags or environment variables.",
    ]
    text = yaml.safe_dump(recipe_dump(recipe), sort_keys=False, allow_unicode=True)
    with atomic_write(path) as fh:
        fh.write("\n".join(header) + "\n" + text)
    return path
