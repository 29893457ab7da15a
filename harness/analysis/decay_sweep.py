"""The live QPS-decay sweep: one saturating load stage per cache-miss rate, measured, then fitted.

Issue #12's "QPS decay": how much throughput does a cached service lose as its cache-miss rate (CMR)
grows? :func:`run_sweep` answers it against a live target:

1. **Warm.** Every corpus record's request, shaped exactly as the load stage will send it
   (:func:`harness.load.arrivals.preload_line`: same endpoint, model, capped ``max_tokens`` and
   sampling fields, which the cache keys on), is posted to ``POST /cache/preload`` (``preload.jsonl``
   in the output directory; ``harness cache preload`` accepts the same file). The server generates
   and stores each answer, so every request that does not bypass the cache can hit.
2. **One stage per requested bypass fraction** ``f`` (``--cmr 0,0.25,…``): a headless Locust run
   (:func:`harness.load.runner.run_locust`, ``locustfiles/replay.py``) with ``--bypass-fraction f``:
   that share of arrivals, chosen per arrival from the seed (:func:`harness.load.arrivals.bypasses`),
   carries ``Cache-Control: no-cache``, which the cache answers with ``BYPASS`` and the engine serves.
3. **Measure** each stage from its records (:func:`measure_stage`), in the window
   ``[settle_s, duration_s)`` of the run's epoch: the CMR is *measured* (share of the requests sent
   in the window whose ``x-cache`` was ``MISS`` or ``BYPASS``), not assumed from ``f``, and the QPS is
   the successful requests *completed* in the window per second.
4. **Fit** ``QPS = QPS0 · exp(−k · CMR²)`` (:func:`harness.analysis.decay.fit_decay`: Levenberg–
   Marquardt, ``k`` with its interval, residuals) and plot it.

**Saturating an open-loop generator.** The load stage is open loop: arrivals are released at their
intended times whatever the responses do, and the Locust users are only a pool of ``concurrency``
request slots. A stage offers a rate far above what the target can serve (``rate``, default 1000/s)
with a fixed pool: every user is always busy, the arrivals that find no free user wait in the pacer's
bounded queue, and the target always has exactly ``concurrency`` requests in flight — a closed system
whose completion rate *is* the target's capacity at that concurrency. The stage's send window is cut
at ``duration_s`` with Locust's ``--run-time`` (the arrivals still queued are dropped, the requests in
flight finish), so the backlog never drains into the next stage. Lateness (``sent − intended``) grows
through the whole stage, recorded as queue wait (``queue_wait_ms``: no user was free), and the run's
summary warns ``saturated:``: both are **expected here** — they measure the backlog, not a slow
client — and the sweep ignores them. What it does check: a
stage counts as saturated only when the target sent fewer than 90 % of the offered arrivals in the
window (otherwise the target kept up and the number is the offered rate, not the capacity: such a
stage runs again at ``RATE_RAISE`` times the rate, at most ``rate_raises`` times), and the client's
CPU (over 90 % the client, not the target, set the pace).

Choose ``concurrency`` like a real deployment's client concurrency (the capacity depends on it: at
most the engine's batch, ``--max-num-seqs``, plus its queue before the server answers 429).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BeforeValidator, Field

from harness.analysis.decay import (
    MISS_STATUSES,
    DecayFit,
    DecayPoint,
    MixtureFit,
    fit_decay,
    fit_mixture,
    plot_decay,
)
from harness.common.auth import SECRET_OPTIONS
from harness.common.errors import (
    ConfigError,
    InputError,
    UnavailableError,
)
from harness.common.io import write_json, write_jsonl
from harness.common.model import StrictModel
from harness.common.options import Flag
from harness.common.stats import percentile
from harness.experiments.recipe import Recipe
from harness.load.arrivals import is_sampled
from harness.load.options import LoadOptions, Share

if TYPE_CHECKING:  # httpx and the load stage's client: imported when a sweep runs
    from harness.corpus.model import CorpusRecord
    from harness.load.target import TargetClient

DEFAULT_RATE = 1000.0
"""Offered arrivals/s of a stage: far above what a single inference server serves per client pool."""
RATE_RAISE = 4.0
"""Factor on the offered rate when a stage was not saturated."""
SATURATED_SENT_SHARE = 0.9
"""A stage is saturated when fewer than this share of its offered arrivals went out in the window."""
CLIENT_CPU_LIMIT_PCT = 90.0
PRELOAD_FILE = "preload.jsonl"
POINTS_FILE = "points.jsonl"
FIT_FILE = "fit.json"
PLOT_FILE = "decay.png"
STAGES_DIR = "stages"


def _fractions(value: Any) -> Any:
    """``"0,0.25,0.5"`` (the command line) → a list of numbers; a list passes."""
    if isinstance(value, str):
        try:
            return [float(x) for x in value.split(",") if x.strip()]
        except ValueError:
            raise ValueError(f"{value!r} is not a comma-separated list of numbers") from None
    return value


SWEEP_PANEL = "Sweep"
SWEEP_LOAD_DEFAULTS: dict[str, Any] = {"rate": DEFAULT_RATE, "concurrency": 32, "duration": 30.0}
"""The load options a sweep stage defaults otherwise than a replay: a rate far above capacity, a
client pool like a deployment's, 30 s stages (a recipe or a flag that sets them wins)."""


