"""Summary building: what a finished run's ``summary.json`` says, from its records and its state.

The lifecycle (:mod:`harness.load.plugin`) closes the records and gathers what only the running
process knows (its CPU use, the workers' shares, the target's identity); this module turns that,
the options and the run control's outcome (:mod:`harness.load.control`: ladder stages, precision,
why sending stopped) into a :class:`~harness.load.run_summary.RunSummary`. Computing the metrics
is :func:`harness.load.run_summary.summarize`; writing the file is
:func:`harness.load.run_summary.write_summary`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from harness.common.fingerprint import current_environment
from harness.common.host import HostLoad
from harness.load.arrivals import RequestSpec
from harness.load.control import Control
from harness.load.inputs import Inputs
from harness.load.options import LoadOptions
from harness.load.precision import PrecisionTracker, describe
from harness.load.results import RequestRecord
from harness.load.run_summary import (
    InputRef,
    PrecisionState,
    Recipe,
    RunSummary,
    ServerTelemetry,
    TargetDeath,
    TargetInfo,
    WorkerShare,
    summarize,
)


def build_summary(
    records: list[RequestRecord],
    *,
    inputs: Inputs,
    control: Control,
    host: str,
    epoch_unix: float,
    duration_s: float,
    client_cpu_pct: float,
    interrupted: bool,
    identity: dict[str, Any] | None,
    workers: list[WorkerShare],
    warnings: list[str],
    warmup_id: str,
    preload: dict[str, int] | None,
    server_metrics: ServerTelemetry | None = None,
    target_died: TargetDeath | None = None,
    interference: HostLoad | None = None,
) -> RunSummary:
    """The run's summary (local / master), its records read back from ``records.jsonl``."""
    o = inputs.opts
    ladder = control.ladder
    target_rate = None
    if ladder is None and inputs.rate is not None:
        target_rate = inputs.rate
    elif ladder is None and records:
        target_rate = offered_rate(records, sessions=inputs.sessions is not None)
    api: Literal["chat", "completions"] = (
        ("chat" if o.api == "chat" else "completions") if o.api != "auto" else _api_of(inputs.requests)
    )
    corpus = InputRef.of(_corpus_file(o.corpus)) if o.corpus else None
    schedule = InputRef.of(o.schedule) if o.schedule else None
    precision = _final_precision(control.precision, records)
    return summarize(
        records,
        started_at=datetime.fromtimestamp(epoch_unix, UTC).isoformat(),
        duration_s=duration_s,
        target=TargetInfo(
            url=host,
            model=inputs.model,
            model_source=("option" if o.model else "target") if inputs.model else None,
            api=api,
            identity=identity,
        ),
        target_rate=target_rate,
        client_cpu_pct=client_cpu_pct,
        interrupted=interrupted,
        corpus=corpus,
        schedule=schedule,
        stages=ladder.outcomes() if ladder is not None else None,
        workers=workers,
        warnings=warnings,
        warmup_id=warmup_id,
        plan=InputRef.of(o.plan) if o.plan and ladder is not None else None,
        preload=preload,
        environment=current_environment(),
        interference=interference,
        recipe=recipe_of(
            o,
            api=api,
            corpus=corpus,
            schedule=schedule,
            sessions=inputs.sessions is not None,
            rate=inputs.rate,
        ),
        stop_reason=_final_stop_reason(inputs, control, interrupted, precision),
        precision=precision,
        server_metrics=server_metrics,
        target_died=target_died,
    )


def recipe_of(
    o: LoadOptions,
    *,
    api: str,
    corpus: InputRef | None,
    schedule: InputRef | None,
    sessions: bool = False,
    rate: float | None = None,
) -> Recipe:
    """The load a run offered, from its options (``summary.json``: ``recipe``); ``sessions``: the
    corpus is a session corpus (its replay's ``--history`` is part of the load: live answers change
    every later turn's prompt); ``rate``: ``--rate`` in requests/s (a share of capacity resolved)."""
    return Recipe(
        corpus_sha256=corpus.sha256 if corpus else None,
        schedule_sha256=schedule.sha256 if schedule else None,
        rate=rate,
        rate_of_capacity=round(rate / o.capacity, 4) if rate is not None and o.capacity else None,
        arrival=o.arrival if rate is not None else None,
        duration=o.duration,
        max_requests=o.max_requests,
        max_tokens_cap=o.max_tokens_cap,
        api=api,
        speedup=o.speedup,
        concurrency=o.concurrency,
        seed=o.seed if rate is not None and o.arrival == "poisson" else None,
        bypass_fraction=o.bypass_fraction,
        history=o.history if sessions else None,
        salt_per_pass=True if o.salt_per_pass else None,
    )


def _final_precision(
    watched: PrecisionTracker | None, records: list[RequestRecord]
) -> dict[str, PrecisionState] | None:
    """The watched percentiles over every record of the run (requests that completed after the
    decision too), from the records file, so it agrees with the summary's metrics."""
    if watched is None:
        return None
    final = PrecisionTracker(
        watched.targets,
        watched.rel_target,
        confidence=watched.confidence,
        min_samples=watched.min_samples,
    )
    final.add_many(records)
    return final.states()


def _final_stop_reason(
    inputs: Inputs, control: Control, interrupted: bool, precision: dict[str, PrecisionState] | None
) -> str | None:
    """Why sending ended (``summary.json``: ``stop_reason``), for runs that may end before their schedule."""
    o = inputs.opts
    if control.halted:
        return control.stop_reason  # the target died: sending stopped whatever the options
    if o.until_precision is None and o.max_duration is None:
        return None
    if control.stop_reason is not None:
        return control.stop_reason
    short = ""
    if precision is not None and not all(s.met for s in precision.values()):
        short = f" before precision: {describe(precision)}"
    if control.capped:
        return f"--run-time reached{short}"
    if interrupted:
        return f"interrupted{short}"
    if inputs.ends_by_max_duration():
        return f"max duration {o.max_duration:g} s reached{short}"
    return f"schedule ended{short}"


def _corpus_file(p: Path) -> Path:
    return p / "corpus.jsonl" if p.is_dir() else p


def offered_rate(records: Sequence[RequestRecord], *, sessions: bool) -> float | None:
    """Arrivals a second that a schedule without ``--rate`` offered, from the records' intended
    times: with a session corpus an arrival is a session's start, not each of its calls or turns."""
    arrivals = [r.intended_s for r in records]
    if sessions:
        starts: dict[str, float] = {}
        for r in records:
            key = r.session_id or r.id
            starts[key] = min(starts.get(key, r.intended_s), r.intended_s)
        arrivals = list(starts.values())
    span = max(arrivals, default=0.0) - min(arrivals, default=0.0)
    return (len(arrivals) - 1) / span if span > 0 else None


def _api_of(requests: list[RequestSpec]) -> Literal["chat", "completions"]:
    return "chat" if requests and requests[0].path.endswith("chat/completions") else "completions"
