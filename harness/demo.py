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
3. ``harness serve --preset tiny --cache`` on a free port (the target, started once);
4. ``harness capacity``: how much this machine's target serves within the SLO (open-loop probes);
5. ``harness baseline calibrate --runs 3 --max-runs 5 --recipe R``: three paired cold/warm runs (up
   to five where the spread leaves a latency gate blind) at a share of that capacity (the recipe
   file ``R`` says which), and the baseline they pass, calibrated **on this machine**;
6. ``harness run … --gate``: the unchanged target, gated (it must pass);
7. ``harness ab``: beside it, block by block, the same target with every engine step 1.3 times as
   long (it must fail: a stored baseline from three runs cannot catch 1.3×, an A/B can);
8. ``harness run --serve-args "… --inject-…" … --gate``: the target with a regression injected on
   purpose, each gated (each must fail): every engine step twice as long, 20 % of requests answering
   500, 30 % of requests missing both caches (:data:`CASES`);
9. ``harness report``: one HTML file with the plots (the capacity search's too), every verdict listed,
   and a Markdown summary;
10. what the verdicts mean, and ``verdicts.json``.

Why the verdict travels: the load is a share of what *this* machine's target serves (so a laptop and
a fast runner run at the same utilisation instead of one of them saturating), the baseline is
calibrated here from the run-to-run spread (so it holds this machine's latencies, not another's),
and the client's own jitter widens the intervals instead of voiding the run (docs/gates.md).

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
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import orjson
from rich.console import Console
from rich.markup import escape

from harness.common import console as cons
from harness.common.auth import ADMIN_TOKEN_ENV, SERVER_ADMIN_TOKEN_ENV
from harness.common.errors import ExitCode, HarnessError
from harness.common.io import write_json
from harness.common.settings import HarnessSettings
from harness.experiments.capacity_result import CapacityResult
from harness.gates.metrics import format_value

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "fixtures" / "traces" / "genaiTestTrace.json"
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
    """The demo's knobs (the defaults fit about six minutes on 2 CPU cores: 337 s on a quiet one)."""

    out_dir: Path
    corpus_n: int = 60
    requests: int = 40
    """Requests per phase of every paired run (the medians' gates need 20; a P95 gate 230)."""
    rate_share: float = 0.7
    """The paired runs' rate, as a share of the capacity ``harness capacity`` measured."""
    slo: str = "ttft_p50<=3x,tpot_p50<=3x,error_rate<=0.1"
    """The capacity SLO: median TTFT and TPOT at most 3× their unloaded values (the knee, measured
    the same way on any machine)."""
    probe_requests: int = 36
    max_tokens_cap: int = 8
    runs: int = 3
    """Calibration runs (``harness baseline calibrate --runs``; at least 3)."""
    max_runs: int = 5
    """… and up to this many while a latency gate is blind (``--max-runs``): on a busy machine one run
    slowed by a neighbour makes three runs' allowance (3.8 ranges) wider than the value itself."""
    serve_args: tuple[str, ...] = SERVE_ARGS
    detect_errors: str = "20%"
    """The error rate the demo's baseline must catch: 40 requests a phase catch 20 % against a 1 %
    limit with power 0.95 (5 % needs 181 a phase: the CI recipe's size, not the demo's)."""
    ab_blocks: int = 8
    """Block pairs of ``harness ab``: the interval is widened by how far the block pairs' ratios scatter
    beyond their requests' noise, so it is the number of pairs, more than their size, that lets a
    neighbour's load average out (4 pairs of 10 under a bursty neighbour: 1.3x unjudgeable, 1.06x
    at best; the interval without the widening said 1.22x)."""
    ab_block_requests: int = 7
    """Distinct requests a block: no two block pairs share one, so ``ab_blocks × ab_block_requests``
    must fit in the corpus (8 × 7 = 56 of 60; the medians need 20 pairs, a P95 200: left out)."""
    cases: tuple[str, ...] = ()
    """The verdicts to show, by :data:`CASES` name (empty: all of them)."""

    def __post_init__(self) -> None:
        # Checked here, not minutes in when ``harness ab`` refuses the blocks (a demo once did).
        if self.requests > self.corpus_n:
            raise ValueError(
                f"{self.requests} requests a phase need as many prompts; corpus_n is {self.corpus_n}"
            )
        if self.ab_blocks * self.ab_block_requests > self.corpus_n:
            raise ValueError(
                f"{self.ab_blocks} A/B block pairs of {self.ab_block_requests} distinct requests need "
                f"{self.ab_blocks * self.ab_block_requests} prompts; corpus_n is {self.corpus_n}"
            )


