"""The analyses driving real load runs against ``harness serve --preset tiny --cache`` (CPU).

* the warmup plan's ``ladder.yaml`` and ``preload.jsonl`` are what ``locustfiles/warmup.py`` and
  ``harness cache preload`` accept, and the preloaded requests hit;
* the hot-zone tiers read the mean entropy the load stage recorded from a real replay;
* a short live QPS-decay sweep measures miss rates that follow the requested bypass fractions.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.analysis.decay import read_points
from harness.analysis.decay_sweep import DecaySweep, SweepOptions, SweepPlan, run_sweep
from harness.analysis.tiers import queries_from_corpus
from harness.experiments.recipe import Recipe
from harness.load.plan import plan_preload, read_plan
from harness.load.results import read_records
from harness.load.run_summary import read_summary
from harness.load.runner import LoadSpec, run_locust
from harness.target.server.launch import ServerProcess, running_server

from .conftest import corpus_record, record, write_corpus, write_run
from .test_cli import run

pytestmark = pytest.mark.slow
GREEDY = {"temperature": 0.0}
"""Sampled requests (temperature > 0 without a seed) bypass the server's cache by default."""
TIMEOUT_S = 300


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log_dir = tmp_path_factory.mktemp("server")
    with running_server(["--preset", "tiny", "--cache"], log_dir=log_dir) as srv:
        yield srv


