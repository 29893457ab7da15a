"""``harness capacity``'s runner: the highest open-loop arrival rate at which a target meets its SLO.

A **probe** is one open-loop replay of the corpus at a constant rate ``r`` through the load stage's
pacer (:func:`harness.load.runner.run_locust`), kept as an ordinary run directory under
``OUT/probes/NN-<r>rps/`` so the gates and reports read it like any run. Each probe sends
``max(--probe-requests, r · --probe-seconds)`` requests. Before the first, a short sequential
calibration (a few requests one at a time) picks the start rate unless ``--min-rate`` is given.

The pieces: the SLO and a probe's verdict (:mod:`harness.experiments.slo`), the search and its fit
(:mod:`harness.experiments.capacity_search`), the answer (:mod:`harness.experiments.capacity_result`).
Exit codes (:attr:`CapacityResult.exit_code`): 0 a rate meets the SLO (``bounded: false`` when none
failed up to ``--max-rate``: "at least"); 1 not even the lowest rate does; 6 the lowest rate could
not be judged (its interval straddles a limit).
"""

from __future__ import annotations

import math
import shlex
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.markup import escape

from harness.common import console as cons
from harness.common.errors import ConfigError, ExitCode, UnavailableError
from harness.common.io import write_json
from harness.experiments.capacity_result import CAPACITY_FILE, Calibration, CapacityResult
from harness.experiments.capacity_search import search
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
from harness.experiments.slo import (
    DEFAULT_SLO,
    ProbeResult,
    ProbeSamples,
    SloTerm,
    check_probe_size,
    parse_slo,
    precision_on,
    probe_min_requests,
)
from harness.experiments.target import Target, flush_all
from harness.load.arrivals import RequestSpec
from harness.load.results import RECORDS_FILE
from harness.load.runner import LoadSpec, run_locust

PROBES_DIR = "probes"
SERVER_DIR = "server"
OUTPUTS = (PROBES_DIR, SERVER_DIR, CAPACITY_FILE)
"""Everything ``harness capacity`` writes under ``OUT`` (``--force`` removes exactly these)."""
PROBE_STAGE = "capacity"
"""``X-Traffic-Stage`` of probe requests."""
MAX_AUTO_CONCURRENCY = 512


@dataclass
class CapacitySpec:
    """Everything ``harness capacity`` is configured with."""

    out: Path
    load: LoadSpec
    """Load options of every probe (corpus, caps, api …); host, results_dir, rate, duration,
    max_requests and stage are set per probe."""
    slo: str = DEFAULT_SLO
    serve_args: Sequence[str] | None = ("--preset", "tiny", "--cache")
    url: str | None = None
    min_rate: float | None = None
    """Start rate; ``None``: from a sequential calibration."""
    max_rate: float | None = None
    growth: float = 2.0
    resolution: float = 0.10
    max_probes: int = 12
    probe_requests: int = 100
    probe_seconds: float = 5.0
    until_precision: float | str | None = None
    """``--until-precision``: a probe stops sending once every percentile term's interval is this
    precise (the load stage's rule, ``harness.load.precision``), never before the fewest requests the
    SLO can pass with (:func:`probe_min_requests`); ``probe_requests`` stays its most."""
    """A probe lasts at least this long (more requests at high rates)."""
    confidence: float = 0.95
    calibration_requests: int = 4
    flush: bool = True
    """Empty the target's cache levels before each probe (where it exposes them)."""
    bypass_cache: bool = True
    """Send every probe request with ``Cache-Control: no-cache``: a response cache would otherwise
    answer repeats and the capacity measured would be the cache's."""
    force: bool = False
    probe_timeout_s: float | None = None
    """Seconds a probe may take (default: its send time + the drain timeout + 120 s)."""
    server_timeout_s: float = 300.0