class SweepOptions(StrictModel):
    """What a sweep adds to a recipe's target and load (:class:`harness.experiments.recipe.Recipe`)."""

    fractions: Annotated[
        list[Annotated[float, Field(ge=0.0, le=1.0)]],
        BeforeValidator(_fractions),
        Flag(names=("--cmr",), text=True),
    ] = Field(
        default_factory=lambda: [0.0, 0.25, 0.5, 0.75, 1.0],
        min_length=3,
        description="Bypass fractions to sweep, one stage each, in the order run (≥ 3 values: 0,0.5,1)",
    )
    settle_s: Annotated[float, Flag(names=("--settle",))] = Field(
        5.0, ge=0.0, description="Seconds at each stage's start left out of the measurement (the pool fills)"
    )
    rate_raises: int = Field(2, ge=0, description="How often an unsaturated stage runs again at 4× the rate")
    warm_first: Annotated[bool, Flag(names=("--preload/--no-preload",))] = Field(
        True, description="Warm the cache with the corpus (POST /cache/preload) before the first stage"
    )
    rewarm: Annotated[bool, Flag(names=("--rewarm/--no-rewarm",))] = Field(
        True,
        description="Warm it again before every later stage (entries whose TTL ran out would raise the "
        "miss rate of later stages)",
    )


@dataclass(frozen=True)
class SweepPlan:
    """A sweep to run: the target and load of a recipe, with the sweep's own defaults, and its options."""

    url: str
    load: LoadOptions
    """The load options every stage starts from (each sets its rate, bypass fraction, stage name …)."""
    sweep: SweepOptions
    confidence: float
    """Level of ``k``'s interval (the recipe's ``gate.confidence``)."""

    @classmethod
    def of(cls, recipe: Recipe, sweep: SweepOptions) -> SweepPlan:
        """The plan of ``recipe`` (which must name a running target: ``url``) and ``sweep``."""
        if recipe.target.url is None:
            raise ConfigError(
                "a sweep needs a running target with a response cache", field="--url",
                hint="harness serve --preset tiny --cache, then --url http://127.0.0.1:8000",
            )  # fmt: skip
        if recipe.load.corpus is None:
            raise ConfigError("no corpus to replay", field="--corpus")
        own = {k: v for k, v in SWEEP_LOAD_DEFAULTS.items() if not recipe.load.is_set(k)}
        load = recipe.load.evolve(**own)
        if isinstance(load.rate, Share):
            raise ConfigError(
                "a sweep offers an absolute rate far above capacity, not a share", field="--rate"
            )
        duration = load.duration or SWEEP_LOAD_DEFAULTS["duration"]
        if sweep.settle_s >= duration:
            raise ConfigError(
                f"the settle time ({sweep.settle_s:g} s) must be shorter than a stage ({duration:g} s)",
                field="--settle",
            )
        return cls(recipe.target.url, load, sweep, recipe.gate.confidence)

    @property
    def duration_s(self) -> float:
        assert self.load.duration is not None
        return self.load.duration

    @property
    def rate(self) -> float:
        rate = self.load.rate_rps()
        assert rate is not None
        return rate


