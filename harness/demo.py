"""``make demo`` (``python -m harness.demo``): the whole path on bundled fixtures, as a user types it.

Every step is one ``harness`` command, printed before it runs and run as a child process, exactly as
a user would type it (nothing here measures, parses SSE or reads a server log: the commands do):

1. ``harness traces coldpaths`` and ``harness traces scenarios`` on the bundled GenAI Jaeger trace:
   cold first hops grouped into scenario classes;
2. ``harness corpus build``: real user requests (the bundled CLINC150 and CrossWOZ samples) in the
   bundled template, weighted by those scenarios
   (:func:`corpus_build_args`, the one place that spells the corpus recipe);
3. ``harness run``: ``harness serve --preset tiny --cache`` on a free port, every cache level
   flushed, the cold replay, the warmup ladder of ``fixtures/plans/tiny.yaml``, the warm check, the
   warm replay, the comparison; the server stopped;
4. ``harness gate`` against ``fixtures/baselines/tiny-cpu.yaml`` (JUnit and a JSON verdict);
5. ``harness report``: one HTML file with the plots and a Markdown summary;
6. what the verdict means and why, and where the report is.

A demonstration finishes whatever the verdict: ``fail`` and ``cannot be judged`` are outcomes to
explain, not errors. The demo exits non-zero only when something broke (a command exited with a
code that is not one of its verdicts); that code is the command's own (``docs/exit-codes.md``).
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import orjson
from rich.console import Console
from rich.markup import escape

from harness.common.errors import ExitCode, HarnessError
from harness.common.settings import HarnessSettings
from harness.gates.metrics import format_value

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "fixtures" / "traces" / "genaiTestTrace.json"
PLAN = ROOT / "fixtures" / "plans" / "tiny.yaml"
BASELINE = ROOT / "fixtures" / "baselines" / "tiny-cpu.yaml"


def corpus_build_args(run_dir: Path, n: int) -> list[str]:
    """``harness corpus build …`` for the demo and the CI job (docs/ci.md spells the same recipe): the
    bundled four-section template around real user requests (the default request logs: the CLINC150
    and CrossWOZ samples in fixtures/corpus/), weighted by the trace's scenarios."""
    return [
        "corpus", "build",
        "--template", str(ROOT / "templates" / "prompts" / "four_section.j2"),
        "--scenarios", str(run_dir / "scenarios.json"),
        "--n", str(n), "--seed", "0", "--out", str(run_dir / "corpus"),
        # The trace's slowest hop carried 8k prompt tokens; the tiny preset's context is 2048.
        "--max-input-tokens", "1536",
    ]  # fmt: skip


@dataclass
class DemoConfig:
    """The demo's knobs (the defaults fit about three minutes on 2 CPU cores)."""

    out_dir: Path
    corpus_n: int = 60
    rate: float = 4.0
    duration_s: float = 20.0
    max_tokens_cap: int = 16
    plan: Path = PLAN
    baseline: Path = BASELINE
    serve_args: str = "--preset tiny --cache"


@dataclass
class DemoContext:
    """What the steps share."""

    config: DemoConfig
    console: Console
    outcome: dict[str, Any] = field(default_factory=dict)

    @property
    def run_dir(self) -> Path:
        return self.config.out_dir

    @property
    def paired(self) -> Path:
        return self.config.out_dir / "paired"


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
    code = subprocess.run([sys.executable, "-m", "harness.cli", *args], cwd=ROOT, check=False).returncode
    if code == int(ExitCode.INTERRUPTED):
        raise KeyboardInterrupt
    if code not in ok:
        raise StepFailed(command, code)
    return code


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


@dataclass
class PairedRun:
    name: str = "harness run: cold, warmup ladder, warm check, warm"

    def run(self, ctx: DemoContext) -> None:
        c = ctx.config
        code = harness(
            ctx, "run", "--serve-args", c.serve_args, "--corpus", str(ctx.run_dir / "corpus"),
            "--rate", f"{c.rate:g}", "--duration", f"{c.duration_s:g}",
            "--max-tokens-cap", str(c.max_tokens_cap), "--plan", str(c.plan),
            "--out", str(ctx.paired), "--force",
            ok=(int(ExitCode.OK), int(ExitCode.UNJUDGEABLE)),  # 6: measured, but not warm: explained below
        )  # fmt: skip
        ctx.outcome["run_exit_code"] = code


