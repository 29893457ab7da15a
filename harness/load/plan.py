"""The warmup ladder: a plan file of QPS stages, and the state machine that runs it with rollback.

A plan (YAML, validated, unknown keys refused) lists stages, each a target arrival rate held for a
duration with a tolerated failure rate, and optionally the preload file to post first::

    name: seed
    preload: preload.jsonl          # optional, relative to the plan file
    policy: {on_failure: retry, max_retries: 1, min_requests: 20}
    stages:
      - {name: s1-100qps, qps: 100, duration_s: 60, max_failure_rate: 0.08}
      - {name: s2-300qps, qps: 300, duration_s: 60, max_failure_rate: 0.05}

A stage's ``qps`` may instead be a share of the target's capacity, ``qps: 50%`` (``harness
capacity`` measures it): the same plan then loads a laptop and an H200 to the same utilisation.
Such a plan is read with the capacity in requests/s (:func:`read_plan` ``capacity=``, the load
option ``--capacity``), which turns every share into an absolute rate; without one it is a
:class:`~harness.common.errors.ConfigError` naming the file and the stage.

:class:`Ladder` turns the plan into :class:`~harness.load.arrivals.Segment` s for the pacer and
judges each stage from the records: the failure rate over the requests *intended* inside the stage's
window that have completed. A stage over its tolerance (checked as soon as ``min_requests`` have
completed, and at its end) is cut short and the ladder **rolls back to the last stage that passed**,
not to zero: traffic drops to a level the service was seen to handle while it recovers, for
``rollback_hold_s`` (default: that stage's duration). Then the policy decides: ``retry`` climbs again
to the failed stage (at most ``max_retries`` times per stage), ``stop`` ends the run after the hold.
A failure with no safe stage below (the first stage) stops at once. Every stage run, rollback hold
and retry becomes a :class:`~harness.load.run_summary.StageOutcome` in ``summary.json``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from harness.common.errors import ConfigError
from harness.common.io import read_yaml
from harness.common.model import StrictModel
from harness.common.units import parse_percent
from harness.load.arrivals import Segment
from harness.load.run_summary import StageOutcome


def parse_share(text: str) -> float | None:
    """``"50%"`` → ``0.5`` (a share of capacity); ``None`` when ``text`` is not a percentage.

    Raises ``ValueError`` for a percentage that is not a positive finite number (``"-5%"``, ``"x%"``).
    """
    share = parse_percent(text)
    if share is not None and share <= 0:
        raise ValueError(f"{text!r}: a share of capacity must be above 0 %")
    return share


class Stage(StrictModel):
    name: str = Field(min_length=1)
    qps: float = Field(gt=0)
    """Target arrival rate, requests/s over all processes. In the file also a share of capacity
    (``50%``), resolved to requests/s when the plan is read (validation context ``capacity``)."""
    duration_s: float = Field(gt=0)
    max_failure_rate: float = Field(ge=0, le=1)
    """Tolerated share of failed requests (HTTP error, transport error, in-stream error)."""

    @field_validator("qps", mode="before")
    @classmethod
    def _share_of_capacity(cls, value: Any, info: ValidationInfo) -> Any:
        if not isinstance(value, str):
            return value
        share = parse_share(value)
        if share is None:
            return value  # pydantic's own float parsing ("12.5") and its message
        capacity = (info.context or {}).get("capacity")
        if capacity is None:
            raise ValueError(f"qps {value} is a share of capacity, and no capacity was given (--capacity)")
        return share * float(capacity)


class Policy(StrictModel):
    on_failure: Literal["retry", "stop"] = "stop"
    max_retries: int = Field(default=1, ge=0)
    """How often a failed stage is tried again (``retry``) before the ladder stops."""
    min_requests: int = Field(default=20, ge=1)
    """Completed requests a stage needs before it can be failed early."""
    rollback_hold_s: float | None = Field(default=None, gt=0)
    """How long to hold the safe stage after a rollback (default: that stage's duration)."""


class Plan(StrictModel):
    name: str = "ladder"
    preload: str | None = None
    """JSONL to ``POST /cache/preload`` before the first stage, relative to the plan file (a
    ``--preload`` on the command line wins). ``harness analysis plan`` writes the two side by side."""
    policy: Policy = Field(default_factory=Policy)
    stages: list[Stage] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_names(self) -> Plan:
        seen: set[str] = set()
        for s in self.stages:
            if s.name in seen:
                raise ValueError(f"stage name {s.name!r} is used twice")
            seen.add(s.name)
        return self


def read_plan(path: str | Path, capacity: float | None = None) -> Plan:
    """Load and validate a plan file; errors name the file, line and field (``stages.1.target_qps``).

    ``capacity`` (requests/s) turns stages given as a share of capacity (``qps: 50%``) into rates;
    a plan with such stages and no ``capacity`` is a :class:`ConfigError` naming the stage.
    """
    if capacity is None:
        shares = share_stages(path)
        if shares:
            i, name = shares[0]
            raise ConfigError(
                f"stage {name!r} gives qps as a share of capacity, and no capacity was given",
                file=path,
                field=f"stages.{i}.qps",
                hint="--capacity N (requests/s), or `harness run`, which measures it first",
            )
    return read_yaml(path, Plan, expected="a ladder plan", context={"capacity": capacity})


def share_stages(path: str | Path) -> list[tuple[int, str]]:
    """``(index, name)`` of every stage whose ``qps`` is a share of capacity (``50%``)."""
    raw = read_yaml(path, expected="a ladder plan")
    stages = raw.get("stages")
    out: list[tuple[int, str]] = []
    for i, st in enumerate(stages if isinstance(stages, list) else []):
        if isinstance(st, dict) and isinstance(st.get("qps"), str) and st["qps"].strip().endswith("%"):
            out.append((i, str(st.get("name", f"#{i}"))))
    return out


def write_plan(path: str | Path, plan: Plan, *, comment: str | None = None) -> Path:
    """Write ``plan`` as YAML that :func:`read_plan` reads back equal, atomically.

    ``comment`` (lines) goes on top as ``#`` lines, e.g. where the stages came from.
    """
    import yaml

    from harness.common.io import atomic_write

    head = "".join(f"# {line}\n" for line in comment.splitlines()) if comment else ""
    doc = plan.model_dump(mode="json", exclude_none=True)
    with atomic_write(path) as fh:
        fh.write(head)
        yaml.safe_dump(doc, fh, sort_keys=False)
    return Path(path)


def plan_preload(plan: Plan, plan_file: str | Path) -> Path | None:
    """The plan's ``preload`` file resolved against the plan's directory (``None``: it names none)."""
    if plan.preload is None:
        return None
    p = Path(plan.preload)
    return p if p.is_absolute() else Path(plan_file).parent / p


WindowStats = Callable[[float, float], tuple[int, int]]
"""``(start_s, end_s) -> (completed, failed)`` over requests intended in that window."""


@dataclass
class Attempt:
    """One stretch of the ladder: a stage, a rollback hold, or a retry."""

    stage: int
    kind: Literal["stage", "rollback", "retry"]
    start_s: float
    end_s: float
    verdict: Literal["running", "passed", "rolled_back", "stopped", "interrupted"] = "running"
    rolled_back_to: str | None = None
    requests: int = 0
    errors: int = 0


@dataclass
class Ladder:
    """Runs a :class:`Plan`: hands out segments, judges stages, rolls back (see the module docstring)."""

    plan: Plan
    attempts: list[Attempt] = field(default_factory=list)
    pending: list[Attempt] = field(default_factory=list)
    """Attempts planned but not started (their segments are with the pacer)."""
    retries: dict[int, int] = field(default_factory=dict)
    done: bool = False
    stopped: bool = False
    """The ladder ended early: a stage failed and the policy (or no safe stage) said stop."""

    def start(self, at_s: float) -> list[Segment]:
        """The whole plan as contiguous segments from ``at_s``."""
        self.pending = self._chain([(i, "stage") for i in range(len(self.plan.stages))], at_s)
        return self.segments()

    def _chain(
        self, steps: list[tuple[int, Literal["stage", "rollback", "retry"]]], at_s: float
    ) -> list[Attempt]:
        out: list[Attempt] = []
        t = at_s
        for idx, kind in steps:
            st = self.plan.stages[idx]
            dur = st.duration_s
            if kind == "rollback" and self.plan.policy.rollback_hold_s is not None:
                dur = self.plan.policy.rollback_hold_s
            out.append(Attempt(idx, kind, t, t + dur))
            t += dur
        return out

    def segments(self) -> list[Segment]:
        """Segments of the current and pending attempts (what the pacer should send from now on)."""
        live = [a for a in self.attempts if a.verdict == "running"] + self.pending
        return [Segment(a.start_s, a.end_s, self.plan.stages[a.stage].qps, self.label(a)) for a in live]

    def label(self, a: Attempt) -> str:
        """``X-Traffic-Stage`` of an attempt: the stage name (rollback holds and retries say so)."""
        name = self.plan.stages[a.stage].name
        return name if a.kind == "stage" else f"{name}:{a.kind}"

    @property
    def current(self) -> Attempt | None:
        running = [a for a in self.attempts if a.verdict == "running"]
        return running[-1] if running else None

    def tick(self, now_s: float, stats: WindowStats) -> list[Segment] | None:
        """Advance to ``now_s``; returns new segments for the pacer when the plan changed, else ``None``."""
        while self.pending and self.pending[0].start_s <= now_s:
            self.attempts.append(self.pending.pop(0))
        for a in self.attempts:
            if a.verdict != "running":
                continue
            completed, failed = stats(a.start_s, min(a.end_s, now_s))
            a.requests, a.errors = completed, failed
            tol = self.plan.stages[a.stage].max_failure_rate
            over = completed > 0 and failed / completed > tol
            ended = now_s >= a.end_s
            if over and (ended or completed >= self.plan.policy.min_requests):
                a.end_s = min(a.end_s, now_s)
                return self._fail(a, now_s)
            if ended:
                a.verdict = "passed"
        if not self.pending and all(a.verdict != "running" for a in self.attempts):
            self.done = True
        return None

    def _safe_below(self, a: Attempt) -> int | None:
        """The highest stage below ``a``'s that passed at least once (a failed hold looks further down)."""
        passed = {x.stage for x in self.attempts if x.verdict == "passed" and x.stage < a.stage}
        return max(passed) if passed else None

    def _fail(self, a: Attempt, now_s: float) -> list[Segment]:
        safe = self._safe_below(a)
        self.pending = []
        if safe is None:
            a.verdict = "stopped"
            self.stopped = True
            self.done = True
            return []
        a.verdict = "rolled_back"
        a.rolled_back_to = self.plan.stages[safe].name
        target = a.stage
        steps: list[tuple[int, Literal["stage", "rollback", "retry"]]] = [(safe, "rollback")]
        tries = self.retries.get(target, 0)
        if (
            self.plan.policy.on_failure == "retry"
            and a.kind != "rollback"
            and tries < self.plan.policy.max_retries
        ):
            self.retries[target] = tries + 1
            steps.append((target, "retry"))
            steps += [(i, "stage") for i in range(target + 1, len(self.plan.stages))]
        else:
            self.stopped = True
        self.pending = self._chain(steps, now_s)
        self.attempts.append(self.pending.pop(0))
        return self.segments()

    def interrupt(self, now_s: float) -> None:
        """Mark what is still running as interrupted (Ctrl-C, SIGTERM, a stop from the web UI)."""
        for a in self.attempts:
            if a.verdict == "running":
                a.verdict = "interrupted"
                a.end_s = min(a.end_s, now_s)
        self.pending = []

    def outcomes(self) -> list[StageOutcome]:
        """Every attempt so far as it ended, for ``summary.json``."""
        out: list[StageOutcome] = []
        for a in self.attempts:
            st = self.plan.stages[a.stage]
            verdict = "interrupted" if a.verdict == "running" else a.verdict
            out.append(
                StageOutcome(
                    name=self.label(a),
                    target_rate=st.qps,
                    started_s=a.start_s,
                    ended_s=a.end_s,
                    requests=a.requests,
                    errors=a.errors,
                    failure_rate=a.errors / a.requests if a.requests else 0.0,
                    tolerance=st.max_failure_rate,
                    verdict=verdict,
                    rolled_back_to=a.rolled_back_to,
                )
            )
        return out
