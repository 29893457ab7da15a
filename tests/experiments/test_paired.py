"""``harness run``: the paired cold / warm run, its warm check, comparison and exit codes.

The slow tests run the real thing: ``harness serve --preset tiny`` subprocesses (with and without
the response cache), headless Locust children, the real probes. They wait on the processes and
their files (the ready file, ``records.jsonl`` growing), never on the clock.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import orjson
import pytest

from harness.common.auth import Credentials
from harness.common.errors import ExitCode
from harness.corpus.model import CorpusRecord
from harness.experiments.driver import check_serve_args
from harness.experiments.paired_record import exit_code_of
from harness.experiments.paired_spec import prepare
from harness.experiments.target import flush_all
from harness.experiments.warmcheck import LevelCheck, Rate, WarmCheck, check_warm
from harness.gates.compare import compare
from harness.gates.runs import load_result_set
from harness.load.arrivals import prepare_requests
from harness.load.inputs import Inputs
from harness.load.runner import LoadSpec
from harness.load.target import TargetClient
from tests.experiments.helpers import paired_spec
from tests.gates.factory import ROOT, make_run
from tests.load.sse_server import Behaviour, SSEServer
from tests.server.conftest import harness_server

WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo",
         "lima", "mike", "november", "oscar", "papa")  # fmt: skip


def write_corpus(path: Path, n: int, *, long: bool = True, chat: bool = True) -> Path:
    """``n`` distinct, greedy (cacheable) requests. ``long`` prompts span several 16-token KV blocks
    and differ from their first token, so one never hits another's prefix; short ones fit in one
    block, which no prefix cache can hit."""
    rows = []
    for i in range(n):
        text = f"{i} " + " ".join(WORDS[(i + k) % len(WORDS)] for k in range(48)) if long else f"q{i}"
        rec: dict[str, object] = {
            "id": f"r{i}", "tenant": "default", "scenario": f"s{i % 2}", "max_tokens": 6,
            "expected_output_tokens": 6, "lang": "en", "domain": "test", "intent": "test",
            "sampling": {"temperature": 0.0},
            "provenance": {"seed": 0, "candidate": i, "template": "t", "template_sha256": "0" * 64},
        }  # fmt: skip
        if chat:
            rec["messages"] = [{"role": "user", "content": text}]
        else:
            rec["prompt"] = text
        rows.append(CorpusRecord.model_validate(rec).model_dump(mode="json", exclude_none=True))
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path


SMALL_PLAN = """\
name: test
policy: {on_failure: stop, min_requests: 4}
stages:
  - {name: s1-2qps, qps: 2, duration_s: 2, max_failure_rate: 0.5}
  - {name: s2-4qps, qps: 4, duration_s: 2, max_failure_rate: 0.5}
"""
PASSING_BASELINE = """\
schema_version: 1
name: test-pass
gates:
  - {metric: error_rate, threshold: 0.0, abs_tolerance: 0.5, min_samples: 10}
  - {metric: hit_rate_any, threshold: 0.9, abs_tolerance: 0.5, min_samples: 10, phase: warm}