@dataclass
class Gate:
    name: str = "harness gate"

    def run(self, ctx: DemoContext) -> None:
        p = ctx.paired
        code = harness(
            ctx, "gate", "--baseline", str(ctx.config.baseline), f"cold={p / 'cold'}", f"warm={p / 'warm'}",
            "--junit", str(p / "gate.junit.xml"), "--json", str(p / "gate.json"),
            ok=(int(ExitCode.OK), int(ExitCode.CHECK_FAILED), int(ExitCode.UNJUDGEABLE)),  # the verdicts
        )  # fmt: skip
        ctx.outcome["gate_exit_code"] = code


@dataclass
class Report:
    name: str = "harness report"

    def run(self, ctx: DemoContext) -> None:
        p = ctx.paired
        harness(
            ctx, "report", f"cold={p / 'cold'}", f"ladder={p / 'ladder'}", f"warm={p / 'warm'}",
            "--verdict", str(p / "gate.json"), "-o", str(p / "report.html"),
            "--title", "harness demo: tiny CPU target",
        )  # fmt: skip


VERDICT_MEANING = {
    "pass": "every gate held: on these numbers the target is as good as the baseline (CI: exit 0)",
    "fail": "at least one gate proved a regression, its whole interval beyond the limit (CI: exit 1)",
    "unjudgeable": "no regression was proven, but some gate could not decide: the run was too small, "
    "too noisy or untrustworthy for its tolerance (CI: exit 6; fail closed, never a silent pass)",
}


@dataclass
class Explain:
    """What the run and the verdict mean, and where to look."""

    name: str = "what it means"

    def run(self, ctx: DemoContext) -> None:
        p, say = ctx.paired, ctx.console.print
        run = orjson.loads((p / "run.json").read_bytes())
        check = run.get("warm_check") or {}
        say(f"warm check: {escape(check.get('reason', '—'))}", highlight=False)
        for row in orjson.loads((p / "comparison.json").read_bytes())["rows"]:
            if row["metric"] in ("ttft_p95", "hit_rate_any", "prefill_kv_bytes_p95"):
                cold, warm = (format_value(row[side]["value"], row["unit"]) for side in ("cold", "warm"))
                say(f"  {row['metric']}: cold {cold} → warm {warm} ({row['verdict']})", highlight=False)
        verdict = orjson.loads((p / "gate.json").read_bytes())
        word = verdict["verdict"]
        colour = {"pass": "green", "fail": "red"}.get(word, "yellow")
        say(f"[bold {colour}]gate verdict: {word.upper()}[/] — {VERDICT_MEANING.get(word, word)}")
        whys: dict[str, list[str]] = {}
        for g in verdict["gates"]:
            if g["verdict"] != "pass":
                whys.setdefault(g.get("why") or g["reason"], []).append(f"{g['id']}@{g.get('label') or '—'}")
        for why, ids in whys.items():
            more = " …" if len(ids) > 6 else ""
            say(f"  {len(ids)} gate(s) {escape(why)}: {escape(', '.join(ids[:6]))}{more}", highlight=False)
        if word == "unjudgeable":
            requests = (run.get("phases") or {}).get("warm", {}).get("requests")
            say(f"  (the demo replays {requests} requests a phase; the CI job in docs/ci.md replays more)")
        ctx.outcome.update(verdict=word, report=str(p / "report.html"))
        say(
            f"[bold]report:[/] {p / 'report.html'}  (summary for a PR comment: {p / 'report.md'})",
            highlight=False,
        )


def default_steps() -> list[Step]:
    return [Scenarios(), Corpus(), PairedRun(), Gate(), Report(), Explain()]


def run_demo(config: DemoConfig | None = None, steps: Sequence[Step] | None = None) -> DemoContext:
    """Run the demo's steps in order; ``harness run`` stops its server on every exit path."""
    console = Console()
    cfg = config or DemoConfig(out_dir=HarnessSettings().run_dir / "demo")
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    ctx = DemoContext(cfg, console)
    started = time.perf_counter()
    for step in steps if steps is not None else default_steps():
        console.rule(f"[bold]{step.name}")
        step.run(ctx)
    console.rule(f"[bold]done in {time.perf_counter() - started:.0f} s")
    return ctx


def main() -> None:
    try:
        run_demo()
    except HarnessError as exc:
        Console(stderr=True).print(f"[bold red]demo: error:[/] {escape(str(exc))}", highlight=False)
        sys.exit(int(exc.exit_code))
    except KeyboardInterrupt:
        Console(stderr=True).print("demo: interrupted (harness run stopped its server)")
        sys.exit(int(ExitCode.INTERRUPTED))


if __name__ == "__main__":
    main()
