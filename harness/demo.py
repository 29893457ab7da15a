"""``make demo`` (``python -m harness.demo``): the whole path on bundled fixtures, as a user types it,
ending in verdicts that must come out the same on any machine: the unchanged target passes, and each
kind of regression, injected on purpose, fails.

Every step is one ``harness`` command, printed before it runs and run as a child process, exactly as
a user would type it (nothing here measures, parses SSE or reads a server log: the commands do):

1. ``harness traces coldpaths`` and ``harness traces scenarios`` on the bundled GenAI Jaeger trace:
   cold first hops grouped into scenario classes;
2. ``harness corpus build``: real user requests (the bundled CLINC150 and CrossWOZ samples) in the
   bundled template, weighted by those scenarios (:func:`corpus_build_args`, the one place that
   spells the corpus recipe);
3. ``harness capacity --serve-args "--preset tiny --cache"``: how much this machine's target serves
   within the SLO (open-loop probes);
4. the CI job's own mechanism (docs/ci.md), once per case: ``harness ab --recipe
   fixtures/recipes/ci.yaml`` with the unchanged target as the base and, as the candidate, the same
   target unchanged or with a regression injected on purpose (:data:`CASES`: every engine step twice
   and 1.3 times as long, 20 % of requests answering 500, 30 % of requests missing both caches),
   both at 50 % of that capacity, block pairs A B B A …, a warm pass, the declared limits; sized for
   the demo's corpus (fewer blocks, the medians: a P95 needs 200 request pairs);
5. ``harness report``: one HTML file with the plots (the capacity search's too), every verdict listed,
   and a Markdown summary;
6. what the verdicts mean, and ``verdicts.json``.

Why the verdict travels: each candidate is measured beside the unchanged target, on this machine at
the same time, and judged on their ratio, so nothing is compared with a number measured elsewhere;
errors and warm rates are counted, not timed (docs/ci.md).

A demonstration finishes whatever the verdicts: ``fail`` and ``cannot be judged`` are outcomes to
explain, not errors. The demo exits non-zero only when something broke (a command exited with a
code that is not one of its verdicts); that code is the command's own (``docs/exit-codes.md``).
"""

from __future__ import annotations

import os
import secrets
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import orjson
from rich.console import Console
from rich.markup import escape

from harness.common import console as cons
from harness.common.auth import ADMIN_TOKEN_ENV
from harness.common.errors import ExitCode, HarnessError
from harness.common.io import write_json
from harness.common.settings import HarnessSettings
from harness.experiments.capacity_result import CapacityResult
from harness.gates.metrics import format_value

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "fixtures" / "traces" / "genaiTestTrace.json"
CI_RECIPE = ROOT / "fixtures" / "recipes" / "ci.yaml"
SERVE_ARGS = ("--preset", "tiny", "--cache")
VERDICTS_FILE = "verdicts.json"
Verdict = Literal["pass", "fail", "unjudgeable"]


def corpus_build_args(run_dir: Path, n: int) -> list[str]:
    """``harness corpus build …`` for the demo and the CI job (docs/ci.md spells the same recipe): the
    bundled four-section template around real user requests (the default request logs: the CLINC150
    and CrossWOZ samples in fixtures/corpus/), weighted by the trace's scenarios."""
    return [
        "corpus", "build",
        "--template", str(ROOT / "templates" / "prompts" / "four_section.j2"),
        "--scenarios", str(run_dir / "scenarios.json"),
        "--n", str(n), "--seed", "0", "--out", str(run_dir / "corpus"),
        # The trace's slowest hop carried 8k prompt tokens; a demo on 2 CPU cores keeps prompts short
        # (the trace's lengths clipped here) so that its runs are long in requests, not in seconds.
        "--max-input-tokens", "320",
    ]  # fmt: skip