def check_spec(spec: CapacitySpec) -> list[SloTerm]:
    """Check every option before a target starts; the parsed SLO."""
    terms = parse_slo(spec.slo)
    if not 0.5 <= spec.confidence < 1:
        raise ConfigError(f"must be in [0.5, 1), got {spec.confidence}", field="--confidence")
    if spec.probe_requests < 1:
        raise ConfigError("at least one request", field="--probe-requests")
    check_probe_size(terms, spec.probe_requests, spec.confidence)
    for name, value in (("--min-rate", spec.min_rate), ("--max-rate", spec.max_rate)):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise ConfigError(f"must be a positive rate, got {value}", field=name)
    if spec.min_rate is not None and spec.max_rate is not None and spec.min_rate > spec.max_rate:
        raise ConfigError("--min-rate is above --max-rate", field="--min-rate")
    if spec.growth <= 1:
        raise ConfigError("must be above 1", field="--growth")
    if spec.resolution <= 0:
        raise ConfigError("must be above 0", field="--resolution")
    if spec.max_probes < 1:
        raise ConfigError("at least one probe", field="--max-probes")
    if spec.calibration_requests < 2 and spec.min_rate is None:
        raise ConfigError("at least 2 (the first one is a warm-up)", field="--calibration-requests")
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
        # A bad load option (--until-precision included) is an error now, not in the first probe.
        spec.load.replace(rate=1.0, max_requests=1, until_precision=spec.until_precision)
        serve_args = None if spec.url is not None else check_serve_args(list(spec.serve_args or ()))
        if spec.force:
            clear_out_dir(self.out, OUTPUTS)
        self.out.mkdir(parents=True, exist_ok=True)
        with (
            sigterm_interrupts(),
            self.ui.progress,
            open_target(
                spec.url,
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
        if requests is None:
            from harness.load.inputs import Inputs

            inputs = Inputs.load(spec.load.options.evolve(rate=1.0, duration=1.0), ladder=False)
            # The model the probes' Locust processes will ask the target for, when --model names none.
            requests = inputs.with_default_model(target.model).requests
        calibration = None
        start = spec.min_rate
        if start is None:
            calibration = self._calibrate(target, requests)
            start = calibration.start_rate
            if spec.max_rate is not None:
                start = min(start, spec.max_rate)
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
                max_rate=spec.max_rate,
                growth=spec.growth,
                resolution=spec.resolution,
                max_probes=spec.max_probes,
                confidence=spec.confidence,
                on_probe=progress,
                slo_text=spec.slo,
            )
        except KeyboardInterrupt:
            self._save_partial(self.probes, calibration, target, interrupted=True)
            raise
        result = result.model_copy(
            update={
                "calibration": calibration,
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
            "slo": self.spec.slo,
            "target": target.url,
            "started_at": self.started_at,
            "calibration": calibration.model_dump(mode="json") if calibration else None,
            "probes": [p.model_dump(mode="json") for p in probes],
        }
        write_json(self.out / CAPACITY_FILE, partial)

    def _calibrate(self, target: Target, specs: Sequence[RequestSpec]) -> Calibration:
        """Send a few requests one at a time; the start rate is half of what one stream sustains."""
        n = self.spec.calibration_requests
        picked = [specs[i % len(specs)] for i in range(n)]
        times: list[float] = []
        with self.ui.step(f"calibrating: {n} requests one at a time"):
            for i, spec in enumerate(picked):
                t0 = time.perf_counter()
                (res,) = target.client.probe([spec], no_cache=self.spec.bypass_cache, concurrency=1)
                elapsed = time.perf_counter() - t0
                if not res.ok:
                    raise UnavailableError(
                        f"calibration request {i + 1} failed ({res.error}): the target does not serve",
                        hint="check the target, or give --min-rate to skip the calibration",
                    )
                if i > 0:  # the first one pays for connections, lazy loading, compilation
                    times.append(elapsed)
        service = float(np.median(times))
        start = 0.5 / service
        self.ui.say(
            f"[green]✓[/] one request alone takes {service * 1000:.0f} ms: starting at {start:.3g} req/s "
            "(half of what one stream sustains)"
        )
        return Calibration(requests=n, service_ms=service * 1000.0, start_rate=start)


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
        n = max(spec.probe_requests, math.ceil(rate * spec.probe_seconds))
        duration = n / rate
        results = self.runner.out / PROBES_DIR / f"{index:02d}-{rate:.4g}rps"
        if spec.flush:
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
            bypass_fraction=1.0 if spec.bypass_cache else given.bypass_fraction,
        )
        watched = precision_on(self.runner.terms)
        if spec.until_precision is not None and watched is not None:
            load = load.replace(
                until_precision=spec.until_precision,
                precision_on=watched,
                precision_confidence=spec.confidence,
                precision_min_samples=probe_min_requests(self.runner.terms, spec.confidence),
            )
        timeout = spec.probe_timeout_s or duration + load.options.drain_timeout + 120.0
        ui.say(f"[dim]$ locust {escape(shlex.join(load.command()[3:]))}[/]")
        started = time.monotonic()
        with ui.phase(f"probe {index}: {rate:.4g} req/s", results / RECORDS_FILE, n):
            code = run_locust(load, timeout_s=timeout)
        seconds = round(time.monotonic() - started, 3)
        log = results / "locust.log"
        if code in ERRORS_BY_CODE:
            raise ERRORS_BY_CODE[code](f"probe {index} exited with {code}: {log_tail(log)}", file=log)
        if code == int(ExitCode.INTERRUPTED):
            raise UnavailableError(
                f"probe {index} did not end within {timeout:g} s and was stopped", file=log
            )
        if not (results / "summary.json").exists():
            raise UnavailableError(f"probe {index} wrote no summary (exit {code}): {log_tail(log)}", file=log)
        return ProbeSamples.from_run(rate, results, seconds)
