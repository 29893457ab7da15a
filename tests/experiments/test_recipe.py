"""A run as a recipe file with flags as overrides: precedence, errors that name the file's line or the
flag, secrets kept out of files, and the recipe a run writes, which runs it again."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from harness.cli import main
from harness.common.errors import ConfigError
from harness.experiments.recipe import (
    RECIPE_FILE,
    Recipe,
    recipe_args,
    recipe_dump,
    resolve,
    write_recipe,
)
from harness.experiments.run_cli import RUN_OPTIONS
from harness.load.options import LoadOptions, Share

ROOT = Path(__file__).resolve().parents[2]
CI = ROOT / "fixtures" / "recipes" / "paired.yaml"
JOB = ROOT / "fixtures" / "recipes" / "ci.yaml"


def test_the_paired_recipe_is_the_documented_run() -> None:
    r = resolve(CI, {}, RUN_OPTIONS)
    assert r.target.serve_argv() == ["--preset", "tiny", "--cache"]
    assert r.load.rate == Share(0.7) and r.load.capacity is None  # measured first by harness run
    assert (r.load.max_requests, r.load.max_tokens_cap) == (200, 8)
    assert (
        r.capacity.slo == "ttft_from_intended_p50<=3x,tpot_p50<=3x,error_rate<=0.1"
        and not r.capacity.bypass_cache
    )
    assert r.gate.baseline is None


def test_the_ci_recipe_is_an_ab_job_whose_base_the_workflow_can_replace() -> None:
    from harness.experiments.ab_cli import AB_OPTIONS
    from harness.experiments.ab_spec import ABSpec

    r = resolve(JOB, {}, AB_OPTIONS)
    assert r.load.rate == Share(0.5) and r.load.capacity is None  # the base's, measured in the job
    assert r.ab.looks * r.ab.blocks * (r.ab.block_requests or 0) <= 240  # the documented corpus
    assert r.gate.baseline == Path("fixtures/baselines/ci-limits.yaml")
    # The workflow's --base-url replaces the recipe's own target (the base by default).
    given = resolve(JOB, {"ab": {"base_url": "http://127.0.0.1:8100"}}, AB_OPTIONS)
    targets = ABSpec(given, out=Path("runs/ab")).targets()
    assert targets["base"].url == "http://127.0.0.1:8100" and targets["candidate"].serve_args
    # Both sides as URLs (docs/ci.md, "other targets"): the flag replaces the file's server to start.
    urls = {"base_url": "http://127.0.0.1:8100", "candidate_url": "http://127.0.0.1:8200"}
    both = ABSpec(resolve(JOB, {"ab": urls}, AB_OPTIONS), out=Path("runs/ab")).targets()
    assert both["candidate"].url == "http://127.0.0.1:8200" and both["candidate"].serve_args is None
    # Both given as flags is still refused, naming the flag.
    with pytest.raises(ConfigError, match="not both"):
        resolve(JOB, {"ab": {"candidate_url": "http://x:8200", "candidate_serve_args": "--preset tiny"}})


def test_flags_override_the_file_and_the_defaults_fill_the_rest(tmp_path: Path) -> None:
    given = {"load": {"rate": "2", "max_tokens_cap": 4}, "target": {"serve_args": "--preset tiny"}}
    r = resolve(CI, given, RUN_OPTIONS)
    assert r.load.rate == 2.0 and r.load.max_tokens_cap == 4 and r.load.max_requests == 200
    assert r.target.serve_argv() == ["--preset", "tiny"]
    assert r.warmup.probes == 20 and r.load.concurrency == 64  # nobody set them: the fields' defaults
    # Flags alone make a recipe too.
    assert resolve(None, {"load": {"corpus": "c"}}, RUN_OPTIONS).load.corpus == Path("c")


def test_a_bad_value_names_the_flag_or_the_files_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as flag:
        resolve(CI, {"load": {"max_tokens_cap": 0}}, RUN_OPTIONS)
    assert flag.value.field == "--max-tokens-cap" and flag.value.file is None
    bad = tmp_path / "r.yaml"
    bad.write_text("load:\n  corpus: c\n  rate: fast\n")
    with pytest.raises(ConfigError) as file:
        resolve(bad, {}, RUN_OPTIONS)
    assert (file.value.file, file.value.line, file.value.field) == (str(bad), 3, "load.rate")
    bad.write_text("load:\n  corpus: c\nwarmup:\n  probs: 3\n")  # a misspelt field is an error
    with pytest.raises(ConfigError) as typo:
        resolve(bad, {}, RUN_OPTIONS)
    assert typo.value.field == "warmup.probs" and typo.value.line == 4
    bad.write_text("load:\n  corpus: c\n  results_dir: elsewhere\n")
    with pytest.raises(ConfigError, match="set by the run itself"):
        resolve(bad, {}, RUN_OPTIONS)
    # --url over a recipe that starts its target uses that server instead; both as flags is refused.
    assert resolve(CI, {"target": {"url": "http://x"}}, RUN_OPTIONS).target.serve_args is None
    both = {"target": {"url": "http://x", "serve_args": "--preset tiny"}}
    with pytest.raises(ConfigError, match="not both") as two:
        resolve(CI, both, RUN_OPTIONS)
    assert two.value.field == "target"


def test_serve_arguments_may_be_written_by_name(tmp_path: Path) -> None:
    """A recipe's serve arguments as a shell string, or as harness serve's options by name: one
    declaration (the settings fields) gives both their flags."""
    typed = tmp_path / "typed.yaml"
    typed.write_text(
        "target:\n  serve_args: {preset: tiny, cache: true, max_num_seqs: 8, bind: 127.0.0.1}\n"
        "ab:\n  candidate_serve_args: {preset: tiny, cache: false, inject_slowdown: 1.5}\n"
    )
    recipe = resolve(typed, {}, RUN_OPTIONS)
    assert recipe.target.serve_argv() == [
        "--preset",
        "tiny",
        "--cache",
        "--max-num-seqs",
        "8",
        "--bind",
        "127.0.0.1",
    ]
    assert recipe.ab.candidate_serve_args == "--preset tiny --no-cache --inject-slowdown 1.5"
    typed.write_text("target:\n  serve_args: {preset: tiny, cahce: true}\n")
    with pytest.raises(ConfigError, match="not an option of harness serve: cahce") as bad:
        resolve(typed, {}, RUN_OPTIONS)
    assert bad.value.field == "target.serve_args" and bad.value.line == 2


def test_serve_arguments_are_checked_as_the_server_checks_them_before_any_starts() -> None:
    from harness.experiments.driver import check_serve_args

    assert check_serve_args(["--preset", "tiny", "--cpu-threads", "1"])[-1] == "1"
    with pytest.raises(ConfigError, match="--cpu-threads") as low:
        check_serve_args(
            ["--preset", "tiny", "--cpu-threads", "0"]
        )  # typer parses it; the settings refuse it
    assert low.value.field == "--serve-args"
    with pytest.raises(ConfigError, match="--preset"):
        check_serve_args(["--preset", "huge"])


def test_secrets_stay_out_of_recipe_files(tmp_path: Path) -> None:
    f = tmp_path / "r.yaml"
    f.write_text("load:\n  corpus: c\n  api_key: sk-real\n")
    with pytest.raises(ConfigError, match="a secret does not belong in a recipe file") as exc:
        resolve(f, {}, RUN_OPTIONS)
    assert exc.value.field == "load.api_key" and "sk-real" not in str(exc.value)
    r = resolve(None, {"load": {"corpus": "c", "api_key": "sk-real", "header": ["X-Org: acme"]}}, RUN_OPTIONS)
    assert r.load.credentials().api_key == "sk-real"
    written = write_recipe(tmp_path, r)
    text = written.read_text()
    assert "sk-real" not in text and "acme" not in text and "***" in text
    # A written recipe runs again: its placeholders are dropped, the secrets come from flags.
    again = resolve(written, {"load": {"api_key": "sk-new"}}, RUN_OPTIONS)
    assert again.load.credentials().api_key == "sk-new" and again.load.header == []


def test_the_recipe_a_run_writes_resolves_to_the_same_recipe(tmp_path: Path) -> None:
    r = resolve(CI, {"load": {"duration": 30.0, "seed": 7}, "warmup": {"probes": 5}}, RUN_OPTIONS)
    path = write_recipe(tmp_path, r)
    assert path == tmp_path / RECIPE_FILE and path.read_text().startswith("# The recipe this run ran")
    assert resolve(path, {}, RUN_OPTIONS) == r
    assert yaml.safe_load(path.read_text()) == recipe_dump(r)
    # The flags that give it, as the baseline's header writes them.
    args = recipe_args(r, RUN_OPTIONS)
    assert args[:2] == ["--serve-args", "--preset tiny --cache"] and "--use-cache" not in args
    assert args[args.index("--rate") + 1] == "70%" and args[args.index("--probes") + 1] == "5"


def test_every_option_is_declared_once_with_its_help() -> None:
    """The load options' help is each field's description; the recipe's sections have no second
    declaration of a load option (a sweep or a command reuses the field, never re-declares it)."""
    assert all(info.description for info in LoadOptions.model_fields.values())
    load_fields = set(LoadOptions.model_fields)
    for section in ("target", "warmup", "capacity", "gate", "ab"):
        model = Recipe.model_fields[section].annotation
        assert isinstance(model, type)
        assert not load_fields & set(model.model_fields), section
        assert all(info.description for info in model.model_fields.values()), section


def test_harness_run_takes_a_recipe_and_refuses_a_bad_one_before_starting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "r.yaml"
    f.write_text("load:\n  corpus: nowhere.jsonl\n  rate: 4\n  duration: 1\n")
    with pytest.raises(SystemExit) as ex:
        main(["run", "--recipe", str(f), "--url", "http://127.0.0.1:9", "-o", str(tmp_path / "out")])
    assert ex.value.code == 3  # the corpus is missing: found before any target is reached
    assert "nowhere.jsonl" in capsys.readouterr().err
    f.write_text("load:\n  rate: 4\n")
    with pytest.raises(SystemExit) as ex:
        main(["run", "--recipe", str(f), "-o", str(tmp_path / "out")])
    assert ex.value.code == 4 and "no corpus to replay" in capsys.readouterr().err