@dataclass
class DemoConfig:
    """The demo's knobs (the defaults take about 14 minutes on 2 CPU cores: 805 s measured on a quiet
    machine, 2026-12-07, with 8 block pairs a look; tests/test_demo.py runs them)."""

    out_dir: Path
    corpus_n: int = 128
    rate_share: float = 0.5
    """Every case's rate, as a share of the capacity ``harness capacity`` measured."""
    slo: str = "ttft_from_intended_p50<=3x,tpot_p50<=3x,error_rate<=0.1"
    """The capacity SLO: median TTFT and TPOT at most 3× their unloaded values (the knee, measured
    the same way on any machine)."""
    probe_requests: int = 36
    max_tokens_cap: int = 8
    serve_args: tuple[str, ...] = SERVE_ARGS
    looks: int = 2
    """Looks of each A/B case: a clear regression stops after the first."""
    ab_blocks: int = 8
    """Block pairs a look: the verdict's ``t`` test has one degree of freedom fewer than the pairs, and
    with the CI job's 4 a look of the demo's small blocks could not prove a 1.3× slower engine."""
    ab_block_requests: int = 8
    """Distinct requests a block: no two block pairs share one, so ``looks × ab_blocks ×
    ab_block_requests`` must fit in the corpus (2 × 8 × 8 = 128)."""
    warm_requests: int = 64
    """Requests each side sends again, cached: the warm rate's limit (fixtures/baselines/ci-limits.yaml)
    needs 61 to catch a 30 % loss of warm hits at power 0.95, and says so below that."""
    metrics: str = "ttft_p50,tpot_p50,itl_p50,e2e_p50,prefill_kv_bytes_p50"
    """The CI job's metrics but its P95s: a P95 needs 200 request pairs, the demo's blocks hold 128."""
    cases: tuple[str, ...] = ()
    """The verdicts to show, by :data:`CASES` name (empty: all of them)."""

    def __post_init__(self) -> None:
        # Checked here, not minutes in when ``harness ab`` refuses the blocks (a demo once did).
        need = self.looks * self.ab_blocks * self.ab_block_requests
        if need > self.corpus_n:
            raise ValueError(
                f"{self.looks} look(s) of {self.ab_blocks} A/B block pairs of {self.ab_block_requests} "
                f"distinct requests need {need} prompts; corpus_n is {self.corpus_n}"
            )
        if self.warm_requests > need:
            raise ValueError(
                f"a warm pass of {self.warm_requests} needs as many block requests; there are {need}"
            )


@dataclass
class DemoContext:
    """What the steps share."""

    config: DemoConfig
    console: Console
    outcome: dict[str, Any] = field(default_factory=dict)
    capacity_rps: float | None = None
    admin_token: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    """The cache admin API's token (not open to the machine), handed to every ``harness`` command and
    the servers they start through the environment, as a user would."""

    @property
    def run_dir(self) -> Path:
        return self.config.out_dir

    def job(self) -> list[str]:
        """The CI job's recipe (``--recipe fixtures/recipes/ci.yaml``) and what the demo changes in it:
        the corpus, the capacity measured once, the sizes its corpus allows."""
        c = self.config
        assert self.capacity_rps is not None
        return [
            "--recipe", str(CI_RECIPE), "--corpus", str(self.run_dir / "corpus"),
            "--rate", f"{c.rate_share:.0%}", "--capacity", f"{self.capacity_rps:g}",
            "--max-tokens-cap", str(c.max_tokens_cap), "--looks", str(c.looks), "--blocks", str(c.ab_blocks),
            "--block-requests", str(c.ab_block_requests), "--warm-requests", str(c.warm_requests),
            "--metrics", c.metrics,
        ]  # fmt: skip


class StepFailed(HarnessError):
    """A demo command exited with a code that is none of its verdicts: something broke.

    The demo exits with that command's own code when the table knows it (``docs/exit-codes.md``)."""

    def __init__(self, command: str, code: int) -> None:
        super().__init__(f"`{command}` exited with {code}")
        known = {int(c) for c in ExitCode}
        self.exit_code = ExitCode(code) if code in known and code != 0 else ExitCode.UNAVAILABLE