class SweepStage(StrictModel):
    """One stage as measured in its window ``[settle_s, duration_s)``."""

    name: str
    bypass_fraction: float
    """Requested share of ``Cache-Control: no-cache`` requests."""
    bypass_share: float | None
    """Realised share of bypassing requests among those sent in the window (``None``: none sent)."""
    cmr: float | None
    """Measured: share of the successful requests sent in the window whose ``x-cache`` was MISS or
    BYPASS (``None``: none succeeded)."""
    qps: float
    """Successful requests completed in the window per second: the capacity when ``saturated``."""
    offered_qps: float
    sent: int
    """Requests sent in the window."""
    completed: int
    """Successful requests completed in the window."""
    errors: int
    """Failed requests sent in the window."""
    unbypassed_misses: int
    """Requests sent in the window without ``no-cache`` that missed anyway (an entry not held)."""
    lateness_p50_ms: float | None
    """Median lateness in the window: the backlog at saturation (expected to be large)."""
    saturated: bool
    client_cpu_pct: float | None
    exit_code: int
    run: str
    """The stage's load run directory (``records.jsonl``, ``summary.json``)."""


class DecaySweep(StrictModel):
    """``fit.json``: the sweep's options and load, the measured stages, the fit and what to be wary of."""

    sweep: SweepOptions
    load: dict[str, Any]
    """The load options every stage started from (secrets left out), as a recipe file holds them."""
    preload: dict[str, int] | None
    """The server's last answer to ``/cache/preload`` (``lines``, ``stored``, ``generated``, ``failed``)."""
    stages: list[SweepStage]
    fit: DecayFit | None
    """``None`` when fewer than three stages completed any request (then the sweep fails)."""
    mixture: MixtureFit | None = None
    """The cost-mixture model fitted to the same points, for comparison (:func:`fit_mixture`)."""
    warnings: list[str] = Field(default_factory=list)


# --------------------------------------------------------------------------- measure


def measure_stage(
    run_dir: str | Path,
    *,
    name: str,
    bypass_fraction: float,
    settle_s: float,
    duration_s: float,
    rate: float,
    exit_code: int = 0,
) -> SweepStage:
    """Measure one saturated stage from its load run (see the module docstring)."""
    from harness.load.results import read_records
    from harness.load.run_summary import read_summary

    if not 0.0 <= settle_s < duration_s:
        raise ConfigError(
            f"the settle time ({settle_s:g} s) must be shorter than the stage ({duration_s:g} s)",
            field="--settle",
        )
    summary = read_summary(run_dir)
    records = list(read_records(run_dir))
    lo, hi = settle_s, duration_s
    sent = [r for r in records if lo <= r.sent_s < hi]
    served = [r for r in sent if r.ok and r.cache is not None]
    if sent and not any(r.cache is not None for r in sent):
        raise InputError(
            "no response carries an x-cache status, so the cache-miss rate cannot be measured",
            file=run_dir,
            field="cache",
            hint="sweep a target with a response cache (harness serve --cache)",
        )
    done = [r for r in records if r.ok and r.e2e_ms is not None and lo <= r.sent_s + r.e2e_ms / 1000.0 < hi]
    window = hi - lo
    return SweepStage(
        name=name,
        bypass_fraction=bypass_fraction,
        bypass_share=sum(r.bypass for r in sent) / len(sent) if sent else None,
        cmr=sum(r.cache in MISS_STATUSES for r in served) / len(served) if served else None,
        qps=len(done) / window,
        offered_qps=rate,
        sent=len(sent),
        completed=len(done),
        errors=sum(not r.ok for r in sent),
        unbypassed_misses=sum(1 for r in served if not r.bypass and r.cache in MISS_STATUSES),
        lateness_p50_ms=percentile([r.lateness_ms for r in sent], 50) if sent else None,
        saturated=len(sent) < SATURATED_SENT_SHARE * rate * window,
        client_cpu_pct=summary.client_cpu_pct,
        exit_code=exit_code,
        run=str(run_dir),
    )


