"""``harness capacity``'s runner: the highest open-loop arrival rate at which a target meets its SLO.

A **probe** is one open-loop replay of the corpus at a constant rate ``r`` through the load stage's
pacer (:func:`harness.load.runner.run_locust`), kept as an ordinary run directory under
``OUT/probes/NN-<r>rps/`` so the gates and reports read it like any run. Each probe sends
``max(--probe-requests, r · --probe-seconds)`` requests. Before the first, a short sequential
calibration (a few requests one at a time) picks the start rate unless ``--min-rate`` is given.

The pieces: the SLO and a probe's verdict (:mod:`harness.gates.slo`), the search and its fit
(:mod:`harness.experiments.capacity_search`), the answer (:mod:`harness.experiments.capacity_result`).
Exit codes (:attr:`CapacityResult.exit_code`): 0 a rate meets the SLO (``bounded: false`` when none
failed up to ``--max-rate``: "at least"); 1 not even the lowest rate does; 6 the lowest rate could
not be judged (its interval straddles a limit).

**Errors are judged, never hidden**: a calibration request or a probe request the target answered
with an error is counted (the calibration's in :class:`Calibration`, each probe's in its row), and the
answer names the target's error rate with its interval (:mod:`harness.experiments.capacity_search`).
Only a target that answered none of the calibration's requests (refused, no answer) is unreachable
(:class:`~harness.common.errors.UnavailableError`, exit 5).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.markup import escape

from harness.common import console as cons
from harness.common.errors import UnavailableError
from harness.common.io import write_json
from harness.experiments.capacity_result import CAPACITY_FILE, Calibration, CapacityResult
from harness.experiments.capacity_search import search, unprobed
from harness.experiments.driver import (
    Ui,
    check_out_dir,
    check_serve_args,
    clear_out_dir,
    open_target,
    sigterm_interrupts,
)
from harness.experiments.phase import run_phase
from harness.experiments.recipe import RECIPE_FILE, CapacityRecipe, Recipe, write_recipe
from harness.experiments.target import Target, flush_all
from harness.gates.slo import (
    ProbeResult,
    ProbeSamples,
    SloTerm,
    check_probe_size,
    parse_slo,
    precision_on,
    probe_min_requests,
)
from harness.load.arrivals import RequestSpec
from harness.load.runner import LoadSpec

PROBES_DIR = "probes"
SERVER_DIR = "server"
OUTPUTS = (PROBES_DIR, SERVER_DIR, CAPACITY_FILE, RECIPE_FILE)
"""Everything ``harness capacity`` writes under ``OUT`` (``--force`` removes exactly these)."""
PROBE_STAGE = "capacity"
"""``X-Traffic-Stage`` of probe requests."""
MAX_AUTO_CONCURRENCY = 512


@dataclass
class CapacitySpec:
    """A capacity search: the :class:`~harness.experiments.recipe.Recipe` it runs (its target, load,
    ``capacity`` section and ``gate.confidence``), where its results go, and the runner's own
    settings."""

    recipe: Recipe
    out: Path
    force: bool = False
    probe_timeout_s: float | None = None
    """Seconds a probe may take (default: its send time + the drain timeout + 120 s)."""
    server_timeout_s: float = 300.0

    @property
    def search(self) -> CapacityRecipe:
        return self.recipe.capacity

    @property
    def confidence(self) -> float:
        return self.recipe.gate.confidence

    @cached_property
    def load(self) -> LoadSpec:
        """Load options of every probe (corpus, caps, api …); rate, duration, max_requests, stage,
        results_dir and the precision watch are set per probe, and what schedules a run or warms it up
        is not a probe's."""
        opts = self.recipe.load.evolve(
            rate=None, duration=None, max_requests=None, schedule=None, speedup=None, plan=None,
            preload=None, capacity=None, until_precision=None, max_duration=None, start_delay=None,
        )  # fmt: skip
        return LoadSpec(host="", options=opts, processes=self.recipe.launch.processes)


def check_spec(spec: CapacitySpec) -> list[SloTerm]:
    """Check what the recipe's validation cannot alone (the SLO against the probe size); the SLO."""
    terms = parse_slo(spec.search.slo)
    check_probe_size(terms, spec.search.probe_requests, spec.confidence)
    return terms