def harness(ctx: DemoContext, *args: str, ok: Sequence[int] = (0,)) -> int:
    """Run ``harness ARGS`` as a user would (its output goes straight to the terminal); its exit code,
    which must be one of ``ok``."""
    command = "harness " + shlex.join(args)
    ctx.console.print(f"[bold]$ {escape(command)}[/]", highlight=False, soft_wrap=True)
    sys.stdout.flush()
    env = {**os.environ, ADMIN_TOKEN_ENV: ctx.admin_token}
    code = subprocess.run(
        [sys.executable, "-m", "harness.cli", *args], cwd=ROOT, env=env, check=False
    ).returncode
    if code == int(ExitCode.INTERRUPTED):
        raise KeyboardInterrupt
    if code not in ok:
        raise StepFailed(command, code)
    return code


VERDICT_CODES = (int(ExitCode.OK), int(ExitCode.CHECK_FAILED), int(ExitCode.UNJUDGEABLE))
"""``harness ab`` / ``harness capacity`` exit codes that are verdicts, not breakage."""


class Step(Protocol):
    name: str

    def run(self, ctx: DemoContext) -> None: ...


@dataclass
class Scenarios:
    name: str = "traces → cold paths → scenarios"

    def run(self, ctx: DemoContext) -> None:
        cold = ctx.run_dir / "coldpaths.jsonl"
        # The GenAI trace's entry hop is GraphQL (no http.* attributes), so every cross-service hop
        # of any protocol is considered, and a cache read counts only on the hop itself.
        harness(ctx, "traces", "coldpaths", str(TRACE), "--hops", "all", "--protocol", "any",
                "--cache-scope", "hop", "-o", str(cold))  # fmt: skip
        harness(ctx, "traces", "scenarios", str(cold), "--k", "12", "-o", str(ctx.run_dir / "scenarios.json"))


@dataclass
class Corpus:
    name: str = "corpus build"

    def run(self, ctx: DemoContext) -> None:
        harness(ctx, *corpus_build_args(ctx.run_dir, ctx.config.corpus_n))


def demo_capacity(answer: CapacityResult) -> tuple[float, str | None]:
    """The rate the demo's paired runs take their share of, and a note when the search found none.

    When not even the lowest probe (half of what one stream sustains) met the SLO or could be judged
    against it (a machine busy enough that a short probe's percentile interval is wide: seen at load
    average 7), that rate is still the best estimate of what this machine serves, and a share of it
    loads the target less than anything the search judged. The demo goes on there and says so,
    rather than stopping where a user learns nothing.
    """
    if answer.exit_code == int(ExitCode.OK) or not answer.probes:
        return answer.capacity_rps, None
    rate = answer.probes[0].rate
    return rate, (
        f"capacity: not found ({answer.reason}); the paired runs take their share of the lowest "
        f"probed rate, {rate:g} req/s, instead"
    )


@dataclass
class Capacity:
    """How much this machine's target serves: every case loads a share of it."""

    name: str = "harness capacity: what this machine's target serves"

    def run(self, ctx: DemoContext) -> None:
        c = ctx.config
        out = ctx.run_dir / "capacity"
        harness(
            ctx, "capacity", "--serve-args", shlex.join(c.serve_args),
            "--corpus", str(ctx.run_dir / "corpus"), "--slo", c.slo,
            "--probe-requests", str(c.probe_requests), "--probe-seconds", "3", "--resolution", "0.2",
            # Probes take the path the blocks take (cache misses: embedded, stored), not only the
            # engine's, or the share would be of a capacity the blocks never have.
            "--use-cache", "--max-tokens-cap", str(c.max_tokens_cap), "--out", str(out), "--force",
            ok=VERDICT_CODES,
        )  # fmt: skip
        answer = CapacityResult.model_validate_json((out / "capacity.json").read_bytes())
        ctx.capacity_rps, note = demo_capacity(answer)
        if note is not None:
            ctx.console.print(f"[yellow]{escape(note)}[/]", highlight=False, soft_wrap=True)
        ctx.outcome["capacity_rps"] = ctx.capacity_rps


@dataclass(frozen=True)
class Case:
    """One verdict the demo shows: the candidate (unchanged, or a regression injected on purpose with
    ``harness serve``'s fault injection) judged beside the unchanged base, and what it must be."""

    name: str
    """The key in ``verdicts.json`` and the results directory."""
    what: str
    inject: tuple[str, ...] = ()
    """``harness serve`` flags that make the regression."""
    expected: Verdict = "fail"