def test_plan_outputs_drive_the_warmup_ladder_and_the_cache_cli(
    server: ServerProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = write_corpus(
        tmp_path / "corpus.jsonl", [corpus_record(f"plan{i}", sampling=GREEDY) for i in range(6)]
    )
    # History: a load run that replayed the corpus at 2 requests/s, plan0 and plan1 most often.
    ids = ["plan0", "plan1", "plan0", "plan2", "plan1", "plan0", "plan3", "plan4", "plan5", "plan1"]
    history = write_run(
        tmp_path / "history", [record(i, id=rid, sent_s=i * 0.5) for i, rid in enumerate(ids)]
    )
    out = tmp_path / "plan"
    rc, _, err = run(capsys, "analysis", "plan", "--trace", str(history), "--cache-capacity", "3", "--corpus",
                     str(corpus), "--predictor", "frequency", "--stage-s", "2", "--max-tokens-cap", "8",
                     "-o", str(out))  # fmt: skip
    assert rc == 0, err
    plan = read_plan(out / "ladder.yaml")  # what locustfiles/warmup.py reads
    preload = plan_preload(plan, out / "ladder.yaml")
    assert preload == out / "preload.jsonl"
    lines = [json.loads(x) for x in preload.read_text().splitlines()]
    preloaded = {line["messages"][-1]["content"].split()[-1] for line in lines}
    assert preloaded == {"plan0", "plan1", "plan2"} and all(line["max_tokens"] == 8 for line in lines)
    # The ladder posts the plan's preload itself (no --preload), then climbs the stages.
    spec = LoadSpec(host=server.url, corpus=corpus, locustfile="warmup", plan=out / "ladder.yaml",
                    results_dir=tmp_path / "ladder", max_tokens_cap=8, start_delay=0.5)  # fmt: skip
    assert run_locust(spec, timeout_s=TIMEOUT_S) == 0, (tmp_path / "ladder" / "locust.log").read_text()[
        -2000:
    ]
    s = read_summary(tmp_path / "ladder")
    assert s.preload == {"lines": 3, "stored": 3, "generated": 3, "failed": 0}
    assert [o.verdict for o in s.stages] == ["passed"] * 5
    assert s.token_counting == {"usage": s.requests}
    first: dict[str, str | None] = {}
    for r in sorted(read_records(tmp_path / "ladder"), key=lambda r: r.sent_s):
        first.setdefault(r.id, r.cache)
    for rid in preloaded & set(first):
        assert first[rid] is not None and first[rid].startswith("HIT"), (rid, first)  # type: ignore[union-attr]
    # `harness cache preload` accepts the same file.
    rc, stdout, err = run(capsys, "cache", "preload", str(preload), "--url", server.url)
    assert rc == 0, err
    answer = json.loads(stdout)
    assert answer["lines"] == answer["stored"] == 3 and answer["failed"] == 0


def test_tiers_read_the_entropy_recorded_from_a_real_replay(
    server: ServerProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = write_corpus(
        tmp_path / "corpus.jsonl", [corpus_record(f"tier{i}", sampling=GREEDY) for i in range(4)]
    )
    spec = LoadSpec(host=server.url, corpus=corpus, rate=4, duration=2, results_dir=tmp_path / "run",
                    max_tokens_cap=8, start_delay=0.5, bypass_fraction=1.0)  # fmt: skip
    assert run_locust(spec, timeout_s=TIMEOUT_S) == 0
    recs = list(read_records(tmp_path / "run"))
    assert len(recs) == 8 and all(r.bypass and r.cache == "BYPASS" for r in recs)
    assert all(r.mean_entropy is not None and r.mean_entropy > 0 for r in recs)
    qs = {q.ids[0]: q for q in queries_from_corpus(corpus, [tmp_path / "run"])}
    assert set(qs) == {f"tier{i}" for i in range(4)}
    for rid, q in qs.items():
        mine = [r.mean_entropy for r in recs if r.id == rid and r.mean_entropy is not None]
        assert q.count == len(mine) == 2 and q.entropy_source == "records"
        assert q.entropy == pytest.approx(sum(mine) / len(mine))
    tiers = ["analysis", "tiers", "--corpus", str(corpus), "--run", str(tmp_path / "run")]
    rc, stdout, err = run(capsys, *tiers, "-o", str(tmp_path / "tiers.json"), "--json")
    assert rc == 0, err
    assert json.loads(stdout)["entropy_known"] == 1.0


def test_a_short_live_sweep_measures_the_requested_miss_rates(server: ServerProcess, tmp_path: Path) -> None:
    corpus = write_corpus(
        tmp_path / "corpus.jsonl", [corpus_record(f"sweep{i}", sampling=GREEDY) for i in range(6)]
    )
    fractions = [0.0, 0.5, 1.0]
    recipe = Recipe.model_validate({
        "target": {"url": server.url},
        "load": {"corpus": corpus, "duration": 4.0, "concurrency": 8, "max_tokens_cap": 8,
                 "start_delay": 1.0},
    })  # fmt: skip
    out = tmp_path / "sweep"
    run_sweep(SweepPlan.of(recipe, SweepOptions(fractions=fractions, settle_s=1.0)), out)
    sweep = DecaySweep.model_validate_json((out / "fit.json").read_bytes())
    assert sweep.preload is not None and sweep.preload["failed"] == 0 and sweep.preload["stored"] == 6
    assert [s.bypass_fraction for s in sweep.stages] == fractions
    for st in sweep.stages:
        # How many fit in a window is the machine's speed (a busy one sends a handful at cmr 1);
        # the tolerances below widen with fewer requests.
        assert st.sent > 0 and st.completed > 0 and st.errors == 0, st
        assert st.saturated, st  # the pool stayed busy: the QPS is the capacity at 8 in flight
        assert st.bypass_share is not None and abs(st.bypass_share - st.bypass_fraction) <= 2.5 / st.sent
        # Measured, not assumed: the cache's own answers give the requested share.
        assert st.cmr is not None and abs(st.cmr - st.bypass_fraction) <= 0.05 + 2.5 / st.sent, st
        assert st.unbypassed_misses == 0
    fit = sweep.fit
    assert fit is not None and fit.n == 3 and len(fit.residuals) == 3 and math.isfinite(fit.k)
    assert [p.bypass_fraction for p in fit.points] == fractions
    assert [p.cmr for p in read_points(out / "points.jsonl")] == [s.cmr for s in sweep.stages]
    assert (out / "decay.png").stat().st_size > 0
    zero, _, one = sweep.stages
    assert zero.qps > one.qps  # a cache hit is cheaper than a generation