class CapacityRunner:
    """Runs a :class:`CapacitySpec` against a target: calibrates, probes, searches, writes the answer."""

    def __init__(self, spec: CapacitySpec, console: Console | None = None, *, ui: Ui | None = None) -> None:
        self.spec = spec
        self.out = spec.out.resolve()
        # ``harness run`` passes its own progress display (rich allows one live display at a time).
        self.ui = ui or Ui(console or cons.err())
        self.terms = check_spec(spec)
        self.started_at = datetime.now(UTC).isoformat()
        self.result: CapacityResult | None = None
        self.probes: list[ProbeResult] = []

    # ---- the whole command ------------------------------------------------------------------------

    def run(self) -> CapacityResult:
        """Start (or reach) the target, search, stop it; ``capacity.json`` after every probe."""
        spec = self.spec
        check_out_dir(self.out, OUTPUTS, force=spec.force, holds="an earlier capacity search")
        argv = spec.recipe.target.serve_argv()
        serve_args = None if argv is None else check_serve_args(argv)
        if spec.force:
            clear_out_dir(self.out, OUTPUTS)
        self.out.mkdir(parents=True, exist_ok=True)
        with (
            sigterm_interrupts(),
            self.ui.progress,
            open_target(
                spec.recipe.target.url,
                serve_args,
                self.out / SERVER_DIR,
                self.ui,
                spec.server_timeout_s,
                credentials=spec.load.options.credentials(),
            ) as target,
        ):
            return self.measure(target)

    def measure(self, target: Target, *, requests: Sequence[RequestSpec] | None = None) -> CapacityResult:
        """The search against a target that is already up (``harness run --rate 50%`` calls this,
        handing on the ``requests`` it read already)."""
        spec = self.spec
        self.out.mkdir(parents=True, exist_ok=True)
        write_recipe(self.out, spec.recipe)
        if requests is None:
            from harness.load.inputs import Inputs

            inputs = Inputs.load(spec.load.options.evolve(rate=1.0, duration=1.0), ladder=False)
            # The model the probes' Locust processes will ask the target for, when --model names none.
            requests = inputs.with_default_model(target.model).requests
        calibration = None
        start = spec.search.min_rate
        if start is None:
            calibration = self._calibrate(target, requests)
            if calibration.start_rate is None:  # every request failed, yet the target answered them
                answer = unprobed(
                    self.terms, calibration, confidence=spec.confidence,
                    resolution=spec.search.resolution, slo_text=spec.search.slo,
                )  # fmt: skip
                return self._finish(answer, target)
            start = calibration.start_rate
            if spec.search.max_rate is not None:
                start = min(start, spec.search.max_rate)
        prober = _LocustProber(self, target)

        def progress(p: ProbeResult, so_far: list[ProbeResult]) -> None:
            colour = {"pass": "green", "fail": "red", "inconclusive": "yellow"}[p.verdict]
            self.ui.say(f"  [{colour}]{p.verdict:<12}[/] {p.rate:.4g} req/s: {escape(p.note or '')}")
            self.probes = list(so_far)
            self._save_partial(self.probes, calibration, target)

        try:
            result = search(
                prober,
                self.terms,
                start=start,
                max_rate=spec.search.max_rate,
                growth=spec.search.growth,
                resolution=spec.search.resolution,
                max_probes=spec.search.max_probes,
                confidence=spec.confidence,
                on_probe=progress,
                slo_text=spec.search.slo,
                calibration=calibration,
            )
        except KeyboardInterrupt:
            self._save_partial(self.probes, calibration, target, interrupted=True)
            raise
        return self._finish(result, target)

    def _finish(self, result: CapacityResult, target: Target) -> CapacityResult:
        """The answer with where and when it was measured, written to ``capacity.json``."""
        result = result.model_copy(
            update={
                "target": target.url,
                "started_at": self.started_at,
                "finished_at": datetime.now(UTC).isoformat(),
            }
        )
        write_json(self.out / CAPACITY_FILE, result.model_dump(mode="json"))
        self.result = result
        return result

    def _save_partial(
        self,
        probes: list[ProbeResult],
        calibration: Calibration | None,
        target: Target,
        *,
        interrupted: bool = False,
    ) -> None:
        """``capacity.json`` while the search runs (or after it was interrupted): the probes so far."""
        partial = {
            "schema_version": 1,
            "partial": True,
            "interrupted": interrupted,
            "slo": self.spec.search.slo,
            "target": target.url,
            "started_at": self.started_at,
            "calibration": calibration.model_dump(mode="json") if calibration else None,
            "probes": [p.model_dump(mode="json") for p in probes],
        }
        write_json(self.out / CAPACITY_FILE, partial)

    def _calibrate(self, target: Target, specs: Sequence[RequestSpec]) -> Calibration:
        """Send a few requests one at a time; the start rate is half of what one stream sustains.

        A request that fails is counted (the target's error rate one at a time), not the end of the
        search: a target that answers some errors still has a capacity, and its errors are judged.
        Only a target that answered none of them is unreachable (exit 5). When every one failed with
        an answer, ``start_rate`` is ``None`` and the caller answers from the calibration alone."""
        n = self.spec.search.calibration_requests
        picked = [specs[i % len(specs)] for i in range(n)]
        sent: list[tuple[bool, float]] = []
        answered = 0
        first_error: str | None = None
        with self.ui.step(f"calibrating: {n} requests one at a time"):
            for spec in picked:
                t0 = time.perf_counter()
                (res,) = target.client.probe([spec], no_cache=self.spec.search.bypass_cache, concurrency=1)
                sent.append((res.ok, time.perf_counter() - t0))
                answered += res.status > 0  # status 0: refused, reset or timed out
                if not res.ok and first_error is None:
                    first_error = res.error or f"HTTP {res.status}"
        if not answered:
            raise UnavailableError(
                f"none of the {n} calibration requests was answered ({first_error}): the target does not "
                "serve",
                hint="check the target, or give --min-rate to skip the calibration",
            )
        errors = sum(not ok for ok, _ in sent)
        # The first one pays for connections, lazy loading, compilation: left out when another succeeded.
        times = [t for i, (ok, t) in enumerate(sent) if ok and i > 0] or [t for ok, t in sent if ok]
        if errors:
            self.ui.say(
                f"[yellow]![/] calibration: {errors} of {n} requests failed "
                f"(first: {escape(first_error or '')}): the target's errors, judged with the probes'"
            )
        if not times:
            return Calibration(
                requests=n, errors=errors, first_error=first_error, service_ms=None, start_rate=None
            )
        service = float(np.median(times))
        start = 0.5 / service
        self.ui.say(
            f"[green]✓[/] one request alone takes {service * 1000:.0f} ms: starting at {start:.3g} req/s "
            "(half of what one stream sustains)"
        )
        return Calibration(
            requests=n, errors=errors, first_error=first_error, service_ms=service * 1000.0, start_rate=start
        )