"""


KEY = "sk-paired-5b0c7e21"
ADMIN = "adm-paired-90d4f3"
KEYED = Credentials.of(api_key=KEY, admin_token=ADMIN)
"""The shared cached server is keyed (as a deployed one would be): the paired run must get in."""


def harness_run(
    *args: str, timeout: float = 400.0, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200", **(env or {})}
    cmd = [sys.executable, "-m", "harness.cli", "run", *args]
    return subprocess.run(cmd, check=False, capture_output=True, text=True, env=env, timeout=timeout)


def read(path: Path) -> dict:
    return json.loads(path.read_text())


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "records.jsonl").read_text().splitlines() if line]


# ------------------------------------------------------------------------- real runs (slow)


@pytest.fixture(scope="module")
def cached_server(tmp_path_factory):
    with harness_server(tmp_path_factory.mktemp("paired-serve"), "--cache", env=KEYED.server_env()) as srv:
        yield srv


@pytest.mark.slow
def test_paired_run_cold_then_warm_with_preload_ladder_and_gate(tmp_path, cached_server):
    # 20 distinct requests: the warm check needs 20 probes to call a target warm (power 0.95 against
    # a cache 60 % warm), and draws them from the warm phase's distinct requests.
    corpus = write_corpus(tmp_path / "corpus.jsonl", 20)
    plan = tmp_path / "plan.yaml"
    plan.write_text(SMALL_PLAN)
    baseline = tmp_path / "pass.yaml"
    baseline.write_text(PASSING_BASELINE)
    preload = tmp_path / "preload.jsonl"
    preload.write_text(
        "".join(
            json.dumps({"prompt": f"preloaded {i}", "max_tokens": 4, "temperature": 0, "completion": "ok"})
            + "\n"
            for i in range(3)
        )
    )
    out = tmp_path / "out"
    proc = harness_run(
        "--url", cached_server.url, "--corpus", str(corpus), "--rate", "4", "--duration", "5",
        "--max-tokens-cap", "6", "--start-delay", "0.5", "--plan", str(plan), "--preload", str(preload),
        "--probes", "20", "--gate", str(baseline), "--out", str(out),
        env={"OPENAI_API_KEY": KEY, "HARNESS_ADMIN_TOKEN": ADMIN},
    )  # fmt: skip
    # On a busy machine the load generator itself can be starved (client CPU > 90 %): such a phase is
    # client-bound, and a client-bound run is never passed, only "cannot be judged" (exit 6). Lateness
    # alone does not make it so (it widens latency gates; these two are rates).
    client_bound = any(read(out / ph / "summary.json")["client_bound"] for ph in ("cold", "warm"))
    want = 6 if client_bound else 0
    assert proc.returncode == want, proc.stdout + proc.stderr
    run = read(out / "run.json")
    assert run["exit_code"] == want and not run["interrupted"]
    assert [f["status"] for f in run["flush"]] == ["flushed", "flushed"] and run["skipped_levels"] == []
    assert run["preload"]["stored"] == 3
    assert set(run["phases"]) == {"cold", "ladder", "warm"}
    check = read(out / "warm-check.json")
    assert check["warm"] is True
    assert [(lv["level"], lv["status"]) for lv in check["levels"]] == [
        ("embedding", "warm"), ("kv", "warm"), ("response", "warm"),
    ]  # fmt: skip
    assert len(check["probes"]) == 40  # 20 past the response cache (kv), 20 through it
    assert all(
        p["cache"] == "BYPASS" and p["cached_tokens"] > 0 for p in check["probes"] if p["kind"] == "kv"
    )
    # Cold: every request's first sight is generated; warm: every request is a response-cache hit.
    cold, warm = records(out / "cold"), records(out / "warm")
    assert len(cold) == len(warm) == 20
    first_seen: dict[str, str] = {}
    for r in sorted(cold, key=lambda r: r["sent_s"]):
        first_seen.setdefault(r["id"], r["cache"])
    assert set(first_seen.values()) == {"MISS"}
    assert all(r["cache"].startswith("HIT") for r in warm)
    assert {r["stage"] for r in cold} == {"cold"} and {r["stage"] for r in warm} == {"warm"}
    assert [s["name"] for s in read(out / "ladder" / "summary.json")["stages"]] == ["s1-2qps", "s2-4qps"]
    rows = {r["metric"]: r for r in read(out / "comparison.json")["rows"]}
    assert rows["hit_rate_any"]["warm"]["value"] == 1.0 > rows["hit_rate_any"]["cold"]["value"]
    assert rows["hit_rate_any"]["difference"]["value"] > 0
    assert rows["prefill_kv_bytes_p95"]["warm"]["value"] == 0 < rows["prefill_kv_bytes_p95"]["cold"]["value"]
    verdict = read(out / "gate.json")
    assert verdict["verdict"] == ("unjudgeable" if client_bound else "pass")
    assert {g["label"] for g in verdict["gates"]} == {"cold", "warm"}
    cases = ET.parse(out / "gate.junit.xml").getroot().iter("testcase")
    assert {c.get("classname") for c in cases} == {"gate.cold", "gate.warm"}
    # Which credentials were used is recorded; their values are in no file and no output.
    assert run["load"]["access"]["api_key"] is True and run["load"]["access"]["admin_token"] is True
    for text in (proc.stdout, proc.stderr, *(p.read_text() for p in out.rglob("*") if p.is_file())):
        assert KEY not in text and ADMIN not in text


@pytest.mark.slow
def test_warm_check_refuses_a_flushed_cache_then_passes_once_warm(tmp_path, cached_server):
    # 20 probes: the fewest that catch a cache only 60 % warm with power 0.95 (fewer cannot call it warm).
    corpus = write_corpus(tmp_path / "corpus.jsonl", 20)
    reqs = prepare_requests(
        CorpusRecord.model_validate_json(line) for line in corpus.read_text().splitlines()
    )
    target = TargetClient(cached_server.url, KEYED)
    flushed = flush_all(target)
    assert [f.status for f in flushed] == ["flushed", "flushed"]
    cold = check_warm(target, reqs)
    assert not cold.warm
    assert [(lv.level, lv.status) for lv in cold.levels] == [
        ("embedding", "cold"), ("kv", "cold"), ("response", "cold"),
    ]  # fmt: skip
    assert cold.warm_rate.value == 0 and "cold" in cold.reason
    assert exit_code_of(cold, None)[0] == ExitCode.UNJUDGEABLE
    # The response probes just generated and stored every answer: now each level is warm.
    warm = check_warm(target, reqs)
    assert warm.warm, warm.reason
    assert [lv.status for lv in warm.levels] == ["warm", "warm", "warm"]
    assert warm.warm_rate.value == 1.0 and warm.warm_rate.n == len(reqs)


def test_warm_check_takes_the_servers_prefix_counter_where_cached_tokens_is_absent(tmp_path):
    # A vLLM-like target that reports no cached_tokens (no usage at all) but counts its prefix hits
    # on /metrics: each KV probe's hits are the counter's growth while it ran.
    corpus = write_corpus(tmp_path / "corpus.jsonl", 20)
    reqs = prepare_requests(
        CorpusRecord.model_validate_json(line) for line in corpus.read_text().splitlines()
    )
    with SSEServer(Behaviour(tokens=2, usage="none", metrics=True, x_cache=None)) as srv:
        target = TargetClient(srv.url)
        cold = check_warm(target, reqs)
        warm = check_warm(target, reqs)  # the cold check's probes filled the prefix cache
        few = check_warm(target, reqs[:4])
    kv = {c.level: c for c in cold.levels}["kv"]
    assert kv.status == "cold" and kv.evidence == "server_counter" and "server's own counter" in kv.detail
    assert not cold.warm and cold.kv_evidence == "server_counter"
    assert [p.server_hit_tokens for p in cold.probes if p.kind == "kv"] == [0.0] * 20
    assert all(p.cached_tokens is None for p in cold.probes)
    assert warm.warm and warm.warm_rate.value == 1.0 and warm.warm_rate.n == 20, warm.reason
    assert "KV evidence: the server's prefix-hit counter" in warm.reason
    assert [p.server_hit_tokens for p in warm.probes if p.kind == "kv"] == [5.0] * 20
    # Four probes, all warm, cannot call the target warm: they could not have caught a 60 % cache.
    assert not few.warm and few.warm_rate.value == 1.0 and "cannot tell" in few.reason
    assert "too few to catch a warm rate of 59.80 %" in few.reason and "20 would reach" in few.reason
    with SSEServer(Behaviour(tokens=2, usage="none", x_cache=None)) as srv:  # neither signal: cannot tell
        neither = check_warm(TargetClient(srv.url), reqs)
    assert not neither.warm and neither.kv_evidence is None and "cannot tell" in neither.reason


@pytest.mark.slow
def test_paired_run_against_a_url_without_cache_says_not_warm_and_writes_everything(tmp_path):
    # Short prompts fit in one KV block, which no prefix cache can hit, and without --cache there is
    # no response cache: nothing can be warm, and the run says so with exit 6.
    corpus = write_corpus(tmp_path / "corpus.jsonl", 4, long=False, chat=False)
    out = tmp_path / "out"
    with harness_server(tmp_path / "plain") as plain:
        proc = harness_run(
            "--url", plain.url, "--corpus", str(corpus), "--rate", "4", "--duration", "2",
            "--max-tokens-cap", "4", "--start-delay", "0.5", "--out", str(out),
        )  # fmt: skip
    assert proc.returncode == int(ExitCode.UNJUDGEABLE), proc.stdout + proc.stderr
    assert "cannot be called warm" in proc.stderr
    run = read(out / "run.json")
    assert run["exit_code"] == 6 and run["target"]["started"] is False
    assert run["skipped_levels"] == ["response"]  # /cache/flush answered 404; the KV reset worked
    check = read(out / "warm-check.json")
    assert not check["warm"]
    assert {lv["level"]: lv["status"] for lv in check["levels"]} == {
        "embedding": "skipped", "kv": "cold", "response": "skipped",
    }  # fmt: skip
    for phase in ("cold", "warm"):
        summary = read(out / phase / "summary.json")
        assert summary["requests"] == 8
        # The target's own counters, scraped through each phase: they moved by what the phase sent.
        assert (out / phase / "server_metrics.jsonl").is_file()
        (counted,) = summary["server_metrics"]["phases"]
        records = [json.loads(line) for line in (out / phase / "records.jsonl").read_text().splitlines()]
        assert counted["name"] == phase and counted["prefix_hits"] == 0  # one-block prompts never hit
        assert counted["prefix_queries"] == sum(r["prompt_tokens"] for r in records) > 0
    assert (out / "comparison.json").is_file()


@pytest.mark.slow
@pytest.mark.usefixtures("sigint_heard")
def test_ctrl_c_stops_the_server_and_leaves_finalized_results(tmp_path):
    corpus = write_corpus(tmp_path / "corpus.jsonl", 4)
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "harness.cli", "run", "--serve-args", "--preset tiny --cache",
           "--corpus", str(corpus), "--rate", "2", "--duration", "600", "--max-tokens-cap", "4",
           "--start-delay", "0.5", "--out", "out"]  # fmt: skip
    log = tmp_path / "run.log"
    with log.open("wb") as fh:  # a relative --out, as users type it (the server runs elsewhere)
        proc = subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        records_file = out / "cold" / "records.jsonl"
        # Wait (on the process, with a generous deadline) until the cold phase has recorded requests.
        for _ in range(3000):
            if records_file.is_file() and records_file.stat().st_size > 0:
                break
            assert proc.poll() is None, log.read_text()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(0.1)
        else:
            pytest.fail("the cold phase never recorded a request")
        server_pid = read(out / "server" / "ready.json")["pid"]
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == int(ExitCode.INTERRUPTED), log.read_text()
    run = read(out / "run.json")
    assert run["interrupted"] is True and run["exit_code"] == 130
    assert run["phases"]["cold"]["exit_code"] == 130 and run["phases"]["cold"]["interrupted"] is True
    summary = read(out / "cold" / "summary.json")
    assert summary["interrupted"] is True and summary["requests"] == len(records(out / "cold")) > 0
    with pytest.raises(ProcessLookupError):
        os.kill(server_pid, 0)  # the server was stopped (and reaped) before harness run exited


# ------------------------------------------------------------------------- fail fast (fast)


def run_main(*args: str) -> int:
    from harness.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["run", *args])
    return int(exc.value.code or 0)


@pytest.fixture
def inputs(tmp_path):
    corpus = write_corpus(tmp_path / "corpus.jsonl", 3)
    return tmp_path, corpus


R = ["--rate", "2", "--duration", "2"]


@pytest.mark.parametrize(
    ("extra", "files", "code", "message"),
    [
        (["--rate", "2"], {}, 4, "--rate needs --duration"),
        ([*R, "--plan", "{plan}"], {"plan": "stages:\n  - {name: a, qps: 0}\n"}, 3, "stages.0"),
        ([*R, "--preload", "{preload}"], {"preload": '{"prompt": "x"}\n{"promt": "y"}\n'}, 3, ":2"),
        ([*R, "--gate", "{gate}"], {"gate": "schema_version: 1\ngates: [{metric: nope}]\n"}, 4, "gate"),
        ([*R, "--serve-args", "--preset tiny --bogus"], {}, 4, "--bogus"),
        ([*R, "--serve-args", "--preset tiny", "--url", "http://127.0.0.1:9"], {}, 4, "not both"),
        ([*R, "--api", "soap"], {}, 4, "--api"),
        (["--schedule", "{schedule}"], {"schedule": "not json\n"}, 3, "schedule"),
    ],
)
def test_bad_input_fails_before_any_server_starts(  # noqa: PLR0917 - parametrized
    inputs, capsys, extra, files, code, message
):
    tmp_path, corpus = inputs
    paths = {}
    for name, text in files.items():
        paths[name] = tmp_path / f"{name}.txt"
        paths[name].write_text(text)
    args = [a.format(**{k: str(v) for k, v in paths.items()}) for a in extra]
    out = tmp_path / "out"
    assert run_main("--corpus", str(corpus), "--out", str(out), *args) == code
    assert message in capsys.readouterr().err
    assert not (out / "server").exists() and not (out / "run.json").exists()


def test_missing_corpus_and_an_earlier_run_are_refused(inputs, capsys):
    tmp_path, corpus = inputs
    out = tmp_path / "out"
    assert (
        run_main(
            "--corpus", str(tmp_path / "nope.jsonl"), "--rate", "2", "--duration", "2", "--out", str(out)
        )
        == 3
    )
    (out / "cold").mkdir(parents=True)
    assert run_main("--corpus", str(corpus), "--rate", "2", "--duration", "2", "--out", str(out)) == 4
    assert "--force" in capsys.readouterr().err


# ------------------------------------------------------------------------- pieces


def test_serve_args_are_parsed_by_harness_serve_and_paths_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiers.json").write_text("{}")
    args = check_serve_args(["--preset", "tiny", "--tiers", "tiers.json", "--model=m"])
    assert args == ["--preset", "tiny", "--tiers", str(tmp_path / "tiers.json"), f"--model={tmp_path / 'm'}"]


def test_planned_requests_are_the_load_stages_own(tmp_path):
    """What harness run plans (its warm probes) is what the replay sends: the load stage's Inputs."""
    corpus = write_corpus(tmp_path / "c.jsonl", 3)
    spec = LoadSpec(host="", results_dir=tmp_path, corpus=corpus, rate=2, duration=4)
    assert Inputs.load(spec.options, ladder=False).planned() == [0, 1, 2, 0, 1, 2, 0, 1]
    sched = tmp_path / "s.jsonl"
    sched.write_text("".join(json.dumps({"offset_s": t, "scenario": "s1"}) + "\n" for t in (0, 1, 2)))
    spec = LoadSpec(host="", results_dir=tmp_path, corpus=corpus, schedule=sched)
    assert Inputs.load(spec.options, ladder=False).planned() == [1, 1, 1]  # scenario s1: record r1
    prep = prepare(paired_spec(tmp_path / "out", corpus=corpus, schedule=sched))
    assert prep.planned == [1, 1, 1]