CASES: tuple[Case, ...] = (
    Case("unchanged", "the unchanged target", expected="pass"),
    Case("regression", "every engine step twice as long", ("--inject-slowdown", "2")),
    Case("slower_1_3x", "every engine step 1.3 times as long", ("--inject-slowdown", "1.3")),
    Case("errors_20pct", "20 % of generation requests answer 500", ("--inject-error-rate", "0.2")),
    Case("warm_miss_30pct", "30 % of requests miss both caches", ("--inject-cache-miss-rate", "0.3")),
)
CASE_BY_NAME = {c.name: c for c in CASES}


def chosen_cases(config: DemoConfig) -> tuple[Case, ...]:
    """The cases ``config`` asks for (all by default; ``unchanged`` always: it is what the others are
    told apart from)."""
    names = set(config.cases or CASE_BY_NAME) | {"unchanged"}
    return tuple(c for c in CASES if c.name in names)


def verdict_of(ctx: DemoContext, case: Case) -> tuple[Verdict, dict[str, Any]]:
    """A case's verdict (the job's: the ratios, the error rate and the declared limits together) and
    its ``ab.json``."""
    doc = orjson.loads((ctx.run_dir / case.name / "ab.json").read_bytes())
    return doc.get("verdict") or "unjudgeable", doc


@dataclass
class Judged:
    """One case: the CI job's ``harness ab``, the unchanged target as the base, the case's as the
    candidate (both started fresh, so neither has served more than the other)."""

    which: str
    name: str = ""

    def __post_init__(self) -> None:
        self.name = self.name or f"harness ab beside the unchanged target: {CASE_BY_NAME[self.which].what}"

    def run(self, ctx: DemoContext) -> None:
        case = CASE_BY_NAME[self.which]
        out = ctx.run_dir / case.name
        base = shlex.join(ctx.config.serve_args)
        code = harness(
            ctx, "ab", *ctx.job(), "--base-serve-args", base,
            "--candidate-serve-args", shlex.join([*ctx.config.serve_args, *case.inject]),
            "--out", str(out), "--force", ok=VERDICT_CODES,
        )  # fmt: skip
        ctx.outcome[f"{case.name}_exit_code"] = code


@dataclass
class Report:
    name: str = "harness report"

    def run(self, ctx: DemoContext) -> None:
        u, r = ctx.run_dir / "unchanged", ctx.run_dir / "regression"
        verdicts = [f"{c.name}={ctx.run_dir / c.name / 'ab.json'}" for c in chosen_cases(ctx.config)]
        sets = [f"cold={u / 'candidate' / '01'}", f"warm={u / 'warm' / 'candidate'}"]
        if (r / "candidate" / "01").exists():
            sets.append(f"regressed-cold={r / 'candidate' / '01'}")
        harness(
            ctx, "report", *sets, *(a for v in verdicts for a in ("--verdict", v)),
            "--capacity-json", str(ctx.run_dir / "capacity" / "capacity.json"),
            "-o", str(ctx.run_dir / "report.html"), "--title", "harness demo: tiny CPU target",
        )  # fmt: skip


VERDICT_MEANING: dict[str, str] = {
    "pass": "every gate held: on these numbers the target is as good as the baseline (CI: exit 0)",
    "fail": "at least one gate proved a regression, its whole interval beyond the limit (CI: exit 1)",
    "unjudgeable": "no regression was proven, but some gate could not decide: the run was too small, "
    "too noisy or untrustworthy for its tolerance (CI: exit 6; fail closed, never a silent pass)",
}
EXPECTED: dict[str, Verdict] = {c.name: c.expected for c in CASES}