def stage_warnings(stage: SweepStage) -> list[str]:
    """What makes a stage's number doubtful (lateness and the ``saturated:`` warning are expected)."""
    out: list[str] = []
    if not stage.saturated:
        out.append(
            f"{stage.name}: not saturated ({stage.sent} of {stage.offered_qps:g}/s offered went out): its "
            "QPS is the offered rate, not the capacity; raise --rate"
        )
    if stage.client_cpu_pct is not None and stage.client_cpu_pct > CLIENT_CPU_LIMIT_PCT:
        out.append(
            f"{stage.name}: client CPU {stage.client_cpu_pct:.0f} % > {CLIENT_CPU_LIMIT_PCT:g} %: "
            "the client, not the target, may have set the pace"
        )
    if stage.unbypassed_misses > max(1.0, 0.01 * stage.sent):
        out.append(
            f"{stage.name}: {stage.unbypassed_misses} requests without no-cache missed the cache (entries "
            "expired, evicted or not preloaded): the measured CMR, not the requested fraction, was fitted"
        )
    if stage.errors:
        out.append(f"{stage.name}: {stage.errors} of {stage.sent} requests failed")
    if stage.completed == 0:
        out.append(f"{stage.name}: no request completed in the window; left out of the fit")
    return out


# --------------------------------------------------------------------------- run


def corpus_preload(
    load: LoadOptions, *, model: str | None = None, records: Iterable[CorpusRecord] | None = None
) -> list[dict[str, Any]]:
    """One ``/cache/preload`` line per distinct request of the corpus (``records``, else read from
    ``load.corpus``), as the stages will send it (naming ``load.model``, else ``model``: the target's,
    which the stages then name too)."""
    import orjson

    from harness.corpus.model import read_corpus
    from harness.load.arrivals import preload_line

    seen: set[bytes] = set()
    lines: list[dict[str, Any]] = []
    assert load.corpus is not None
    for rec in records if records is not None else read_corpus(load.corpus):
        line = preload_line(rec, api=load.api, model=load.model or model, max_tokens_cap=load.max_tokens_cap)
        key = orjson.dumps(line, option=orjson.OPT_SORT_KEYS)
        if key not in seen:
            seen.add(key)
            lines.append(line)
    if not lines:
        raise InputError("the corpus has no records", file=load.corpus)
    return lines


def post_preload(client: TargetClient, path: Path) -> dict[str, int]:
    """``POST /cache/preload`` with the file (the admin token from ``client``'s credentials); the
    server's counts. A target without a response cache is an :class:`UnavailableError` saying so;
    the other errors are the client's (unreachable or refused: exit 5, a rejected file: exit 3)."""
    from harness.load.client import preload_counts
    from harness.load.target import NotExposed

    try:
        answer = client.cache_preload(path)
    except NotExposed as exc:
        raise UnavailableError(
            f"{exc.message}: the target has no response cache",
            hint="harness serve --cache (a sweep needs a cache to miss)",
        ) from None
    return preload_counts(answer)


