"""The command-line conventions of docs/cli.md, held for every command: every output path is
``--out/-o``, ``--json`` is always a switch, every option has help, every command's help ends with an
example that parses; and every renamed option still works under its old spelling, hidden from the help,
with one warning naming the new one."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.cli import main
from tests.docs.snippets import ROOT, check_harness, harness_root, shell_commands

MOONCAKE = ROOT / "fixtures" / "traces" / "mooncake_synthetic_head20.jsonl"
GENAI = ROOT / "fixtures" / "traces" / "genaiTestTrace.json"
DEAD_URL = "http://127.0.0.1:9"


def commands() -> Iterator[tuple[str, Any]]:
    def walk(node: Any, path: list[str]) -> Iterator[tuple[str, Any]]:
        if hasattr(node, "commands"):
            for name, sub in node.commands.items():
                yield from walk(sub, [*path, name])
        else:
            yield " ".join(path), node

    yield from walk(harness_root(), ["harness"])


COMMANDS = dict(commands())


def test_the_command_tree_is_the_documented_size() -> None:
    assert len(COMMANDS) >= 40  # a command lost from the tree would drop out of every check below


@pytest.mark.parametrize("path", sorted(COMMANDS))
def test_every_command_shows_one_example_that_parses(path: str) -> None:
    command = COMMANDS[path]
    epilog = command.epilog or ""
    assert epilog.startswith("Example: harness "), f"{path}: no `epilog='Example: …'`"
    ((_, words),) = list(shell_commands([epilog.removeprefix("Example: ")]))
    shown, problems = check_harness(words)
    assert shown == path, f"{path}'s example runs {shown}"
    assert not problems, problems


@pytest.mark.parametrize("path", sorted(COMMANDS))
def test_every_option_has_help_and_follows_the_conventions(path: str) -> None:
    for p in COMMANDS[path].params:
        if p.param_type_name != "option" or p.hidden:
            continue
        names = [*p.opts, *p.secondary_opts]
        assert p.help, f"{path} {names[0]}: no help"
        if "--json" in names:
            assert p.is_flag, f"{path}: --json must be a switch that prints JSON (a file is --json-out)"
        if "--out" in names:
            assert "-o" in names, f"{path}: --out without -o"
        assert "--output" not in names and "--results-dir" not in names, f"{path}: output is --out/-o"
        assert "-H" not in names, f"{path}: -H is Locust's --host; --header has no short form"
        if "--host" in names:
            pytest.fail(f"{path}: --host is Locust's target option; a target is --url, an address --bind")


@pytest.mark.parametrize("path", sorted(COMMANDS))
def test_every_old_spelling_is_hidden_and_names_a_shown_option(path: str) -> None:
    options = [p for p in COMMANDS[path].params if p.param_type_name == "option"]
    shown = {name for p in options if not p.hidden for name in [*p.opts, *p.secondary_opts]}
    for p in options:
        if p.help and p.help.startswith("Deprecated: use "):
            new = p.help.removeprefix("Deprecated: use ").removesuffix(".")
            assert p.hidden, f"{path} {p.opts}: an old spelling is hidden from --help"
            assert new in shown, f"{path} {p.opts}: the new spelling {new} is not an option of the command"


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


def warned(err: str, old: str, new: str) -> bool:
    """``err`` holds the one deprecation warning for ``old``, once, on a line of its own."""
    lines = err.splitlines()
    return lines.count(f"harness: warning: {old} is deprecated; use {new}") == 1 and not any(
        f"{old} is deprecated" in line and not line.startswith("harness: warning: ") for line in lines
    )


# ---- each rename: the old spelling still works, with a warning; both at once is an error -----------


def test_traces_output_is_out(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    old, new = tmp_path / "old.jsonl", tmp_path / "new.jsonl"
    args = ["traces", "schedule", "--rate", "2", "--count", "5"]
    rc, _, err = run(capsys, *args, "--output", str(old))
    assert rc == 0 and old.is_file() and warned(err, "--output", "--out")
    rc, _, err = run(capsys, *args, "-o", str(new))
    assert rc == 0 and new.is_file() and "deprecated" not in err
    rc, _, err = run(capsys, *args, "--out", str(new), "--output", str(old))
    assert rc == 2 and "old spelling of --out" in err
    every_hop = ["--hops", "all", "--protocol", "any", "--cache-scope", "hop"]
    cold = tmp_path / "cp.jsonl"
    rc, _, err = run(capsys, "traces", "coldpaths", str(GENAI), *every_hop, "--output", str(cold))
    assert rc == 0 and (tmp_path / "cp.jsonl").is_file() and warned(err, "--output", "--out")
    rc, _, err = run(capsys, "traces", "scenarios", str(tmp_path / "cp.jsonl"), "--k", "2",
                     "--output", str(tmp_path / "s.json"))  # fmt: skip
    assert rc == 0 and (tmp_path / "s.json").is_file() and warned(err, "--output", "--out")


def test_analysis_cache_capacity(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """``--cache-capacity`` (``analysis effect``'s name, and its recipe key ``effect.cache_capacity``)
    was ``--cache-size`` and, before that, ``--capacity`` on ``hitrate`` and ``plan``."""
    base = ["analysis", "hitrate", "--trace", str(MOONCAKE), "--unit", "blocks", "--json"]

    def hits(out: str) -> list[tuple[int, str, float]]:
        return [(r["capacity"], r["policy"], r["hit_rate"]) for r in json.loads(out)["results"]]

    rc, out, err = run(capsys, *base, "--cache-capacity", "50", "--cache-capacity", "500")
    assert rc == 0 and "deprecated" not in err
    new = hits(out)
    assert len(new) == 6
    for old in ("--capacity", "--cache-size"):
        rc, out, err = run(capsys, *base, old, "50", old, "500")  # repeated: still one warning
        assert rc == 0 and hits(out) == new and warned(err, old, "--cache-capacity")
    rc, _, err = run(capsys, *base, "--cache-capacity", "50", "--cache-size", "500")
    assert rc == 2 and "old spelling of --cache-capacity" in err
    rc, out, err = run(capsys, *base[:-1], "--format", "mooncake", "--cache-capacity", "50", "--json")
    assert rc == 0 and warned(err, "--format", "--trace-format")
    plan = ["analysis", "plan", "--trace", str(MOONCAKE), "--unit", "blocks", "--json"]
    rc, out, _ = run(
        capsys, *plan, "--cache-capacity", "100", "--window-fraction", "0.5", "-o", str(tmp_path / "p1")
    )
    assert rc == 0
    rc, out2, err = run(capsys, *plan, "--cache-size", "100", "--window", "0.5", "--max-failure-rate", "0.05",
                        "-o", str(tmp_path / "p2"))  # fmt: skip
    assert rc == 0 and json.loads(out) == json.loads(out2)
    assert warned(err, "--cache-size", "--cache-capacity") and warned(err, "--window", "--window-fraction")
    assert warned(err, "--max-failure-rate", "--max-error-rate")
    assert "max_failure_rate: 0.05" in (tmp_path / "p2" / "ladder.yaml").read_text()
    rc, _, err = run(capsys, *plan, "-o", str(tmp_path / "p3"))
    assert rc == 2 and "--cache-capacity" in err  # still required, under any spelling


def test_report_capacity_is_capacity_json(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    missing = tmp_path / "no-capacity.json"
    rc, _, err = run(capsys, "report", "--capacity", str(missing), "-o", str(tmp_path / "r.html"))
    assert rc == 3 and str(missing) in err and warned(err, "--capacity", "--capacity-json")
    rc, _, err = run(capsys, "report", "--capacity-json", str(missing), "-o", str(tmp_path / "r.html"))
    assert rc == 3 and "deprecated" not in err


def test_gate_json_path_is_json_out(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    runs = ROOT / "fixtures" / "runs" / "tiny-cpu"
    base = ["gate", "--baseline", str(ROOT / "fixtures" / "baselines" / "tiny-cpu.yaml"),
            f"cold={runs / 'cold'}", f"warm={runs / 'warm'}", "--junit", str(tmp_path / "j.xml")]  # fmt: skip
    rc, _, err = run(capsys, *base, "--json", str(tmp_path / "old.json"))
    assert rc in (0, 1, 6) and warned(err, "--json", "--json-out")
    assert json.loads((tmp_path / "old.json").read_text())["verdict"]
    rc, _, err = run(capsys, *base, "--json-out", str(tmp_path / "new.json"))
    assert rc in (0, 1, 6) and (tmp_path / "new.json").is_file() and "deprecated" not in err


def test_serve_host_is_bind(capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: Any) -> None:
    # A non-loopback address without credentials is refused (exit 4) before any model loads: enough
    # to see which spelling reached the server's settings.
    monkeypatch.setenv("HARNESS__RUN_DIR", str(tmp_path / "run"))
    rc, _, err = run(capsys, "serve", "--preset", "tiny", "--port", "0", "--host", "0.0.0.0")
    assert rc == 4 and "protected mode" in err and warned(err, "--host", "--bind")
    rc, _, err = run(capsys, "serve", "--preset", "tiny", "--port", "0", "--bind", "0.0.0.0")
    assert rc == 4 and "protected mode" in err and "--bind" in err and "deprecated" not in err
    rc, _, err = run(capsys, "serve", "--bind", "0.0.0.0", "--host", "127.0.0.1")
    assert rc == 2 and "old spelling of --bind" in err


def test_deploy_istio_host_is_service_host(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, "deploy", "istio", "--host", "llm.svc")
    assert rc == 0 and "llm.svc" in out and warned(err, "--host", "--service-host")
    rc, out2, err = run(capsys, "deploy", "istio", "--service-host", "llm.svc")
    assert rc == 0 and out2 == out and "deprecated" not in err
    rc, _, err = run(capsys, "deploy", "istio")
    assert rc == 2 and "--service-host" in err


def test_traces_format_and_process(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """``--trace-format`` (as ``corpus build`` and ``analysis hitrate`` name it) was ``--format``;
    ``traces schedule``'s arrival process, ``--arrival`` (as the load options name it), was ``--process``."""
    base = ["traces", "schedule", "--rate", "4", "--count", "20", "--seed", "1"]
    rc, _, err = run(capsys, *base, "--arrival", "gamma", "--cv", "2", "-o", str(tmp_path / "new.jsonl"))
    assert rc == 0 and "deprecated" not in err
    rc, _, err = run(capsys, *base, "--process", "gamma", "--cv", "2", "-o", str(tmp_path / "old.jsonl"))
    assert rc == 0 and warned(err, "--process", "--arrival")
    assert (tmp_path / "old.jsonl").read_text() == (tmp_path / "new.jsonl").read_text()
    rc, _, err = run(capsys, *base, "--arrival", "gamma", "--process", "gamma", "-o", str(tmp_path / "x"))
    assert rc == 2 and "old spelling of --arrival" in err
    rc, _, err = run(capsys, "traces", "inspect", "--format", "nope", str(MOONCAKE))
    assert rc == 4 and "unknown trace format 'nope'" in err and warned(err, "--format", "--trace-format")
    rc, _, err = run(capsys, "traces", "inspect", "-f", "nope", str(MOONCAKE))
    assert rc == 4 and "deprecated" not in err


def test_baseline_noise_reps_is_repeats(capsys: pytest.CaptureFixture[str]) -> None:
    runs = ROOT / "fixtures" / "runs" / "tiny-cpu"
    base = ["baseline", "noise", "--baseline", str(ROOT / "fixtures" / "baselines" / "tiny-cpu.yaml"),
            f"cold={runs / 'cold'}", f"warm={runs / 'warm'}"]  # fmt: skip
    # The fixture's runs are client-bound, which noise refuses (exit 3) after the options are read.
    rc, _, err = run(capsys, *base, "--reps", "10")
    assert rc == 3 and "client-bound" in err and warned(err, "--reps", "--repeats")
    rc, _, err = run(capsys, *base, "--reps", "9")
    assert rc == 2 and "--reps" in err and "10" in err  # the new spelling's minimum holds for the old one
    rc, _, err = run(capsys, *base, "--repeats", "10", "--reps", "10")
    assert rc == 2 and "old spelling of --repeats" in err


def test_corpus_threshold_is_dedup_threshold(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # An out-of-range value is refused (exit 4) by the corpus settings before anything is built: enough
    # to see which setting the old spelling reached.
    rc, _, err = run(capsys, "corpus", "build", "--threshold", "1.5", "-o", str(tmp_path / "c"))
    assert rc == 4 and "DEDUP_THRESHOLD" in err and warned(err, "--threshold", "--dedup-threshold")
    rc, _, err = run(capsys, "corpus", "build", "--dedup-threshold", "1.5", "-o", str(tmp_path / "c"))
    assert rc == 4 and "DEDUP_THRESHOLD" in err and "deprecated" not in err


def test_cache_timeout_is_request_timeout(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(capsys, "cache", "stats", "--url", DEAD_URL, "--timeout", "1")
    assert rc == 5 and warned(err, "--timeout", "--request-timeout")  # then the dead target: exit 5
    rc, _, err = run(capsys, "cache", "stats", "--url", DEAD_URL, "--timeout", "0.01")
    assert rc == 2 and "--timeout" in err and "0.1" in err  # the new spelling's minimum holds for the old one


def test_avalanche_target_is_target_p(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    classes = tmp_path / "classes.jsonl"
    classes.write_text('{"name": "hot", "keys": 100, "ttl_s": 60, "jitter_s": 1}\n')
    base = ["analysis", "avalanche", "--classes", str(classes), "--json"]
    rc, out, err = run(capsys, *base, "--target", "0.05")
    assert rc == 0 and warned(err, "--target", "--target-p")
    rc, out2, err = run(capsys, *base, "--target-p", "0.05")
    assert rc == 0 and json.loads(out2) == json.loads(out) and json.loads(out)["target"] == 0.05


def test_anomaly_windows_are_named(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    missing = tmp_path / "nope.jsonl"
    base = ["analysis", "anomaly", "--scrapes", str(missing)]
    rc, _, err = run(capsys, *base, "--baseline", "0:10", "--window", "10:20")
    assert rc == 3 and warned(err, "--baseline", "--baseline-window")
    assert warned(err, "--window", "--test-window")
    rc, _, err = run(capsys, *base, "--baseline-window", "0:10", "--test-window", "10:20")
    assert rc == 3 and "deprecated" not in err


@pytest.mark.parametrize(
    "command",
    [
        ["cache", "stats", "--url", DEAD_URL, "--request-timeout", "1"],
        ["analysis", "scrape", "--url", DEAD_URL, "--count", "1", "-o"],
    ],
)
def test_header_short_form_is_deprecated(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, command: list[str]
) -> None:
    if command[-1] == "-o":
        command = [*command, str(tmp_path / "scrapes.jsonl")]
    rc, _, err = run(capsys, *command, "-H", "X-A: b")
    assert rc == 5 and warned(err, "-H", "--header")  # then the dead target: exit 5
    rc, _, err = run(capsys, *command, "--header", "X-A: b")
    assert rc == 5 and "deprecated" not in err
    rc, _, err = run(capsys, *command, "--header", "X-A: b", "-H", "X-B: c")
    assert rc == 2 and "old spelling of --header" in err


def test_locust_results_dir_is_out(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same rename on ``locust -f``'s parser (the plugin's hook; a plain argparse parser here: no
    test process may import locust): the old spelling stores the same value and warns once."""
    import argparse

    from harness.load import options

    monkeypatch.setattr(options, "_WARNED", set())
    parser = argparse.ArgumentParser()
    options.add_arguments(parser)
    assert parser.parse_args(["--results-dir", "r1"]).results_dir == "r1"
    assert warned(capsys.readouterr().err, "--results-dir", "--out")
    assert parser.parse_args(["--results-dir", "r1"]).results_dir == "r1"
    assert "deprecated" not in capsys.readouterr().err  # once per process
    assert parser.parse_args(["--out", "r2"]).results_dir == "r2"
    assert parser.parse_args([]).results_dir == "runs/load"
    assert "--results-dir" not in parser.format_help()
