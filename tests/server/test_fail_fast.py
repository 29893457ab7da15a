"""``harness serve`` checks its settings, files and port before it loads a model or starts Redis.

The order is tested without a clock: loading a model and starting Redis are replaced by functions
that fail the test if they are reached, so a check that runs too late fails loudly instead of
passing after a slow load.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from harness.common.errors import ConfigError, UnavailableError
from harness.target.server import cli


@pytest.fixture
def nothing_slow(monkeypatch: pytest.MonkeyPatch) -> None:
    import harness.target.engine.factory as engine_factory
    from harness.target.cache import redis_server

    def model_loaded(*args: object, **kwargs: object) -> None:
        pytest.fail("a model was loaded before every setting and file was checked")

    def redis_started(*args: object, **kwargs: object) -> None:
        pytest.fail("Redis was started before every setting and file was checked")

    monkeypatch.setattr(engine_factory, "create_engine", model_loaded)
    monkeypatch.setattr(redis_server.EmbeddedRedis, "start", redis_started)
    monkeypatch.setenv("HARNESS__RUN_DIR", "/nonexistent/never-created")
    monkeypatch.setenv("HARNESS__SERVER__PORT", "0")


@pytest.mark.parametrize(
    ("env", "field"),
    [
        ({"HARNESS__SERVER__PORT": "99999"}, "HARNESS__SERVER__PORT"),
        ({"HARNESS__ENGINE__BLOCK_SIZE": "0"}, "HARNESS__ENGINE__BLOCK_SIZE"),
        ({"HARNESS__CACHE__TIER_POLICY": "lru-ish"}, "HARNESS__CACHE__TIER_POLICY"),
        ({"HARNESS__CACHE__TTL_COLD_S": "99999"}, None),  # cold > hot: a cross-field check
        ({"REDIS_URL": "http://localhost:6379"}, "HARNESS__CACHE__REDIS_URL"),  # its first alias
        ({"HARNESS__CACHE__EMBED_MODEL_PATH": "/no/such/model"}, "HARNESS__CACHE__EMBED_MODEL_PATH"),
    ],
)
def test_bad_settings_fail_before_anything_slow(nothing_slow, monkeypatch, env, field) -> None:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ConfigError) as info:
        cli.run_server({"preset": "tiny"}, {"cache": True})
    assert info.value.field == field


def test_cache_settings_are_not_read_without_cache(nothing_slow, monkeypatch) -> None:
    """Without ``--cache`` a bad cache setting is irrelevant: the server gets as far as loading the
    model (here: the stand-in that fails the test, so the test expects exactly that failure)."""
    monkeypatch.setenv("HARNESS__CACHE__TIER_POLICY", "lru-ish")
    with pytest.raises(pytest.fail.Exception, match="a model was loaded"):
        cli.run_server({"preset": "tiny"}, {"cache": False})


@pytest.mark.parametrize("missing", ["dir", "config.json", "tokenizer.json", "weights"])
def test_a_model_dir_that_is_not_a_checkpoint_fails_before_loading(
    nothing_slow, monkeypatch, tmp_path: Path, missing: str
) -> None:
    model = tmp_path / "ckpt"
    if missing != "dir":
        model.mkdir()
        for name in ("config.json", "tokenizer.json", "model.safetensors"):
            if name != missing and not (missing == "weights" and name == "model.safetensors"):
                (model / name).write_text("{}")
    with pytest.raises(ConfigError) as info:
        cli.run_server({"model_dir": model}, {})
    expected = {"dir": "does not exist", "weights": "safetensors"}.get(missing, missing)
    assert expected in str(info.value)


def test_a_busy_port_fails_before_loading(nothing_slow, monkeypatch) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        with pytest.raises(UnavailableError, match="cannot listen"):
            cli.run_server({"preset": "tiny"}, {"port": busy.getsockname()[1], "cache": True})


def test_cli_reports_a_bad_cache_setting_as_exit_4(tmp_path: Path) -> None:
    env = {"HARNESS__CACHE__TIER_POLICY": "lru-ish", "HARNESS__RUN_DIR": str(tmp_path / "run")}
    p = subprocess.run(
        [sys.executable, "-m", "harness.cli", "serve", "--preset", "tiny", "--cache", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
        check=False,
    )
    assert p.returncode == 4, p.stderr
    assert "HARNESS__CACHE__TIER_POLICY" in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "run" / "redis").exists()  # no Redis was started
