"""The error type, exit codes, settings loading, atomic writes and the CLI's error handling."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic_settings import BaseSettings

from harness.common.errors import (
    CannotJudge,
    CheckFailed,
    ConfigError,
    ExitCode,
    HarnessError,
    InputError,
    UnavailableError,
)
from harness.common.io import atomic_write, check_input_file, write_jsonl
from harness.common.registry import Registry
from harness.common.settings import load_settings, stage_config


def test_error_names_file_line_and_field() -> None:
    err = InputError("expected an integer", file="t.csv", line=7, field="ContextTokens", hint="fix row")
    assert str(err) == "t.csv:7: field 'ContextTokens': expected an integer (hint: fix row)"
    assert err.exit_code == ExitCode.INPUT == 3
    assert err.to_dict()["line"] == 7


@pytest.mark.parametrize(
    ("cls", "code"),
    [(InputError, 3), (ConfigError, 4), (UnavailableError, 5), (CheckFailed, 1), (CannotJudge, 6)],
)
def test_exit_codes_are_distinct_and_documented(cls: type[HarnessError], code: int, repo_root: Path) -> None:
    assert int(cls("x").exit_code) == code
    doc = (repo_root / "docs" / "exit-codes.md").read_text(encoding="utf-8")
    assert f"| {code} " in doc


def test_atomic_write_leaves_old_file_on_failure(tmp_path: Path) -> None:
    target = tmp_path / "out.jsonl"
    write_jsonl(target, [{"a": 1}])
    with pytest.raises(RuntimeError), atomic_write(target) as fh:
        fh.write("partial")
        raise RuntimeError("crash mid-write")
    assert target.read_text() == '{"a":1}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["out.jsonl"], "temporary file left behind"


@pytest.mark.parametrize(
    ("content", "message"),
    [(b"", "empty"), (b"\x00\x01binary", "binary")],
)
def test_check_input_file_rejects_bad_files(tmp_path: Path, content: bytes, message: str) -> None:
    p = tmp_path / "f"
    p.write_bytes(content)
    with pytest.raises(InputError, match=message):
        check_input_file(p)
    with pytest.raises(InputError, match="directory"):
        check_input_file(tmp_path)
    with pytest.raises(InputError, match="no such file"):
        check_input_file(tmp_path / "missing")


def test_registry_rejects_duplicates_and_lists_known_names() -> None:
    reg: Registry[int] = Registry("thing")
    reg.register("a")(1)
    with pytest.raises(ValueError):
        reg.register("a")(2)
    with pytest.raises(ConfigError, match="known: a"):
        reg.get("b")


class _DemoSettings(BaseSettings):
    model_config = stage_config("demo")
    port: int = 8000


def test_settings_read_env_prefix_and_report_bad_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARNESS__DEMO__PORT", "9001")
    assert load_settings(_DemoSettings).port == 9001
    assert load_settings(_DemoSettings, port=7000).port == 7000
    monkeypatch.setenv("HARNESS__DEMO__PORT", "not-a-port")
    with pytest.raises(ConfigError, match="HARNESS__DEMO__PORT"):
        load_settings(_DemoSettings)


def _harness(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", *args],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_cli_help_lists_stage_groups() -> None:
    res = _harness("--help")
    assert res.returncode == 0
    for group in ("traces", "corpus", "serve"):
        assert group in res.stdout


def test_cli_usage_error_exits_2_without_traceback() -> None:
    res = _harness("no-such-command")
    assert res.returncode == ExitCode.USAGE
    assert "Traceback" not in res.stderr


def test_cli_bad_log_level_is_a_usage_error() -> None:
    res = _harness("--log-level", "loud", "traces", "formats")
    assert res.returncode == ExitCode.USAGE
    assert "Traceback" not in res.stderr and "--log-level" in res.stderr


def test_atomic_write_gives_ordinary_file_mode(tmp_path: Path) -> None:
    umask = os.umask(0o022)
    try:
        write_jsonl(tmp_path / "a.jsonl", [{"x": 1}])
    finally:
        os.umask(umask)
    assert (tmp_path / "a.jsonl").stat().st_mode & 0o777 == 0o644


@pytest.mark.parametrize("cell", ["[/x]", "[bold]12"])
def test_cli_error_prints_user_data_literally(tmp_path: Path, cell: str) -> None:
    """A bad cell that looks like Rich markup is quoted as typed: no traceback, nothing swallowed."""
    csv = tmp_path / "t.csv"
    csv.write_text(f"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,{cell},3\n")
    res = _harness("traces", "inspect", str(csv))
    assert res.returncode == ExitCode.INPUT, res.stderr
    assert "Traceback" not in res.stderr
    assert f"got '{cell}'" in res.stderr