@dataclass
class Explain:
    """What the verdicts mean, ``verdicts.json``, and where to look."""

    name: str = "what it means"

    def run(self, ctx: DemoContext) -> None:
        say = ctx.console.print
        verdicts: dict[str, Any] = {}
        say(f"capacity: {ctx.capacity_rps:g} requests/s within {ctx.config.slo}; every case at "
            f"{ctx.config.rate_share:.0%} of it", highlight=False)  # fmt: skip
        modes: dict[str, str] = {}
        for case in chosen_cases(ctx.config):
            word, doc = verdict_of(ctx, case)
            verdicts[case.name] = word
            modes[case.name] = "A/B beside the unchanged target (the CI job)"
            colour = {"pass": "green", "fail": "red"}.get(word, "yellow")
            mark = "as it should" if word == case.expected else f"expected {case.expected.upper()}"
            say(f"[bold {colour}]{case.name} ({case.what}): {word.upper()}[/] ({mark}) — "
                f"{VERDICT_MEANING[word]}")  # fmt: skip
            self._why_ab(ctx, doc)
        verdicts["capacity_rps"] = ctx.capacity_rps
        verdicts["modes"] = modes
        write_json(ctx.run_dir / VERDICTS_FILE, verdicts)
        ctx.outcome.update(verdicts=verdicts, report=str(ctx.run_dir / "report.html"))
        say(f"[bold]verdicts:[/] {ctx.run_dir / VERDICTS_FILE}", highlight=False)
        say(
            f"[bold]report:[/] {ctx.run_dir / 'report.html'}  (summary for a PR comment: "
            f"{ctx.run_dir / 'report.md'})",
            highlight=False,
        )

    @staticmethod
    def _why_ab(ctx: DemoContext, doc: dict[str, Any]) -> None:
        """What decided: the failed ratios (or every one), the error rate and the declared limits."""
        say = ctx.console.print
        j = doc.get("judgement") or {}
        metrics = j.get("metrics", [])
        shown = [m for m in metrics if m.get("verdict") == "fail"] or metrics[:3]
        for m in shown:
            ratio, lo, hi = m.get("ratio"), m.get("lo"), m.get("hi")
            if ratio is not None and lo is not None and hi is not None:
                say(f"  {m['metric']}: candidate/base {ratio:.2f}x [{lo:.2f}, {hi:.2f}] — {m['verdict']}",
                    highlight=False)  # fmt: skip
        e = j.get("error_rate") or {}
        if e.get("verdict") == "fail":
            say(f"  error_rate: {escape(e.get('reason', ''))}", highlight=False)
        gate = doc.get("gate") or {}
        if gate.get("verdict") == "fail":
            report = orjson.loads(Path(gate["file"]).read_bytes())
            for g in report["gates"]:
                if g["verdict"] == "fail":
                    value = format_value(g["measured"], g["unit"]) if g["measured"] is not None else "—"
                    say(f"  {g['id']}@{g['label']}: {value}, limit {format_value(g['limit'], g['unit'])}",
                        highlight=False)  # fmt: skip


def default_steps(config: DemoConfig) -> list[Step]:
    return [
        Scenarios(),
        Corpus(),
        Capacity(),
        *(Judged(c.name) for c in chosen_cases(config)),
        Report(),
        Explain(),
    ]


def run_demo(config: DemoConfig | None = None, steps: Sequence[Step] | None = None) -> DemoContext:
    """Run the demo's steps in order; every server it starts is stopped on every exit path."""
    console = cons.out()
    cfg = config or DemoConfig(out_dir=HarnessSettings().run_dir / "demo")
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    ctx = DemoContext(cfg, console)
    started = time.perf_counter()
    for step in steps if steps is not None else default_steps(cfg):
        console.rule(f"[bold]{step.name}")
        step.run(ctx)
    console.rule(f"[bold]done in {time.perf_counter() - started:.0f} s")
    return ctx


def main() -> None:
    try:
        run_demo()
    except HarnessError as exc:
        cons.err().print(f"[bold red]demo: error:[/] {escape(str(exc))}", highlight=False)
        sys.exit(int(exc.exit_code))
    except KeyboardInterrupt:
        cons.err().print("demo: interrupted (every server it started was stopped)")
        sys.exit(int(ExitCode.INTERRUPTED))


if __name__ == "__main__":
    main()
