"""Credentials: what goes on the wire, and that secrets stay out of everything written or shown."""

from __future__ import annotations

import argparse
import ssl
from pathlib import Path

import pytest

from harness.common.auth import (
    REDACTED,
    SECRETS_ENV,
    Credentials,
    parse_header,
    redact_args,
    secrets_from_env,
)
from harness.common.errors import ConfigError
from harness.load.options import LoadOptions, add_arguments
from harness.load.runner import LoadSpec

KEY = "sk-test-4f9a1c"
TOKEN = "adm-7e2b90"


def test_headers_for_the_openai_and_the_admin_routes() -> None:
    c = Credentials.of(api_key=KEY, admin_token=TOKEN, headers=["X-Org: research"])
    assert c.request_headers() == {"X-Org": "research", "Authorization": f"Bearer {KEY}"}
    assert c.admin_headers() == {"X-Org": "research", "Authorization": f"Bearer {TOKEN}"}
    # Without an admin token the key is used (vLLM guards its dev endpoints with the same key).
    assert Credentials.of(api_key=KEY).admin_headers() == {"Authorization": f"Bearer {KEY}"}
    assert Credentials().request_headers() == {}


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("no-colon", "NAME:VALUE"),
        (": value", "NAME:VALUE"),
        ("Bad Name: v", "not a valid header name"),
        ("X-A: one\r\nX-Injected: two", "line break"),
        ("Content-Length: 5", "set by the client"),
        ("Host: evil.example", "set by the client"),
    ],
)
def test_bad_headers_are_refused_without_echoing_the_value(text: str, needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_header(text)
    assert needle in str(err.value)
    assert err.value.field == "--header"
    assert "two" not in str(err.value) and "evil" not in str(err.value)


def test_a_header_value_may_hold_colons() -> None:
    assert parse_header("Authorization: Basic a:b") == ("Authorization", "Basic a:b")


def test_secrets_never_show_in_repr_description_or_redacted_text() -> None:
    c = Credentials.of(api_key=KEY, admin_token=TOKEN, headers=["X-Secret: s3cr3t-value"])
    for shown in (repr(c), str(c.describe())):
        assert KEY not in shown and TOKEN not in shown and "s3cr3t-value" not in shown
    assert c.describe()["headers"] == ["X-Secret"]
    text = f"401: bad key {KEY}, token {TOKEN}, header s3cr3t-value"
    assert c.redact(text) == f"401: bad key {REDACTED}, token {REDACTED}, header {REDACTED}"


def test_redact_args_blanks_the_values_of_secret_options() -> None:
    args = ["--rate", "5", "--api-key", KEY, f"--admin-token={TOKEN}", "-H", "X-A: b", "--url", "u"]
    assert redact_args(args) == [
        "--rate", "5", "--api-key", REDACTED, f"--admin-token={REDACTED}", "-H", REDACTED, "--url", "u",
    ]  # fmt: skip


def test_tls_is_verified_unless_insecure_is_asked_for(tmp_path: Path) -> None:
    assert Credentials().httpx_verify() is True
    assert Credentials().ssl_context().verify_mode == ssl.CERT_REQUIRED
    assert Credentials.of(insecure=True).httpx_verify() is False
    assert Credentials.of(insecure=True).ssl_context().verify_mode == ssl.CERT_NONE
    with pytest.raises(ConfigError, match="no CA bundle"):
        Credentials.of(ca_bundle=tmp_path / "missing.pem")
    bundle = tmp_path / "ca.pem"
    bundle.write_text("")
    with pytest.raises(ConfigError, match="pointless"):
        Credentials.of(ca_bundle=bundle, insecure=True)


def test_load_options_keep_secrets_off_the_command_line_and_hand_them_over_by_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spec = LoadSpec(
        host="http://127.0.0.1:1", results_dir="r", corpus="fixtures", rate=1, duration=1,
        api_key=KEY, admin_token=TOKEN, header=("X-Org: research",), insecure=True,
    )  # fmt: skip
    opts = spec.options
    cmd = spec.command()
    assert all(KEY not in a and TOKEN not in a and "research" not in a for a in cmd)
    assert "insecure" in cmd[cmd.index("--options-json") + 1]  # not a secret: it travels with the rest
    assert KEY not in opts.model_dump_json() and KEY not in repr(opts)
    env = opts.credentials().to_env()
    assert set(env) == {SECRETS_ENV}
    # The Locust child: its parser sees none of them; the environment brings them back.
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    ns = parser.parse_args(cmd[cmd.index("--only-summary") + 1 :])
    back = secrets_from_env(env)
    assert back["api_key"] == KEY and back["admin_token"] == TOKEN
    monkeypatch.setenv(SECRETS_ENV, env[SECRETS_ENV])
    ns_opts = LoadOptions.from_namespace(ns)
    assert ns_opts.insecure and ns_opts.corpus == Path("fixtures")
    c = ns_opts.credentials()
    assert c.request_headers() == {"X-Org": "research", "Authorization": f"Bearer {KEY}"}
    assert c.insecure


def test_from_namespace_takes_openai_api_key_and_the_launchers_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    assert LoadOptions.from_namespace(parser.parse_args([])).credentials().api_key == KEY
    monkeypatch.setenv(SECRETS_ENV, '{"api_key": "from-launcher", "header": ["X-A: 1"]}')
    c = LoadOptions.from_namespace(parser.parse_args(["--header", "X-B: 2"])).credentials()
    assert c.api_key == "from-launcher"
    assert c.headers == (("X-B", "2"),)  # the command line wins over the launcher's
    monkeypatch.setenv(SECRETS_ENV, "{not json")
    with pytest.raises(ConfigError, match="not JSON"):
        LoadOptions.from_namespace(parser.parse_args([]))


def test_a_bad_header_option_names_the_option_not_the_value() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    with pytest.raises(ConfigError) as err:
        LoadOptions.from_namespace(parser.parse_args(["--header", "no colon sk-secret"]))
    assert err.value.field == "--header"
    assert "sk-secret" not in str(err.value)
