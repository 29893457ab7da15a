"""``harness analysis`` / ``harness deploy`` end to end: outputs parse; bad input: one line, an exit code."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from harness.cli import main
from harness.common.io import write_jsonl
from harness.load.plan import read_plan

from .conftest import corpus_record
from .test_anomaly import planted_scrapes, write_server_metrics
from .test_warmup import SAMPLE

PROV = {"seed": 0, "candidate": 0, "template": "t", "template_sha256": "0" * 64}


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


def test_hitrate_json_and_table(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(
        capsys,
        "analysis",
        "hitrate",
        "--trace",
        str(SAMPLE),
        "--unit",
        "blocks",
        "--cache-capacity",
        "50",
        "--cache-capacity",
        "5000",
        "--json",
    )
    assert rc == 0
    doc = json.loads(out)
    assert doc["unit"] == "blocks" and doc["requests"] == 40
    by = {(r["capacity"], r["policy"]): r["hit_rate"] for r in doc["results"]}
    assert by[(50, "min")] >= max(by[(50, "lru")], by[(50, "lfu")])
    assert by[(5000, "min")] == pytest.approx(doc["cold_ceiling"])
    rc, out, _ = run(capsys, "analysis", "hitrate", "--trace", str(SAMPLE), "--cache-capacity", "3")
    assert rc == 0 and "cold ceiling" in out


def test_plan_writes_its_files(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc, out, _ = run(
        capsys,
        "analysis",
        "plan",
        "--trace",
        str(SAMPLE),
        "--unit",
        "blocks",
        "--cache-capacity",
        "100",
        "--window-fraction",
        "0.5",
        "-o",
        str(tmp_path),
        "--json",
    )
    assert rc == 0
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan == json.loads(out)
    assert plan["expected_hit_rate"] <= plan["history_ceiling"] <= plan["ceiling"]
    assert plan["mode"] == "out_of_sample" and plan["window_requests"] == plan["history_requests"] == 20
    ladder = read_plan(tmp_path / "ladder.yaml")  # the load stage's plan model reads it
    assert ladder.stages and ladder.preload is None  # no corpus: no preload file
    assert not (tmp_path / "preload.jsonl").exists()


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["analysis", "hitrate", "--trace", "/nope.jsonl", "--cache-capacity", "1"], 3, "no such file"),
        (
            ["analysis", "hitrate", "--trace", str(SAMPLE), "--cache-capacity", "1", "--unit", "pages"],
            2,
            "pages",
        ),
        (["analysis", "hitrate", "--trace", str(SAMPLE), "--cache-capacity", "0"], 2, "--cache-capacity"),
        (
            ["analysis", "hitrate", "--trace", str(SAMPLE), "--cache-capacity", "1", "--policy", "arc"],
            4,
            "arc",
        ),
        (
            ["analysis", "plan", "--trace", str(SAMPLE), "--cache-capacity", "5", "--predictor", "psychic"],
            4,
            "psychic",
        ),
        (["analysis", "avalanche"], 2, "exactly one"),
        (
            ["analysis", "rto", "--expired-keys", "1", "--gen-s", "1", "--slots", "1", "--utilization", "1"],
            2,
            "utilization",
        ),
        (["analysis", "decay"], 2, "--points"),
        (["analysis", "tiers"], 2, "--corpus"),
        (["analysis", "plan", "--trace", str(SAMPLE), "--cache-capacity", "5", "--api", "grpc"], 2, "grpc"),
        (
            [
                "analysis",
                "plan",
                "--trace",
                str(SAMPLE),
                "--cache-capacity",
                "5",
                "--in-sample",
                "--eval",
                str(SAMPLE),
            ],
            2,
            "--eval",
        ),
        (
            ["analysis", "plan", "--trace", str(SAMPLE), "--cache-capacity", "5", "--window-fraction", "1"],
            2,
            "--window-fraction",
        ),
        (
            ["analysis", "decay-sweep", "--url", "http://127.0.0.1:9", "--corpus", "/nope.jsonl"],
            3,
            "no such file",
        ),
        (["analysis", "decay-sweep", "--url", "u", "--corpus", str(SAMPLE), "--cmr", "0,1"], 4, "at least 3"),
        (
            ["analysis", "decay-sweep", "--url", "u", "--corpus", str(SAMPLE), "--cmr", "0,1,2"],
            4,
            "--cmr': value 3: Input should be less than or equal to 1",
        ),
        (
            [
                "analysis",
                "decay-sweep",
                "--url",
                "u",
                "--corpus",
                str(SAMPLE),
                "--duration",
                "2",
                "--settle",
                "3",
            ],
            4,
            "settle time",
        ),
        (["deploy", "istio", "--service-host", "h", "--ab", "a=80,b=30"], 4, "add up to 100"),
        (["deploy", "istio"], 2, "host"),
    ],
)
def test_bad_input_is_one_line_and_an_exit_code(
    capsys: pytest.CaptureFixture[str], args: list[str], code: int, message: str
) -> None:
    rc, _, err = run(capsys, *args)
    assert rc == code, err
    assert message in err and "Traceback" not in err


def test_decay_sweep_against_no_server_is_unavailable(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    corpus = tmp_path / "corpus.jsonl"
    write_jsonl(corpus, [corpus_record("a", sampling={"temperature": 0.0}).model_dump(exclude_none=True)])
    args = ["analysis", "decay-sweep", "--url", "http://127.0.0.1:9", "--corpus", str(corpus)]
    # Without --model the target is asked for its model first.
    rc, _, err = run(capsys, *args, "-o", str(tmp_path / "ask"))
    assert rc == 5 and "cannot reach http://127.0.0.1:9/v1/models" in err and "Traceback" not in err
    rc, _, err = run(capsys, *args, "--model", "m", "-o", str(tmp_path / "out"))
    assert rc == 5 and "cannot reach http://127.0.0.1:9/cache/preload" in err
    # The preload it would have posted is the replay's request, left for inspection.
    line = json.loads((tmp_path / "out" / "preload.jsonl").read_text())
    assert line["messages"][-1]["content"] == "question a" and line["temperature"] == 0.0
    assert line["model"] == "m"


def test_decay_avalanche_rto(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    pts = tmp_path / "sweep.csv"
    cmr = np.linspace(0, 1, 6)
    pts.write_text("cmr,qps\n" + "".join(f"{c},{100 * np.exp(-1.5 * c * c)}\n" for c in cmr))
    rc, out, _ = run(
        capsys,
        "analysis",
        "decay",
        "--points",
        str(pts),
        "--plot",
        str(tmp_path / "d.png"),
        "-o",
        str(tmp_path / "fit.json"),
        "--json",
    )
    assert rc == 0 and json.loads(out)["k"] == pytest.approx(1.5, rel=1e-6)
    assert (tmp_path / "d.png").stat().st_size > 0 and json.loads((tmp_path / "fit.json").read_text())[
        "n"
    ] == 6
    classes = tmp_path / "classes.jsonl"
    write_jsonl(
        classes,
        [
            {"name": "hot", "keys": 100, "ttl_s": 3600, "write_span_s": 600},
            {"name": "cold", "keys": 5, "ttl_s": 60, "jitter_s": 120},
        ],
    )
    rc, out, _ = run(capsys, "analysis", "avalanche", "--classes", str(classes), "--json")
    assert rc == 0 and json.loads(out)["probability"] == pytest.approx(1 - 0.9 * 0.5)
    rc, out, _ = run(capsys, "analysis", "avalanche", "--classes", str(classes), "--target-p", "0.05")
    assert rc == 0 and "P = 1 − Π(1 − p_i) = 0.5500" in out
    cases = tmp_path / "cases.jsonl"
    write_jsonl(
        cases, [{"expired_keys": n, "gen_s": 1.0, "slots": 4, "rto_s": 3 + 2 * n / 4} for n in (40, 400)]
    )
    rc, out, _ = run(capsys, "analysis", "rto-calibrate", str(cases), "-o", str(tmp_path / "coef.json"))
    assert rc == 0 and json.loads(out)["c1"] == pytest.approx(2.0)
    rc, out, _ = run(
        capsys,
        "analysis",
        "rto",
        "--expired-keys",
        "100",
        "--gen-s",
        "1",
        "--slots",
        "4",
        "--coefficients",
        str(tmp_path / "coef.json"),
        "--json",
    )
    assert rc == 0 and json.loads(out)["rto_s"] == pytest.approx(3 + 2 * 25)


def test_anomaly_and_index(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    scrapes = write_server_metrics(tmp_path / "server_metrics.jsonl", planted_scrapes())
    rc, out, _ = run(
        capsys,
        "analysis",
        "anomaly",
        "--scrapes",
        str(scrapes),
        "--baseline",
        "0:50",
        "-o",
        str(tmp_path / "tree.json"),
        "--json",
    )
    assert rc == 0
    tree = json.loads(out)
    assert tree["root"]["children"][0]["children"][0]["name"] == "tier=l2"
    assert json.loads((tmp_path / "tree.json").read_text()) == tree
    rc, out, _ = run(capsys, "analysis", "anomaly", "--scrapes", str(scrapes))
    assert rc == 0 and "tier=l2" in out and "HitRate" in out
    rc, out, _ = run(capsys, "analysis", "anomaly", "--schema")
    assert rc == 0 and json.loads(out)["title"] == "AnomalyReport"
    x = np.random.default_rng(0).normal(size=(300, 32)).astype(np.float32)
    np.save(tmp_path / "v.npy", x)
    rc, out, _ = run(
        capsys,
        "analysis",
        "index",
        "--vectors",
        str(tmp_path / "v.npy"),
        "--sizes",
        "300",
        "--kinds",
        "flat,hnsw",
        "--repeats",
        "1",
        "-o",
        str(tmp_path / "idx"),
        "--json",
    )
    assert rc == 0 and [r["reconstruct_ok"] for r in json.loads(out)] == [True, True]


def test_deploy(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc, _, err = run(capsys, "deploy", "grafana", "-o", str(tmp_path / "dash.json"))
    assert rc == 0 and "panels" in err
    assert json.loads((tmp_path / "dash.json").read_text())["uid"] == "harness-cache"
    rc, out, _ = run(capsys, "deploy", "istio", "--service-host", "llm.svc", "--ab", "blue=70,green=30")
    assert rc == 0
    docs = list(yaml.safe_load_all(out))
    assert [d["kind"] for d in docs] == ["VirtualService", "DestinationRule"]
    assert [r["weight"] for r in docs[0]["spec"]["http"][1]["route"]] == [70, 30]
    values = tmp_path / "values.yaml"
    values.write_text("host: llm.prod\nnamespace: prod\nport: 9000\n")
    rc, _, _ = run(capsys, "deploy", "istio", "--values", str(values), "-o", str(tmp_path / "istio"))
    assert rc == 0
    vs = yaml.safe_load((tmp_path / "istio" / "virtualservice.yaml").read_text())
    assert vs["metadata"]["namespace"] == "prod"


def test_tiers_and_plan_with_corpus(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from harness.target.cache.policy import load_tier_file

    from .conftest import corpus_record, write_corpus

    queries = tmp_path / "q.jsonl"
    write_jsonl(
        queries,
        [
            {"query": "How do I reset my password?", "count": 70, "mean_entropy": 1.0},
            {"query": "Is the shop open on Sunday?", "count": 2},
        ],
    )
    rc, out, _ = run(
        capsys,
        "analysis",
        "tiers",
        "--queries",
        str(queries),
        "-o",
        str(tmp_path / "t.json"),
        "--ttl-hot",
        "7200",
        "--json",
    )
    assert rc == 0 and json.loads(out)["tiers"] == {"hot": 1, "warm": 0, "cold": 1}
    tf = load_tier_file(tmp_path / "t.json")
    assert tf.ttl_s.hot == 7200 and {e.tier for e in tf.entries} == {"hot", "cold"}
    corpus = write_corpus(
        tmp_path / "corpus.jsonl",
        [
            corpus_record(
                f"c{i}",
                provenance={
                    "seed": 0,
                    "candidate": i,
                    "template": "t",
                    "template_sha256": "0" * 64,
                    "source_line": i + 1,
                },
            )
            for i in range(40)
        ],
    )
    rc, _, _ = run(
        capsys,
        "analysis",
        "plan",
        "--trace",
        str(SAMPLE),
        "--unit",
        "blocks",
        "--cache-capacity",
        "100",
        "--corpus",
        str(corpus),
        "-o",
        str(tmp_path / "plan"),
    )
    assert rc == 0
    plan = json.loads((tmp_path / "plan" / "plan.json").read_text())
    lines = [json.loads(x) for x in (tmp_path / "plan" / "preload.jsonl").read_text().splitlines()]
    assert len(lines) == plan["preload_lines_written"] == plan["preload_requests"] > 0
    ladder = read_plan(tmp_path / "plan" / "ladder.yaml")
    assert ladder.preload == "preload.jsonl" and ladder.policy.on_failure == "retry"
