"""``harness traces`` checks every input file, the output path and the settings before it reads
anything: a bad last file or an unwritable output fails at once instead of after streaming the
others. The order is tested without a clock: the readers are replaced by functions that fail the
test if they are reached."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.common.errors import ConfigError, InputError
from harness.traces import api
from harness.traces.cli import coldpaths_cmd, scenarios_cmd, schedule_cmd

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "traces"
TRACE = str(FIXTURES / "genaiTestTrace.json")
REQUESTS = str(FIXTURES / "mooncake_synthetic_head20.jsonl")


@pytest.fixture
def nothing_read(monkeypatch: pytest.MonkeyPatch) -> None:
    def read(*args: object, **kwargs: object) -> None:
        pytest.fail("an input was read before every input, the output and the settings were checked")

    monkeypatch.setattr(api, "read_traces", read)
    monkeypatch.setattr(api, "read_requests", read)


def test_coldpaths_checks_the_last_file_first(nothing_read, tmp_path: Path) -> None:
    missing = str(tmp_path / "missing.json")
    with pytest.raises(InputError, match="no such file") as info:
        coldpaths_cmd(files=[TRACE, missing], output=tmp_path / "out.jsonl")
    assert str(info.value.file) == missing


def test_coldpaths_checks_the_output_first(nothing_read, tmp_path: Path) -> None:
    with pytest.raises(InputError, match="is a directory"):
        coldpaths_cmd(files=[TRACE], output=tmp_path)
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(InputError, match="not a directory"):
        coldpaths_cmd(files=[TRACE], output=blocker / "sub" / "out.jsonl")


def test_an_unknown_format_name_is_refused_before_reading(nothing_read, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown trace format"):
        coldpaths_cmd(files=[TRACE], output=tmp_path / "o.jsonl", format="jaeger-xml")


def test_scenarios_checks_settings_and_output_first(
    nothing_read, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HARNESS__TRACES__K", "0")
    with pytest.raises(ConfigError) as info:
        scenarios_cmd(files=[TRACE], output=tmp_path / "s.json")
    assert info.value.field == "HARNESS__TRACES__K"
    monkeypatch.delenv("HARNESS__TRACES__K")
    with pytest.raises(InputError, match="is a directory"):
        scenarios_cmd(files=[TRACE], output=tmp_path)


def test_schedule_checks_source_and_output_first(nothing_read, tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file"):
        schedule_cmd(source=str(tmp_path / "nope.jsonl"), output=tmp_path / "sched.jsonl")
    with pytest.raises(InputError, match="is a directory"):
        schedule_cmd(source=REQUESTS, output=tmp_path)


def test_the_checks_pass_good_input_through(tmp_path: Path) -> None:
    out = tmp_path / "deeper" / "cold.jsonl"  # a missing parent directory is created
    coldpaths_cmd(files=[TRACE], output=out)
    assert out.is_file()
    schedule_cmd(source=REQUESTS, output=tmp_path / "sched.jsonl")
    assert len((tmp_path / "sched.jsonl").read_text().splitlines()) == 20