def run_sweep(
    plan: SweepPlan,
    out: str | Path,
    *,
    progress: Callable[[str], None] | None = None,
) -> DecaySweep:
    """Warm, run one saturating stage per bypass fraction, measure, fit; writes every file in ``out``.

    Files: ``preload.jsonl``, ``stages/<name>/`` (each stage's load run), ``points.jsonl`` (the fit's
    input, ``harness analysis decay --points`` reads it), ``fit.json`` (:class:`DecaySweep`) and
    ``decay.png``. A stage the target kept up with (not saturated) runs again at ``RATE_RAISE`` times
    the rate, at most ``rate_raises`` times. A stage whose Locust run fails (exit code other than 0
    or 1) stops the sweep with its error; ``fit.json`` then holds the stages so far.
    """
    from harness.corpus.model import read_corpus
    from harness.load.target import TargetClient

    say = progress or (lambda _msg: None)
    client = TargetClient(plan.url, plan.load.credentials())
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    preload_file = out_dir / PRELOAD_FILE
    assert plan.load.corpus is not None
    records = list(read_corpus(plan.load.corpus))  # a bad corpus is an error before any request
    # Without --model, the target's first model, asked once: the preload and every stage name it.
    model = plan.load.model or client.first_model()
    if model is not None and plan.load.model is None:
        plan = replace(plan, load=plan.load.evolve(model=model))
    lines = corpus_preload(plan.load, records=records)
    write_jsonl(preload_file, lines)
    load_doc = plan.load.model_dump(mode="json", exclude_defaults=True, exclude=set(SECRET_OPTIONS))
    sweep = DecaySweep(sweep=plan.sweep, load=load_doc, preload=None, stages=[], fit=None)
    sampled = sum(is_sampled(line) for line in lines)
    if sampled:
        # Such requests miss whatever the bypass fraction: every stage measures a CMR near 1.
        sweep.warnings.append(
            f"{sampled} of {len(lines)} corpus requests sample (temperature > 0 without a seed): a response "
            "cache does not serve them by default (harness serve: HARNESS__CACHE__CACHE_SAMPLED)"
        )

    def warm(before: str) -> None:
        say(f"preloading {preload_file} into {plan.url} before {before}")
        sweep.preload = post_preload(client, preload_file)
        if sweep.preload.get("failed"):
            sweep.warnings.append(
                f"preload before {before}: {sweep.preload['failed']} of {sweep.preload.get('lines')} "
                "lines failed"
            )

    for i, f in enumerate(plan.sweep.fractions):
        rate = plan.rate
        for attempt in range(plan.sweep.rate_raises + 1):
            if plan.sweep.warm_first and (i == attempt == 0 or plan.sweep.rewarm):
                warm(f"cmr-{f:g}")
            stage = _run_stage(plan, out_dir, f, rate, say)
            if stage.saturated or attempt == plan.sweep.rate_raises:
                break
            # The target kept up: what was measured is the offered rate, not the capacity.
            say(f"stage {stage.name}: not saturated at {rate:g}/s; again at {rate * RATE_RAISE:g}/s")
            sweep.warnings.append(
                f"{stage.name}: not saturated at {rate:g}/s offered; ran again at {rate * RATE_RAISE:g}/s"
            )
            rate *= RATE_RAISE
        sweep.stages.append(stage)
        sweep.warnings += stage_warnings(stage)
        write_json(out_dir / FIT_FILE, sweep.model_dump(mode="json"))  # the stages so far
    points = sweep_points(sweep.stages)
    write_jsonl(out_dir / POINTS_FILE, (p.model_dump(mode="json") for p in points))
    try:
        sweep.fit = fit_decay(points, plan.confidence)
        sweep.mixture = fit_mixture(points)
    finally:
        write_json(out_dir / FIT_FILE, sweep.model_dump(mode="json"))
    plot_decay(sweep.fit, out_dir / PLOT_FILE, mixture=sweep.mixture)
    return sweep


def _run_stage(
    plan: SweepPlan, out_dir: Path, fraction: float, rate: float, say: Callable[[str], None]
) -> SweepStage:
    """One stage's Locust run (its directory is replaced by a rerun) and its measurement."""
    import shutil

    from harness.experiments.phase import run_phase
    from harness.load.runner import LoadSpec

    name = f"cmr-{fraction:g}"
    run_dir = out_dir / STAGES_DIR / name
    shutil.rmtree(run_dir, ignore_errors=True)
    # Locust's --run-time cap counts from the test start, the send window from the epoch after it.
    cap_s = math.ceil(plan.load.start_delay + plan.duration_s)
    say(f"stage {name}: {plan.duration_s:g} s at {rate:g}/s offered, bypass {fraction:g}")
    spec = LoadSpec(
        host=plan.url,
        options=plan.load.evolve(results_dir=run_dir, rate=rate, stage=name, bypass_fraction=fraction),
        run_time=f"{cap_s}s",
    )
    code = run_phase(spec, f"the load stage {name}", timeout_s=cap_s + 300.0).exit_code
    stage = measure_stage(
        run_dir,
        name=name,
        bypass_fraction=fraction,
        settle_s=plan.sweep.settle_s,
        duration_s=plan.duration_s,
        rate=rate,
        exit_code=code,
    )
    say(
        f"stage {name}: {stage.qps:.2f} QPS, CMR {_fmt(stage.cmr)} "
        f"(bypass {_fmt(stage.bypass_share)} of {stage.sent} sent)"
    )
    return stage


def _fmt(x: float | None) -> str:
    return "—" if x is None else f"{x:.3f}"


def sweep_points(stages: Sequence[SweepStage]) -> list[DecayPoint]:
    """The fit's input: one point per stage that completed requests and measured a CMR."""
    return [
        DecayPoint(
            cmr=s.cmr or 0.0,
            qps=s.qps,
            source=s.run,
            stage=s.name,
            requests=s.completed,
            bypass_fraction=s.bypass_fraction,
        )
        for s in stages
        if s.completed > 0 and s.cmr is not None
    ]