def test_prepare_counts_the_schedule_and_the_ladder(tmp_path):
    corpus = write_corpus(tmp_path / "c.jsonl", 3)
    plan = tmp_path / "plan.yaml"
    plan.write_text(SMALL_PLAN)
    spec = paired_spec(tmp_path / "out", corpus=corpus, rate=3, duration=2, plan=plan)
    prep = prepare(spec)
    assert len(prep.planned) == 6 and prep.ladder_requests == 12
    assert prep.serve_args == ["--preset", "tiny", "--cache"] and set(prep.refs) == {"corpus", "plan"}


def _check(warm: bool) -> WarmCheck:
    rate = Rate(value=1.0 if warm else 0.5, lo=0.0, hi=1.0, n=10)
    level = LevelCheck(level="response", status="warm" if warm else "partial", detail="")
    return WarmCheck(warm=warm, reason="r", min_warm_rate=0.92, warm_rate=rate, levels=[level])


def test_exit_code_regression_outranks_not_warm_outranks_pass(tmp_path):
    from harness.gates import gate_runs

    cold, warm = make_run(tmp_path / "cold", 300, seed=1), make_run(tmp_path / "warm", 300, seed=2)
    strict = tmp_path / "strict.yaml"
    strict.write_text("schema_version: 1\ngates:\n  - {metric: ttft_p95, threshold: 1.0}\n")
    loose = tmp_path / "loose.yaml"
    loose.write_text("schema_version: 1\ngates:\n  - {metric: ttft_p95, threshold: 100000.0}\n")
    failing = gate_runs({"cold": cold, "warm": warm}, strict)
    passing = gate_runs({"cold": cold, "warm": warm}, loose)
    assert exit_code_of(_check(False), failing)[0] == ExitCode.CHECK_FAILED
    assert exit_code_of(_check(False), passing)[0] == ExitCode.UNJUDGEABLE
    assert exit_code_of(_check(True), passing)[0] == ExitCode.OK
    assert exit_code_of(_check(True), None)[0] == ExitCode.OK


