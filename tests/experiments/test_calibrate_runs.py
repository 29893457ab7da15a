"""``harness baseline calibrate``'s runs: the recipe run N times in this process (a stand-in run writes
made-up result sets), what stops it, ``--max-runs``, and the command end to end."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from harness.cli import main
from harness.common.errors import ConfigError, ExitCode, UnavailableError
from harness.experiments import calibrate as calibrate_module
from harness.experiments.calibrate import RunFailed, run_recipe
from harness.experiments.recipe import Recipe
from harness.gates.baseline import read_baseline
from harness.gates.calibration import load_phases
from tests.experiments.fake_harness_run import fake_run

RECIPE = Recipe.model_validate({"load": {"corpus": "c", "rate": 4, "duration": 10}})


def _quiet(_text: str) -> None:
    pass


def test_run_recipe_runs_the_recipe_and_stops_on_a_failed_run(tmp_path: Path) -> None:
    seen: list[Recipe] = []
    outs = run_recipe(RECIPE, runs=2, workdir=tmp_path / "w", say=_quiet, run_once=fake_run(seen=seen))
    assert [o.name for o in outs] == ["cal-1", "cal-2"]
    assert seen == [RECIPE, RECIPE]  # the same recipe each time, no command line in between
    assert [rs.label for rs in load_phases(outs[0])] == ["cold", "warm"]  # not the ladder
    six = run_recipe(RECIPE, runs=1, workdir=tmp_path / "six", say=_quiet, run_once=fake_run(6))
    assert len(six) == 1  # measured: the warm check undecided
    with pytest.raises(RunFailed, match="calibration run 1 of 2 exited 1") as exc:
        run_recipe(RECIPE, runs=2, workdir=tmp_path / "one", say=_quiet, run_once=fake_run(1))
    assert exc.value.exit_code == ExitCode.CHECK_FAILED
    assert not (tmp_path / "one" / "cal-2").exists()

    def unreachable(recipe: Recipe, out: Path, source: Path | None) -> int:
        raise UnavailableError("cannot reach http://127.0.0.1:9")

    with pytest.raises(RunFailed, match="exited 5: cannot reach") as exc:
        run_recipe(RECIPE, runs=3, workdir=tmp_path / "five", say=_quiet, run_once=unreachable)
    assert exc.value.exit_code == ExitCode.UNAVAILABLE


def test_calibration_runs_are_not_gated(tmp_path: Path) -> None:
    gated = Recipe.model_validate({"load": {"corpus": "c"}, "gate": {"baseline": "b.yaml"}})
    with pytest.raises(ConfigError, match="its runs are not gated"):
        run_recipe(gated, runs=3, workdir=tmp_path, say=_quiet, run_once=fake_run())


def _calibrate(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    with pytest.raises(SystemExit) as ex:
        main(["baseline", "calibrate", *args])
    code = ex.value.code
    return int(code) if isinstance(code, int) else 1, capsys.readouterr().err


def test_calibrate_cli_end_to_end_with_a_stand_in_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[Recipe] = []
    monkeypatch.setattr(calibrate_module, "paired_run", fake_run(seen=seen))
    monkeypatch.setenv("COLUMNS", "200")
    recipe = tmp_path / "r.yaml"
    recipe.write_text("load:\n  corpus: runs/corpus\n  rate: 4\n  duration: 100\n")
    out = tmp_path / "base.yaml"
    code, err = _calibrate(capsys, "--runs", "3", "--out", str(out), "--recipe", str(recipe), "--rate", "2")
    assert code == 0, err
    assert [r.load.rate for r in seen] == [2.0, 2.0, 2.0]  # the flag overrides the file
    text = out.read_text()
    assert text.startswith("# Calibrated by `harness baseline calibrate` on AMD EPYC 7B13 ×2 CPUs, no GPU")
    assert "# Recipe: harness run --corpus runs/corpus --rate 2.0 --duration 100.0" in text
    raw = yaml.safe_load(text)
    assert set(raw["fingerprint"]["recipes"]) == {"cold", "warm"}
    assert {g.effective_phase for g in read_baseline(out).gates} == {"cold", "warm"}
    assert (tmp_path / "base.yaml.runs" / "cal-3" / "warm" / "records.jsonl").exists()
    # The old form, `-- <harness run arguments>`, still works, with a warning.
    seen.clear()
    old = tmp_path / "old.yaml"
    code, err = _calibrate(capsys, "--runs", "3", "--out", str(old), "--", "--corpus", "c", "--rate", "3")
    assert code == 0, err
    assert "is deprecated" in err and [r.load.rate for r in seen] == [3.0, 3.0, 3.0]
    code, err = _calibrate(
        capsys, "--runs", "3", "--out", str(old), "--", "--corpus", "c", "--gate", "b.yaml"
    )
    assert code == 4 and "--gate is set by calibrate itself" in err
    # A run that breaks stops calibration with its code, and nothing is written.
    monkeypatch.setattr(calibrate_module, "paired_run", fake_run(3))
    x = tmp_path / "x.yaml"
    code, err = _calibrate(capsys, "--runs", "3", "--out", str(x), "--corpus", "c", "--rate", "4")
    assert code == 3 and "calibration run 1 of 3 exited 3" in err
    assert not x.exists()


def test_max_runs_adds_runs_while_a_gate_is_blind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Run 2 took 30 % longer (a neighbour's burst): three runs leave the latency gates blind, so
    with --max-runs calibration runs the recipe again, one at a time, until they see (five runs: the
    allowance falls from 3.7 ranges to 1.2), keeping the slow run; without it, it stops at --runs."""
    monkeypatch.setattr(calibrate_module, "paired_run", fake_run(drifts=(1, 1.3, 1.15, 1.05, 1.1, 1, 1)))
    args = ("--corpus", "c", "--rate", "4", "--duration", "10")
    code, err = _calibrate(capsys, "--runs", "3", "--out", str(tmp_path / "three.yaml"), *args)
    assert code == 0, err
    assert "blind: true" in (tmp_path / "three.yaml").read_text() and "one more" not in err
    out = tmp_path / "more.yaml"
    code, err = _calibrate(capsys, "--runs", "3", "--max-runs", "7", "--out", str(out), *args)
    assert code == 0, err
    assert "blind: true" not in out.read_text()
    added = err.count("one more")
    assert 1 <= added <= 4 and f"from {3 + added} runs" in err
    assert (tmp_path / "more.yaml.runs" / f"cal-{3 + added}").is_dir()
    assert not (tmp_path / "more.yaml.runs" / f"cal-{4 + added}").exists()
    assert len(read_baseline(out).provenance.results) == 2 * (3 + added)  # the slow run 2 is kept


