"""``harness analysis effect`` end to end on the bundled Mooncake sample: a real ``harness serve --preset
tiny``, three real Locust replays of the window, the preloads through the real prefix cache, the gates
and the report. It waits on the processes and their files, never on the clock."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.analysis.effect import read_effect
from harness.corpus.build import BuildInputs, build_corpus
from harness.corpus.model import read_corpus
from harness.corpus.settings import CorpusSettings

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "fixtures" / "corpus" / "mooncake_sample.jsonl"
GATES = """\
schema_version: 1
name: effect-sample
gates:
  - {metric: error_rate, threshold: 0.0, abs_tolerance: 0.5, min_samples: 10}
  - {metric: hit_rate_prefix, threshold: 0.9, abs_tolerance: 0.5, min_samples: 10, phase: planned}
"""

pytestmark = pytest.mark.slow


def harness(*args: str, timeout: float = 300.0) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "harness.cli", *args]
    return subprocess.run(cmd, check=False, capture_output=True, text=True, env=env, timeout=timeout)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("effect-corpus")
    build_corpus(
        BuildInputs(template=ROOT / "templates" / "prompts" / "four_section.j2", out=out, trace=SAMPLE),
        CorpusSettings(seed=0, embed_cache=False, device="cpu", block_tokens=16),
    )
    return out


def test_effect_run_replays_the_window_three_times_and_the_plan_warms_the_engine(
    corpus: Path, tmp_path: Path
) -> None:
    gates = tmp_path / "gates.yaml"
    gates.write_text(GATES)
    out = tmp_path / "effect"
    done = harness(
        "analysis", "effect", "--corpus", str(corpus), "--split", "0.5", "--serve-args", "--preset tiny",
        "--max-tokens-cap", "2", "--policy", "s3fifo-seeded", "--gate", str(gates), "-o", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    report = read_effect(out / "effect.json")
    records = list(read_corpus(corpus))
    assert report.history_requests + report.window_requests == len(records) == 40
    # Each pass sent every window request once, in the window's own time order.
    window = [json.loads(x)["id"] for x in (out / "window" / "corpus.jsonl").read_text().splitlines()]
    for name in ("cold", "planned", "oracle"):
        sent = [json.loads(x)["id"] for x in (out / name / "records.jsonl").read_text().splitlines()]
        assert sorted(sent) == sorted(window), name
    # The planned preload is prefix-only text of history requests, sent without a response-cache entry.
    pre = [json.loads(x) for x in (out / "planned" / "preload.jsonl").read_text().splitlines()]
    by_id = {r.id: r for r in records}
    assert pre and all(p["max_tokens"] == 1 for p in pre)
    for p in pre:
        source = by_id[p["id"].removeprefix("preload-")]
        assert (
            source.prompt is not None
            and source.prompt.startswith(p["prompt"])
            and p["prompt"] != source.prompt
        )
    whole = report.heads[-1]
    cold, planned, oracle = (whole.passes[n] for n in ("cold", "planned", "oracle"))
    assert cold.errors == planned.errors == oracle.errors == 0
    # The engine holds what was preloaded: more of the window's shared blocks hit than from cold, and
    # the oracle (the window's own blocks) hits at least as many as the plan.
    assert planned.block_hit_rate is not None and cold.block_hit_rate is not None
    assert planned.block_hit_rate > cold.block_hit_rate
    assert oracle.block_hit_rate is not None and oracle.block_hit_rate >= planned.block_hit_rate
    # The simulator saw the same preloads: its prediction orders the passes the same way.
    p = report.predicted_block_hit_rate
    assert p.policy == "s3fifo-seeded" and p.cold < p.planned <= p.oracle
    verdict = json.loads((out / "gate.json").read_text())
    assert verdict["verdict"] == "pass"
    # The report shows the effect (its plot and table) from effect.json alone.
    html = tmp_path / "report.html"
    done = harness("report", "--effect", str(out / "effect.json"), "-o", str(html))
    assert done.returncode == 0, done.stderr
    page = html.read_text()
    assert 'id="effect"' in page and 'id="fig-effect"' in page and "data:image/png;base64" in page
    assert "Warmup effect" in html.with_suffix(".md").read_text()


def test_bad_effect_inputs_fail_before_any_server_starts(corpus: Path, tmp_path: Path) -> None:
    done = harness("analysis", "effect", "--corpus", str(corpus), "-o", str(tmp_path / "a"))
    assert done.returncode == 4 and "--split" in done.stderr
    done = harness("analysis", "effect", "--corpus", str(corpus), "--split", "0.5", "--predictor", "nope",
                   "-o", str(tmp_path / "b"))  # fmt: skip
    assert done.returncode == 4 and "nope" in done.stderr
    done = harness("analysis", "effect", "--corpus", str(corpus), "--split", "0.5", "--history-corpus",
                   str(corpus), "-o", str(tmp_path / "c"))  # fmt: skip
    assert done.returncode == 4 and "not both" in done.stderr
    assert not any((tmp_path / d / "server").exists() for d in "abc")