def test_comparison_difference_intervals_cover_and_say_which_way(tmp_path):
    cold = load_result_set(make_run(tmp_path / "cold", 2000, seed=3, ttft_ms=200.0, hit_l1=0.1), "cold")
    warm = load_result_set(make_run(tmp_path / "warm", 2000, seed=4, ttft_ms=50.0, hit_l1=0.8), "warm")
    same = load_result_set(make_run(tmp_path / "same", 2000, seed=5, ttft_ms=200.0, hit_l1=0.1), "warm")
    rows = {r.metric: r for r in compare(cold, warm).rows}
    ttft = rows["ttft_p95"]
    assert ttft.verdict == "better" and ttft.difference.value is not None
    assert ttft.difference.lo <= ttft.difference.value <= ttft.difference.hi < 0
    assert math.isclose(ttft.difference.value, ttft.warm.value - ttft.cold.value)
    assert rows["hit_rate_any"].verdict == "better" and rows["hit_rate_any"].difference.lo > 0
    # The difference's interval is wider than either phase's: each side is taken at √0.95.
    assert ttft.difference.hi - ttft.difference.lo > (ttft.cold.hi - ttft.cold.lo)
    # Two runs of one distribution: no clear change on the latencies.
    unchanged = {r.metric: r for r in compare(cold, same).rows}
    assert unchanged["ttft_p95"].verdict == "no clear change"
    assert unchanged["ttft_p95"].difference.lo < 0 < unchanged["ttft_p95"].difference.hi