@dataclass
class DemoContext:
    """What the steps share."""

    config: DemoConfig
    console: Console
    outcome: dict[str, Any] = field(default_factory=dict)
    url: str | None = None
    """The target the capacity search, the calibration and the unchanged run share."""
    capacity_rps: float | None = None
    admin_token: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    """The demo server's admin token (its cache admin API is not open to the machine), handed to the
    server and to every ``harness`` command through the environment, as a user would."""

    @property
    def run_dir(self) -> Path:
        return self.config.out_dir

    @property
    def baseline(self) -> Path:
        return self.run_dir / "baseline.yaml"

    def recipe(self) -> list[str]:
        """``--recipe FILE``: what every paired run shares (the calibration's and the gated ones), as a
        recipe file: the same corpus, the same share of the same capacity, the same count."""
        import yaml

        c = self.config
        assert self.capacity_rps is not None
        path = self.run_dir / "recipe.yaml"
        # The same file every time it is asked for, with this run's capacity in it.
        doc = {
            "load": {
                "corpus": str(self.run_dir / "corpus"), "rate": f"{c.rate_share:.0%}",
                "capacity": float(f"{self.capacity_rps:g}"), "max_requests": c.requests,
                "max_duration": 600, "max_tokens_cap": c.max_tokens_cap,
            },
            "warmup": {"probes": 20},  # the fewest that can call a target warm (docs/ci.md)
        }  # fmt: skip
        head = "# The demo's recipe: every paired run (calibration's and the gated ones) runs it.\n"
        path.write_text(head + yaml.safe_dump(doc, sort_keys=False))
        return ["--recipe", str(path)]


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
"""``harness run --gate`` / ``harness gate`` exit codes that are verdicts, not breakage."""


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
    """How much this machine's target serves: the paired runs load a share of it."""

    name: str = "harness capacity: what this machine's target serves"

    def run(self, ctx: DemoContext) -> None:
        c = ctx.config
        assert ctx.url is not None
        out = ctx.run_dir / "capacity"
        harness(
            ctx, "capacity", "--url", ctx.url, "--corpus", str(ctx.run_dir / "corpus"), "--slo", c.slo,
            "--probe-requests", str(c.probe_requests), "--probe-seconds", "3", "--resolution", "0.2",
            # Probes take the path the cold phase takes (cache misses: embedded, stored), not only the
            # engine's, or the share would be of a capacity the cold phase never has.
            "--use-cache", "--max-tokens-cap", str(c.max_tokens_cap), "--out", str(out), "--force",
            ok=VERDICT_CODES,
        )  # fmt: skip
        answer = CapacityResult.model_validate_json((out / "capacity.json").read_bytes())
        ctx.capacity_rps, note = demo_capacity(answer)
        if note is not None:
            ctx.console.print(f"[yellow]{escape(note)}[/]", highlight=False, soft_wrap=True)
        ctx.outcome["capacity_rps"] = ctx.capacity_rps


@dataclass
class Calibrate:
    name: str = "harness baseline calibrate: a baseline made on this machine"

    def run(self, ctx: DemoContext) -> None:
        assert ctx.url is not None
        harness(
            ctx, "baseline", "calibrate", "--runs", str(ctx.config.runs),
            "--max-runs", str(ctx.config.max_runs), "--out", str(ctx.baseline),
            "--workdir", str(ctx.run_dir / "calibration"), "--name", "demo",
            "--detect-errors", ctx.config.detect_errors, "--url", ctx.url, *ctx.recipe(),
        )  # fmt: skip


