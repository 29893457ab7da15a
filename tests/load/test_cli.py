"""``harness load summarize``: the table comes from the records, with the one percentile definition."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.cli import main
from harness.load.results import RecordWriter, RequestRecord
from harness.load.run_summary import TargetInfo, read_summary, summarize, write_summary
from harness.load.summary import offered_rate


def rows(n: int) -> list[RequestRecord]:
    return [
        RequestRecord.parse({
            "id": f"r{i}", "stage": "replay", "intended_s": i * 0.1, "sent_s": i * 0.1, "lateness_ms": 0.1,
            "ttft_ms": float(i + 1), "itl_ms": [1.0, 2.0], "e2e_ms": 10.0 + i, "status": 200,
            "cache": "HIT-L1", "completion_tokens": 3, "token_counting": "usage",
        })
        for i in range(n)
    ]  # fmt: skip


def test_summarize_prints_the_table_and_rewrites_the_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    w = RecordWriter(tmp_path / "records.jsonl")
    w.write_many(rows(100))
    w.close()
    with pytest.raises(SystemExit) as ex:
        main(["load", "summarize", str(tmp_path), "--write"])
    assert ex.value.code == 0
    out = capsys.readouterr().out
    assert "ttft_ms" in out and "requests 100, errors 0" in out
    s = read_summary(tmp_path)
    assert s.metrics["ttft_ms"].p95 == 95.0  # nearest rank of 1..100
    assert s.hit_rate["HIT-L1"] == 1.0 and s.token_counting == {"usage": 100}
    # An existing summary keeps its metadata; metrics are recomputed from the records.
    old = summarize([], started_at="2026-01-01T00:00:00Z", duration_s=9.0, target=TargetInfo(url="http://t"))
    write_summary(tmp_path, old)
    with pytest.raises(SystemExit):
        main(["load", "summarize", str(tmp_path), "--write", "--json"])
    s = read_summary(tmp_path)
    assert s.target.url == "http://t" and s.requests == 100 and s.duration_s == 9.0


def test_summarize_shows_thinking_answers_and_tool_calls_only_when_a_run_has_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plain = tmp_path / "plain"
    w = RecordWriter(plain / "records.jsonl")
    w.write_many(rows(10))
    w.close()
    with pytest.raises(SystemExit):
        main(["load", "summarize", str(plain)])
    out = capsys.readouterr().out
    assert "ttfa_ms" in out and "itl_reasoning_ms" not in out and "tool calls" not in out
    agent = tmp_path / "agent"
    recs = rows(10)
    for i, r in enumerate(recs):
        r.ttfa_ms, r.itl_reasoning = 400.0, [(0, 1)]  # the first gap was thinking, the second the answer's
        r.reasoning_tokens, r.reasoning_source = 2, "counted"
        r.tool_calls, r.tool_names = (1, ["search"]) if i % 2 else (0, [])
        r.unread_fields = ["audio"] if i == 0 else []
    w = RecordWriter(agent / "records.jsonl")
    w.write_many(recs)
    w.close()
    with pytest.raises(SystemExit):
        main(["load", "summarize", str(agent), "--write"])
    out = capsys.readouterr().out
    assert "itl_reasoning_ms" in out and "reasoning_tokens" in out
    assert "tool calls: 5 in 5 responses (search 5)" in out and "unread stream fields: 1 of 10" in out
    s = read_summary(agent)
    assert s.metrics["itl_reasoning_ms"].max == 1.0 and s.metrics["itl_answer_ms"].max == 2.0
    assert s.metrics["ttfa_ms"].p50 == 400.0 and s.reasoning_counting == {"counted": 10}


def test_a_session_run_says_its_rate_started_sessions_and_a_plain_one_compares_requests(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--rate`` starts sessions in a session corpus: the requests a second it achieved are not
    measured against it as if it offered requests."""
    for name, session in (("plain", False), ("sessions", True)):
        recs = rows(10)
        for i, r in enumerate(recs):
            r.session_id = f"s{i // 2}" if session else None
        w = RecordWriter(tmp_path / name / "records.jsonl")
        w.write_many(recs)
        w.close()
        summary = summarize([], started_at="2026-01-01T00:00:00Z", duration_s=1.0,
                            target=TargetInfo(url="http://t"), target_rate=5.0)  # fmt: skip
        write_summary(tmp_path / name, summary)
        with pytest.raises(SystemExit):
            main(["load", "summarize", str(tmp_path / name)])
        out = " ".join(capsys.readouterr().out.split())
        if session:
            assert "rate 10.00/s, sessions offered at 5.00/s" in out, out
        else:
            assert "rate 10.00/s of 5.00/s" in out, out


def test_a_schedule_offers_sessions_not_their_calls() -> None:
    recs = rows(10)  # intended every 0.1 s: 10 requests over 0.9 s
    assert offered_rate(recs, sessions=False) == pytest.approx(10.0)
    for i, r in enumerate(recs):
        r.session_id = f"s{i // 2}"  # five sessions of two calls, starting 0.2 s apart
    assert offered_rate(recs, sessions=True) == pytest.approx(5.0)
    assert offered_rate(recs[:1], sessions=True) is None


def test_summarize_a_missing_directory_is_an_input_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as ex:
        main(["load", "summarize", str(tmp_path / "nope")])
    assert ex.value.code == 3


# ---- the load options on the harness's commands: declared once (harness.load.options) ------------