def test_harness_run_reads_its_corpus_once_and_validates_its_options_once(tmp_path, monkeypatch):
    """In ``harness run``'s own process the corpus is read once and handed on (the capacity share
    turned into a rate, the ladder, the warm check's probes), and the load options are validated once:
    the command validates the user's, each phase's variant is validated once when made, and launching
    a phase validates nothing. The phases' Locust processes read their own (not counted here)."""
    import harness.load.inputs as inputs_module
    from harness.experiments import paired, phase
    from harness.load.options import LoadOptions

    corpus = write_corpus(tmp_path / "corpus.jsonl", 4)
    plan = tmp_path / "plan.yaml"
    plan.write_text(SMALL_PLAN)
    reads: list[Path] = []
    read_corpus = inputs_module.read_corpus
    monkeypatch.setattr(inputs_module, "read_corpus", lambda path: reads.append(path) or read_corpus(path))
    validated: list[str] = []
    validate = LoadOptions.validated.__func__

    def key(raw):
        return repr(sorted((k, repr(v)) for k, v in raw.items() if v is not None and v != []))

    def counting(cls, raw):
        validated.append(key(raw))
        return validate(cls, raw)

    monkeypatch.setattr(LoadOptions, "validated", classmethod(counting))

    class FakeTarget:
        url, model, server, credentials, client = "http://127.0.0.1:9", "m", None, Credentials(), None

    @contextlib.contextmanager
    def fake_target(*_args, **_kw):
        yield FakeTarget()

    launched = []

    def fake_locust(load, timeout_s=None):
        launched.append(load)
        before = len(validated)
        load.command()
        assert len(validated) == before  # a launch validates nothing: the options are
        make_run(load.options.results_dir, 60, seed=len(launched))
        return 0

    monkeypatch.setattr(paired, "open_target", fake_target)
    monkeypatch.setattr(paired, "flush_all", lambda target: [])
    monkeypatch.setattr(paired, "check_warm", lambda *_a, **_kw: _check(True))
    monkeypatch.setattr(phase, "run_locust", fake_locust)  # every phase is launched there
    out = tmp_path / "out"
    code = run_main(
        "--url", FakeTarget.url, "--corpus", str(corpus), "--rate", "50%", "--capacity", "8",
        "--duration", "2", "--plan", str(plan), "--probes", "2", "--out", str(out),
    )  # fmt: skip
    assert code == 0
    assert reads == [corpus]
    assert validated.count(validated[0]) == 1  # the command line's options
    for spec in launched:  # each phase's, validated when it was made, not again to launch it
        assert validated.count(key({n: getattr(spec.options, n) for n in spec.options.model_fields_set})) == 1
    assert [spec.options.stage for spec in launched] == ["cold", "replay", "warm"]
    assert [spec.options.rate_rps() for spec in launched] == [4.0, None, 4.0]  # 50 % of 8 req/s
    assert read(out / "run.json")["load"]["args"][:4] == ["--corpus", str(corpus), "--rate", "50%"]


