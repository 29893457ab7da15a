"""The CI job a user copies, run as docs/ci.md writes it, against what is shipped.

The workflow in docs/ci.md ("The GitHub Actions job") is read from the page itself, and its
"Corpus" and "The candidate beside the base, judged in the job" steps run as written (bash, from a
working directory holding the repository's fixtures, templates and virtualenv, as a checkout does).
The base is the same checkout's ``harness serve`` (an unchanged target: the pull request changed
nothing), reached at ``$BASE_URL`` as the workflow's "base revision" step gives it; the only change
to the job is a smaller request count, through flags appended to the recipe's. It must exit 0: a
change to the engine, the corpus, the recipe or the limits that left the documented job unable to
pass an unchanged target fails here, not in a user's CI. It runs by itself (marked ``alone``), as the
job does on its own runner.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from harness.experiments.ab_record import ABRun
from tests.server.conftest import harness_server

ROOT = Path(__file__).resolve().parent.parent
JOB_STEP = "The candidate beside the base, judged in the job"
SMALLER = (
    "--looks 1 --blocks 8 --block-requests 16 --warm-requests 64 --resolution 0.3 "
    "--metrics ttft_p50,tpot_p50,itl_p50,prefill_kv_bytes_p50"
)
"""What the test changes: 128 request pairs in one look (the P95s need 200: the job's own size), a warm
pass of 64 requests a side (the warm rate's limit needs 61 to be powered), and a coarser capacity
search; every rule and limit as shipped."""


def workflow_steps() -> dict[str, str]:
    """The documented workflow's steps that run a script: name → script."""
    doc = (ROOT / "docs" / "ci.md").read_text(encoding="utf-8")
    section = doc[doc.index("## The GitHub Actions job") :]
    block = re.search(r"```yaml\n(.*?)```", section, flags=re.S)
    assert block is not None, "docs/ci.md has no workflow block under 'The GitHub Actions job'"
    job = yaml.safe_load(block.group(1))
    steps = job["jobs"]["gate"]["steps"]
    return {s["name"]: s["run"] for s in steps if "name" in s and "run" in s}


def test_the_documented_workflow_has_the_steps_this_test_runs() -> None:
    steps = workflow_steps()
    assert {"Corpus", JOB_STEP, "The base revision's target"} <= set(steps)
    assert "harness ab --recipe fixtures/recipes/ci.yaml" in steps[JOB_STEP]
    assert '--base-url "$BASE_URL"' in steps[JOB_STEP] and "-o runs/ab" in steps[JOB_STEP]
    assert "BASE_URL=" in steps["The base revision's target"]


@pytest.mark.slow
@pytest.mark.alone  # as a user's job runs: on its own runner (`make test` runs it after the rest)
def test_the_documented_job_passes_an_unchanged_target(tmp_path: Path) -> None:
    steps = workflow_steps()
    work = tmp_path / "checkout"
    work.mkdir()
    # A checkout as the workflow sees it: the repository's files, its virtualenv, no runs/ yet.
    for name in ("fixtures", "templates", ".venv"):
        (work / name).symlink_to(ROOT / name)
    output = tmp_path / "github_output"
    env = {**os.environ, "GITHUB_OUTPUT": str(output)}
    corpus = subprocess.run(
        ["bash", "-e", "-c", steps["Corpus"]], cwd=work, env=env, capture_output=True, text=True, check=False
    )
    assert corpus.returncode == 0, corpus.stderr[-3000:]
    script = steps[JOB_STEP].replace("-o runs/ab", f"{SMALLER} -o runs/ab")
    assert script != steps[JOB_STEP]
    with harness_server(tmp_path / "base", "--cache") as base:
        job = subprocess.run(
            ["bash", "-c", script], cwd=work, env={**env, "BASE_URL": base.url}, capture_output=True,
            text=True, check=False,
        )  # fmt: skip
    assert job.returncode == 0, job.stderr[-3000:]
    assert "rc=0" in output.read_text(), job.stderr[-4000:]
    run = ABRun.model_validate_json((work / "runs" / "ab" / "ab.json").read_text())
    assert run.verdict == "pass" and run.exit_code == 0, run.message
    # The base's capacity was measured in the job and both arms got its share; the limits file judged
    # the candidate's warm pass; the verdict states its family-wise rate and each metric's power.
    assert run.capacity is not None and run.rate_rps == pytest.approx(
        run.capacity.share * run.capacity.capacity_rps, rel=0.01
    )
    assert run.gate is not None and run.gate.verdict == "pass"
    gate = json.loads(Path(run.gate.file).read_text())
    assert [g["metric"] for g in gate["gates"]] == ["warm_rate"]
    assert run.judgement is not None and run.judgement.family_alpha == pytest.approx(0.05)
    assert all(m.power is not None for m in run.judgement.metrics)
    kv = next(m for m in run.judgement.metrics if m.metric == "prefill_kv_bytes_p50")
    assert kv.ratio == 1.0  # the same prompts cost the same KV blocks on the same engine
