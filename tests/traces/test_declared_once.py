"""Defaults and formats are declared once: the cold-path API and the CLI help take the settings'
defaults, and every reader is registered under one family with a name unique across both."""

from __future__ import annotations

import pytest

from harness.common.errors import ConfigError, InputError
from harness.traces import formats, read_requests, read_traces
from harness.traces._base import REQUEST_READERS, TRACE_READERS, family_of
from harness.traces.cli import app
from harness.traces.coldpaths import ColdPathConfig
from harness.traces.settings import TracesSettings


def test_coldpath_defaults_are_the_settings_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARNESS__TRACES__THRESHOLD_MS", "5")  # the API reads declared defaults only
    declared = TracesSettings.model_construct()
    cfg = ColdPathConfig.build()
    assert cfg.threshold_ms == declared.threshold_ms == 500.0
    assert cfg.protocols == frozenset(declared.protocols.split(","))
    assert (cfg.hops, cfg.cache_scope) == (declared.hops, declared.cache_scope)
    assert len(cfg.cache_hit) == len(declared.cache_hit.split(","))


def test_cli_help_shows_the_settings_default() -> None:
    from typer.testing import CliRunner

    out = CliRunner().invoke(app, ["coldpaths", "--help"], env={"COLUMNS": "200"}).output
    assert "(default 500)" in out and "(default http,grpc)" in out


def test_every_format_has_one_family() -> None:
    names = formats()
    assert len(names) == len(set(names)) == len(REQUEST_READERS.names()) + len(TRACE_READERS.names())
    assert set(formats("requests")) == set(REQUEST_READERS.names())
    assert {family_of(n) for n in TRACE_READERS.names()} == {"traces"}
    with pytest.raises(ConfigError, match="mooncake"):
        family_of("no-such-format")


def test_reading_the_other_family_names_it(tmp_path) -> None:
    f = tmp_path / "t.jsonl"
    f.write_text('{"timestamp": 0, "input_length": 3, "output_length": 2, "hash_ids": [1]}\n')
    assert [e.input_tokens for e in read_requests(f)] == [3]
    with pytest.raises(InputError, match="not a distributed trace"):
        list(read_traces(f))
    with pytest.raises(ConfigError, match="unknown trace format"):
        list(read_requests(f, format="nope"))