class _LocustProber:
    """The real probe: a headless Locust replay at a constant rate into ``OUT/probes/NN-<r>rps``."""

    def __init__(self, runner: CapacityRunner, target: Target) -> None:
        self.runner = runner
        self.target = target
        self.count = 0

    def __call__(self, rate: float) -> ProbeSamples:
        spec = self.runner.spec
        ui = self.runner.ui
        self.count += 1
        index = self.count
        n = max(spec.search.probe_requests, math.ceil(rate * spec.search.probe_seconds))
        duration = n / rate
        results = self.runner.out / PROBES_DIR / f"{index:02d}-{rate:.4g}rps"
        if spec.search.flush:
            flushed = flush_all(self.target.client)
            if index == 1:
                for f in flushed:
                    mark = (
                        "[green]✓[/] flushed before each probe:" if f.status == "flushed" else "[yellow]–[/]"
                    )
                    ui.say(f"{mark} {escape(f.detail)}")
        given = spec.load.options
        concurrency = given.concurrency if given.is_set("concurrency") else min(n, MAX_AUTO_CONCURRENCY)
        load = spec.load.replace(
            host=self.target.url,
            results_dir=results,
            rate=rate,
            duration=duration,
            max_requests=n,
            stage=PROBE_STAGE,
            schedule=None,
            speedup=None,
            concurrency=concurrency,
            start_delay=given.start_delay if given.is_set("start_delay") else 1.0,
            bypass_fraction=1.0 if spec.search.bypass_cache else given.bypass_fraction,
        )
        watched = precision_on(self.runner.terms)
        if spec.recipe.load.until_precision is not None and watched is not None:
            load = load.replace(
                until_precision=spec.recipe.load.until_precision,
                precision_on=watched,
                precision_confidence=spec.confidence,
                precision_min_samples=probe_min_requests(self.runner.terms, spec.confidence),
            )
        timeout = spec.probe_timeout_s or duration + load.options.drain_timeout + 120.0
        label = f"probe {index}: {rate:.4g} req/s"
        result = run_phase(load, f"probe {index}", ui=ui, label=label, total=n, timeout_s=timeout)
        return ProbeSamples.from_run(rate, results, result.seconds)