# ------------------------------------------------------------------------- errors are judged (fast)
# A target that answers errors is failed on its error rate however the run got there: the capacity
# search's and the warm check's errors are judged by the gate's error_rate limits before the next
# phase, and never reported as an unreachable target. The target is the test server of known
# capacity answering a share of its requests 500 (real HTTP for the calibration and the warm check);
# the Locust children are faked, the capacity probes with an exact number of failed requests.

ERROR_GATE = """\
schema_version: 1
name: errors
gates:
  - {metric: error_rate, threshold: 0.01, min_samples: 100, phase: cold, detect: 0.05}
  - {metric: error_rate, threshold: 0.01, min_samples: 100, phase: warm, detect: 0.05}
"""
LOOSE_ERROR_GATE = "schema_version: 1\ngates:\n  - {metric: error_rate, threshold: 0.3, phase: cold}\n"


def erroring_run(tmp_path, monkeypatch, *, share, probe_errors=0, gate=None, rate="50%", probes=4):
    """``harness run --recipe`` against a target that answers ``share`` of its requests 500; each
    capacity probe fails ``probe_errors`` of its 40 requests. Returns the exit code, ``OUT``, the phases
    launched and the requests the target answered 500."""
    import dataclasses

    from harness.experiments import paired, phase
    from harness.experiments.capacity import PROBE_STAGE
    from harness.experiments.target import Target
    from tests.experiments.capacity_server import Capacity, CapacityServer
    from tests.gates.factory import make_records, write_run

    corpus = write_corpus(tmp_path / "corpus.jsonl", 8)
    launched: list[str] = []

    def probe_locust(load, timeout_s=None):
        n = load.options.max_requests
        recs = make_records(n, seed=7)
        recs = [dataclasses.replace(r, status=500, error="HTTP 500") if i < probe_errors else r
                for i, r in enumerate(recs)]  # fmt: skip
        write_run(load.options.results_dir, recs)
        return 1 if probe_errors else 0

    def phase_locust(load, timeout_s=None):
        launched.append(load.options.stage or "ladder")
        make_run(load.options.results_dir, 60, seed=len(launched))
        return 0

    out = tmp_path / "out"
    with CapacityServer(Capacity(slots=8, hold_s=0.02, first_token_s=0.005, error_share=share)) as srv:

        @contextlib.contextmanager
        def the_target(*_args, **_kw):
            yield Target(TargetClient(srv.url))

        monkeypatch.setattr(paired, "open_target", the_target)
        monkeypatch.setattr(paired, "flush_all", lambda target: [])

        # One launcher for every phase (experiments/phase.py): a probe is an ordinary run directory.
        def any_locust(load, timeout_s=None):
            is_probe = load.options.stage == PROBE_STAGE
            return (probe_locust if is_probe else phase_locust)(load, timeout_s)

        monkeypatch.setattr(phase, "run_locust", any_locust)
        recipe = {
            "target": {"url": srv.url},
            "load": {"corpus": str(corpus), "rate": rate, "duration": 2},
            "warmup": {"probes": probes},
            # probe_seconds 0: a probe is 40 requests, whatever rate the calibration starts at.
            "capacity": {"slo": "ttft_from_intended_p50<=3x,error_rate<=0.1", "probe_requests": 40,
                         "probe_seconds": 0, "calibration_requests": 4, "flush": False},
        }  # fmt: skip
        if gate is not None:
            (tmp_path / "gate.yaml").write_text(gate)
            recipe["gate"] = {"baseline": str(tmp_path / "gate.yaml")}
        (tmp_path / "recipe.yaml").write_text(json.dumps(recipe))
        code = run_main("--recipe", str(tmp_path / "recipe.yaml"), "--out", str(out))
        errored = srv.errored
    return code, out, launched, errored