@dataclass(frozen=True)
class Case:
    """One verdict the demo shows: the target (unchanged, or a regression injected on purpose with
    ``harness serve``'s fault injection), how it is judged, and what the verdict must be."""

    name: str
    """The key in ``verdicts.json`` and the results directory."""
    what: str
    inject: tuple[str, ...] = ()
    """``harness serve`` flags that make the regression."""
    mode: Literal["stored", "ab"] = "stored"
    """``stored``: ``harness run --gate`` against the baseline calibrated here; ``ab``: ``harness ab``
    beside the unchanged target (no stored latency)."""
    expected: Verdict = "fail"


CASES: tuple[Case, ...] = (
    Case("unchanged", "the unchanged target", expected="pass"),
    Case("regression", "every engine step twice as long", ("--inject-slowdown", "2")),
    # A stored baseline from three runs allows their run-to-run spread (3.8 ranges): on 2 cores that
    # holds a 1.3x slower decode (bench/gates.py power). Beside the unchanged target, block by block,
    # the drift cancels and 1.3x shows (docs/gates.md, "A/B in one job").
    Case("slower_1_3x", "every engine step 1.3 times as long", ("--inject-slowdown", "1.3"), "ab"),
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
    """A case's verdict and the file it comes from (``gate.json``, or ``ab.json``'s judgement)."""
    d = ctx.run_dir / case.name
    if case.mode == "ab":
        doc = orjson.loads((d / "ab.json").read_bytes())["judgement"] or {}
        return doc.get("verdict", "unjudgeable"), doc
    doc = orjson.loads((d / "gate.json").read_bytes())
    return doc["verdict"], doc


@dataclass
class Gated:
    """One case judged: ``harness run --gate`` against the calibrated baseline, or ``harness ab``."""

    which: str
    name: str = ""

    def __post_init__(self) -> None:
        case = CASE_BY_NAME[self.which]
        how = "harness ab beside the unchanged target" if case.mode == "ab" else "harness run --gate"
        self.name = self.name or f"{how}: {case.what}"

    def run(self, ctx: DemoContext) -> None:
        case = CASE_BY_NAME[self.which]
        out = ctx.run_dir / case.name
        serve = shlex.join([*ctx.config.serve_args, *case.inject])
        if case.mode == "ab":
            assert ctx.url is not None  # the base is the demo target, up for the whole served part
            code = harness(
                ctx, "ab", "--base-url", ctx.url, "--candidate-serve-args", serve, *ctx.recipe(),
                "--blocks", str(ctx.config.ab_blocks), "--block-requests", str(ctx.config.ab_block_requests),
                "--out", str(out), "--force", ok=VERDICT_CODES,
            )  # fmt: skip
        else:
            # The unchanged target is the demo's own; a regression gets a target of its own, started
            # (and stopped) by harness run with the fault injected.
            target = ["--url", ctx.url] if not case.inject and ctx.url else ["--serve-args", serve]
            code = harness(
                ctx, "run", *target, *ctx.recipe(), "--gate", str(ctx.baseline), "--out", str(out),
                "--force", ok=VERDICT_CODES,
            )  # fmt: skip
        ctx.outcome[f"{case.name}_exit_code"] = code


@dataclass
class Report:
    name: str = "harness report"

    def run(self, ctx: DemoContext) -> None:
        u, r = ctx.run_dir / "unchanged", ctx.run_dir / "regression"
        verdicts = [
            f"{c.name}={ctx.run_dir / c.name / ('ab.json' if c.mode == 'ab' else 'gate.json')}"
            for c in chosen_cases(ctx.config)
        ]
        harness(
            ctx, "report", f"cold={u / 'cold'}", f"warm={u / 'warm'}", f"regressed-cold={r / 'cold'}",
            *(a for v in verdicts for a in ("--verdict", v)),
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
        say(f"capacity: {ctx.capacity_rps:g} requests/s within {ctx.config.slo}; every paired run at "
            f"{ctx.config.rate_share:.0%} of it", highlight=False)  # fmt: skip
        modes: dict[str, str] = {}
        for case in chosen_cases(ctx.config):
            word, doc = verdict_of(ctx, case)
            verdicts[case.name] = word
            modes[case.name] = "A/B beside the unchanged target" if case.mode == "ab" else "stored baseline"
            colour = {"pass": "green", "fail": "red"}.get(word, "yellow")
            mark = "as it should" if word == case.expected else f"expected {case.expected.upper()}"
            say(f"[bold {colour}]{case.name} ({case.what}; {modes[case.name]}): {word.upper()}[/] ({mark}) — "
                f"{VERDICT_MEANING[word]}")  # fmt: skip
            if case.mode == "ab":
                self._why_ab(ctx, doc)
            else:
                self._why(ctx, doc, word)
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
    def _why_ab(ctx: DemoContext, judgement: dict[str, Any]) -> None:
        """The A/B ratios that decided."""
        for m in judgement.get("metrics", [])[:4]:
            ratio, lo, hi = m.get("ratio"), m.get("lo"), m.get("hi")
            if ratio is not None and lo is not None and hi is not None:
                ctx.console.print(
                    f"  {m['metric']}: candidate/base {ratio:.2f}x [{lo:.2f}, {hi:.2f}] — {m['verdict']}",
                    highlight=False,
                )

    @staticmethod
    def _why(ctx: DemoContext, gate: dict[str, Any], word: str) -> None:
        """The gates that decided, with their numbers (failures first), or the causes of a refusal."""
        say = ctx.console.print
        failed = [g for g in gate["gates"] if g["verdict"] == "fail"]
        for g in failed[:4]:
            value = format_value(g["measured"], g["unit"]) if g["measured"] is not None else "—"
            limit = format_value(g["limit"], g["unit"])
            say(f"  {g['id']}@{g['label']}: {value}, limit {limit}", highlight=False)
        if word != "unjudgeable":
            return
        whys: dict[str, list[str]] = {}
        for g in gate["gates"]:
            if g["verdict"] not in ("pass", "fail"):
                whys.setdefault(g.get("why") or g["reason"], []).append(f"{g['id']}@{g.get('label') or '—'}")
        for why, ids in whys.items():
            more = " …" if len(ids) > 6 else ""
            say(f"  {len(ids)} gate(s) {escape(why)}: {escape(', '.join(ids[:6]))}{more}", highlight=False)


@contextmanager
def demo_target(ctx: DemoContext) -> Iterator[None]:
    """``harness serve`` for the capacity search, the calibration and the unchanged run (one target,
    started once: a fresh start per run would cost more than the runs); stopped on every exit path."""
    from harness.server.launch import running_server

    log_dir = ctx.run_dir / "server"
    env = {"HARNESS__RUN_DIR": str((log_dir / "state").resolve()), SERVER_ADMIN_TOKEN_ENV: ctx.admin_token}
    ctx.console.print(
        f"[bold]$ export {ADMIN_TOKEN_ENV}=… {SERVER_ADMIN_TOKEN_ENV}=…  # the cache admin API's token[/]",
        highlight=False,
    )
    ctx.console.print(
        f"[bold]$ harness serve {shlex.join(ctx.config.serve_args)} --port 0 &[/]", highlight=False
    )
    with running_server(list(ctx.config.serve_args), log_dir=log_dir, env=env) as server:
        ctx.url = server.url
        ctx.console.print(f"serving {server.model} at {server.url}", highlight=False)
        try:
            yield
        finally:
            ctx.url = None


def default_steps(config: DemoConfig) -> list[Step]:
    cases = chosen_cases(config)
    served = ServedSteps(
        steps=(Capacity(), Calibrate(), Gated("unchanged"), *(Gated(c.name) for c in cases if c.mode == "ab"))
    )
    stored_regressions = [Gated(c.name) for c in cases if c.inject and c.mode == "stored"]
    return [Scenarios(), Corpus(), served, *stored_regressions, Report(), Explain()]


@dataclass
class ServedSteps:
    """Capacity, calibration and the unchanged run against the one demo target."""

    name: str = "harness serve --preset tiny --cache"
    steps: tuple[Step, ...] = ()

    def run(self, ctx: DemoContext) -> None:
        with demo_target(ctx):
            for step in self.steps:
                ctx.console.rule(f"[bold]{step.name}")
                step.run(ctx)


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