def test_commands_that_launch_load_take_the_load_options_from_one_table(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from harness.load.options import LoadOptions

    monkeypatch.setenv("COLUMNS", "250")
    shared = ("max_tokens_cap", "api", "model", "token_counting", "tokenizer")
    for command in (["run"], ["capacity"], ["ab"], ["load", "replay"], ["load", "ladder"]):
        with pytest.raises(SystemExit):
            main([*command, "--help"])
        shown = capsys.readouterr().out
        for name in (*shared, "corpus", "processes", "api_key", "header", "insecure"):
            assert f"--{name.replace('_', '-')}" in shown, (command, name)
        for name in shared:  # the same words on every command (the field's, as Locust shows them)
            assert (LoadOptions.model_fields[name].description or "?").split(" (")[0] in shown, (
                command,
                name,
            )
    for command in (["analysis", "plan"], ["analysis", "decay-sweep"]):  # the same flags
        with pytest.raises(SystemExit):
            main([*command, "--help"])
        shown = capsys.readouterr().out
        assert all(f"--{flag}" in shown for flag in ("max-tokens-cap", "api", "model")), command


def test_a_generated_command_gets_only_the_options_given() -> None:
    import typer
    from typer.testing import CliRunner

    from harness.load.options import typer_options

    got: list[dict[str, object]] = []
    app = typer.Typer()

    @app.command()
    @typer_options(
        "concurrency", "seed", "until_precision", "header", "insecure", "corpus", required={"corpus"}
    )
    def cmd(name: str, *, load: dict[str, object]) -> None:
        got.append({"name": name, **load})

    runner = CliRunner()
    assert runner.invoke(app, ["x", "--corpus", "c"]).exit_code == 0
    assert got.pop() == {"name": "x", "corpus": Path("c")}  # unset options are left out
    args = ["y", "--corpus", "c", "--seed", "1", "--concurrency", "8", "--until-precision", "10%"]
    assert runner.invoke(app, [*args, "--header", "A:1", "--insecure"]).exit_code == 0
    assert got.pop() == {
        "name": "y", "corpus": Path("c"), "seed": 1, "concurrency": 8, "until_precision": "10%",
        "header": ["A:1"], "insecure": True,
    }  # fmt: skip
    # An option given, even at its default, is given: the launcher's own default does not replace it.
    assert runner.invoke(app, ["w", "--corpus", "c", "--seed", "0", "--concurrency", "64"]).exit_code == 0
    assert got.pop() == {"name": "w", "corpus": Path("c"), "seed": 0, "concurrency": 64}
    assert runner.invoke(app, ["z"]).exit_code == 2  # --corpus is required
    # An old spelling still works, with a warning naming the new one; both at once is an error.
    old = runner.invoke(app, ["v", "--corpus", "c", "-H", "A:1"])
    assert old.exit_code == 0 and got.pop()["header"] == ["A:1"]
    assert old.output.count("harness: warning: -H is deprecated; use --header") == 1
    assert runner.invoke(app, ["u", "--corpus", "c", "-H", "A:1", "--header", "B:2"]).exit_code == 2


def test_replay_refuses_a_bad_option_before_launching(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as ex:
        main(["load", "replay", "--url", "http://127.0.0.1:9", "--corpus", "c", "--out",
              str(tmp_path / "r"), "--rate", "2", "--duration", "1", "--arrival", "sometimes"])  # fmt: skip
    assert ex.value.code == 4  # a bad option (docs/exit-codes.md), named
    assert "--arrival" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()  # nothing launched


def test_replay_shows_the_error_that_stopped_locust_before_any_load(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.load.test_session_inputs import _corpus, _turn

    corpus = _corpus(tmp_path / "c.jsonl", [_turn("a", 1), _turn("a", 2)])  # chat bodies
    with pytest.raises(SystemExit) as ex:
        main(["load", "replay", "--host", "http://127.0.0.1:9", "--corpus", str(corpus), "--results-dir",
              str(tmp_path / "r"), "--rate", "2", "--max-requests", "1", "--api", "completions"])  # fmt: skip
    assert ex.value.code == 4  # found by Locust's init, before any request
    err = capsys.readouterr().err
    assert "record 'a-t1' holds its history in 'messages'" in err and "--api completions" in err
    # The old spellings (--host, --results-dir) still work, each with a warning naming the new one.
    assert "harness: warning: --host is deprecated; use --url" in err
    assert "harness: warning: --results-dir is deprecated; use --out" in err


def test_summarize_shows_agent_sessions_only_when_a_run_has_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def call(k: int, ready: float, e2e: float | None, **kw: object) -> RequestRecord:
        return RequestRecord.parse({
            "id": f"a-{k}", "stage": "replay", "intended_s": ready, "sent_s": ready, "lateness_ms": 0.0,
            "status": 200, "e2e_ms": e2e, "session_id": "a", "call": k, "depth": k - 1, "ready_s": ready,
            "recorded_ms": 100.0, **kw,
        })  # fmt: skip

    w = RecordWriter(tmp_path / "records.jsonl")
    w.write_many([call(1, 0.0, 200.0), call(2, 0.2, 300.0)])  # a chain: 500 ms where the trace took 200
    w.close()
    with pytest.raises(SystemExit):
        main(["load", "summarize", str(tmp_path)])
    out = " ".join(capsys.readouterr().out.split())
    assert "agent sessions: 1 of 1 succeeded (2 calls, 0 blocked" in out
    assert "makespan p50 500 ms" in out and "critical chain 2.50× the trace's (p50)" in out
    plain = tmp_path / "plain"
    w = RecordWriter(plain / "records.jsonl")
    w.write_many(rows(5))
    w.close()
    with pytest.raises(SystemExit):
        main(["load", "summarize", str(plain)])
    assert "agent sessions" not in capsys.readouterr().out