def test_capacity_errors_proving_the_gates_error_rate_fail_the_run_naming_it(tmp_path, monkeypatch):
    """Calibration: 2 of 4 answered 500; the lowest probe: 20 of 40 failed. 22 of 44 proves the gate's
    1 % exceeded (exact test): exit 1 before any phase, gate.json and JUnit written, not exit 5/6."""
    code, out, launched, errored = erroring_run(
        tmp_path, monkeypatch, share=0.5, probe_errors=20, gate=ERROR_GATE
    )
    assert errored == 2
    assert code == int(ExitCode.CHECK_FAILED)
    assert launched == []  # no phase was sent: the errors already decided
    run = read(out / "run.json")
    assert run["exit_code"] == 1 and "error_rate" in run["message"] and "22 errors of 44" in run["message"]
    assert "judged on the capacity search's requests" in run["message"]
    assert run["capacity"]["errors"]["errors"] == 22 and run["capacity"]["limited_by_errors"] is True
    assert run["gate"]["verdict"] == "fail" and "error_rate@capacity" in run["gate"]["headline"]
    verdict = read(out / "gate.json")
    assert verdict["verdict"] == "fail" and verdict["exit_code"] == 1
    # The two phase gates share one limit: judged once, on the capacity search's requests.
    assert [(g["metric"], g["label"], g["verdict"], g["n"]) for g in verdict["gates"]] == [
        ("error_rate", "capacity", "fail", 44)
    ]
    cases = list(ET.parse(out / "gate.junit.xml").getroot().iter("testcase"))
    assert len(cases) == 1 and cases[0].find("failure") is not None
    capacity_json = read(out / "capacity" / "capacity.json")
    assert capacity_json["calibration"]["errors"] == 2 and capacity_json["probes"][0]["errors"] == 20