def test_from_runs_finds_nested_runs_and_sets_aside_another_machines(tmp_path: Path) -> None:
    """``--from-runs``: CI artifacts unpack one folder deeper (``history/<run id>/<artifact>/``); a run
    from another runner type among them is set aside and named, not mixed into the spread."""
    from harness.common.fingerprint import Environment, Hardware
    from harness.experiments.calibrate import history_runs
    from harness.load.run_summary import read_summary, write_summary
    from tests.experiments.fake_harness_run import ENV

    history = tmp_path / "history"
    for k in range(1, 6):
        fake_run()(RECIPE, history / f"10{k}" / f"cal-{k}", None)
    other = Environment(hardware=Hardware(cpu_model="Intel Xeon 8375C", cpu_count=2), software=ENV.software)
    odd = history / "103" / "cal-3" / "cold"
    write_summary(odd, read_summary(odd).model_copy(update={"environment": other}))
    said: list[str] = []
    dirs = history_runs(history, say=said.append)
    assert [d.name for d in dirs] == ["cal-1", "cal-2", "cal-4", "cal-5"]
    assert len(said) == 1 and "cal-3" in said[0] and "Intel Xeon 8375C" in said[0]
    assert [d.name for d in history_runs(history, most=3, say=said.append)] == ["cal-2", "cal-4", "cal-5"]
    few = tmp_path / "few"
    for k in (1, 2):
        fake_run()(RECIPE, few / f"cal-{k}", None)
    with pytest.raises(ConfigError, match="2 runs of the newest run's recipe"):
        history_runs(few, say=_quiet)