@pytest.mark.parametrize("gate", [LOOSE_ERROR_GATE, None], ids=["unproven-gate", "no-gate"])
def test_errors_that_prove_nothing_are_named_not_called_unreachable(tmp_path, monkeypatch, gate):
    """4 of 40 failed at the lowest rate: the SLO's 10 % straddles, so no capacity; a gate at 30 % is
    not proven exceeded either. The run cannot be judged (6), and says it is the error rate."""
    code, out, launched, _ = erroring_run(tmp_path, monkeypatch, share=0.0, probe_errors=4, gate=gate)
    assert code == int(ExitCode.UNJUDGEABLE) and launched == []
    message = read(out / "run.json")["message"]
    assert "the target's errors leave no capacity to take a share of" in message
    assert "4 of 44 requests failed: error rate 9.09 % [" in message and "unreachable" not in message
    assert ("error_rate ≤ 30.00 % is not proven exceeded" in message) == (gate is not None)
    assert not (out / "gate.json").exists()


def test_warm_check_errors_proving_the_gates_error_rate_fail_before_the_warm_phase(tmp_path, monkeypatch):
    """4 distinct probes, each sent past the caches and through them: every other request answered
    500, 4 of 8. Proven above 1 %: exit 1 after the cold phase, the warm one never sent."""
    code, out, launched, errored = erroring_run(tmp_path, monkeypatch, share=0.5, gate=ERROR_GATE, rate="2")
    assert errored == 4 and code == int(ExitCode.CHECK_FAILED)
    assert launched == ["cold"]
    check = read(out / "warm-check.json")
    assert (check["errors"]["errors"], check["errors"]["requests"]) == (4, 8) and not check["warm"]
    assert "the target answered errors to probes: 4 of 8 requests failed" in check["reason"]
    run = read(out / "run.json")
    assert "error_rate@warm-check" in run["message"] and "4 errors of 8" in run["message"]
    assert [g["label"] for g in read(out / "gate.json")["gates"]] == ["warm-check"]


def test_warm_check_errors_without_a_gate_are_in_the_reason(tmp_path, monkeypatch):
    code, out, launched, _ = erroring_run(tmp_path, monkeypatch, share=0.5, rate="2")
    assert code == int(ExitCode.UNJUDGEABLE) and launched == ["cold", "warm"]
    message = read(out / "run.json")["message"]
    assert "cannot be called warm" in message and "4 of 8 requests failed: error rate 50.00 %" in message


def test_a_warm_check_whose_every_probe_failed_says_errors_not_cold(tmp_path):
    from tests.experiments.capacity_server import Capacity, CapacityServer

    corpus = write_corpus(tmp_path / "corpus.jsonl", 4)
    reqs = prepare_requests(
        CorpusRecord.model_validate_json(line) for line in corpus.read_text().splitlines()
    )
    with CapacityServer(Capacity(error_share=1.0)) as srv:
        check = check_warm(TargetClient(srv.url), reqs)
    assert not check.warm and check.errors is not None
    assert (check.errors.errors, check.errors.requests) == (8, 8)
    assert check.reason.startswith("cannot tell: every probe failed, the target answers errors: 8 of 8")
    assert "HTTP 500" in check.reason
