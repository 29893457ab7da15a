"""Authenticated ``harness serve``, tested as an attacker would (issue #21).

Two real servers (subprocesses, as in the other HTTP tests):

* ``keyed``: ``--cache --api-keys FILE`` (tenants ``alice`` and ``victim``) with the admin token
  handed through the environment (``HARNESS__SERVER__ADMIN_TOKEN``, never argv), per-request logging
  on, and a small preload limit;
* ``single``: no cache, one ``HARNESS__SERVER__API_KEY``, no admin token, ``--protect-metrics``.

The attacks: planting an answer without the admin token, with a tenant's key, for another tenant
through ``X-Tenant-ID`` spoofing, with an oversized or malformed preload; flushing and resetting
without the token; wrong tokens and schemes. Each refusal is followed by a check that the attack had
no effect (the victim's next request is not a hit with the planted text), and each protected route
also has its positive control (the right credential works), so no test passes on a route that
refuses everyone. Secrets are searched for in every error body, ``/v1/models``, ``/health``, the
ready file and the server's log.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import orjson
import pytest

from harness.common.errors import ConfigError, ExitCode
from harness.common.openai import CompletionResponse, ErrorResponse
from harness.target.server import cli
from harness.target.server.auth import AuthPolicy, bearer, check_protected_mode, is_loopback, load_api_keys
from harness.target.server.errors import APIError
from harness.target.server.settings import ServerSettings
from tests.server.conftest import ServerProc, harness_server

ALICE = "sk-alice-3b1f0c9e7d"
VICTIM = "sk-victim-8a2e4d6f10"
ADMIN = "adm-5c7e9a1b3d"
SINGLE = "sk-single-0f9e8d7c6b"
SECRETS = (ALICE, VICTIM, ADMIN, SINGLE)
PRELOAD_LIMIT = 4096

POISON_PROMPT = "What is our refund policy?"
POISON = " Send your card number to evil.example"


def auth(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def assert_no_secret(text: str) -> None:
    for secret in SECRETS:
        assert secret not in text


def complete(url: str, prompt: str, headers: dict[str, str]) -> httpx.Response:
    body = {"prompt": prompt, "max_tokens": 6, "temperature": 0}
    return httpx.post(url + "/v1/completions", json=body, headers=headers, timeout=60)


def text_of(r: httpx.Response) -> str:
    assert r.status_code == 200, r.text
    return CompletionResponse.model_validate(r.json()).choices[0].text


def refused(r: httpx.Response, status: int, code: str) -> ErrorResponse:
    """An OpenAI-shaped refusal with this status and code, that echoes no secret."""
    assert r.status_code == status, r.text
    err = ErrorResponse.model_validate(r.json())
    assert err.error.code == code
    assert err.error.type == "invalid_request_error" and err.error.param is None
    if status == 401:
        assert r.headers["WWW-Authenticate"] == "Bearer"
    assert_no_secret(r.text)
    return err


def preload_line(prompt: str, completion: str, **extra: str) -> bytes:
    line = {"prompt": prompt, "max_tokens": 6, "temperature": 0, "completion": completion, **extra}
    return orjson.dumps(line) + b"\n"


@pytest.fixture(scope="module")
def keyed(tmp_path_factory) -> ServerProc:
    log_dir = tmp_path_factory.mktemp("serve-keyed")
    keys = log_dir / "keys.json"
    keys.write_text(orjson.dumps({ALICE: "alice", VICTIM: "victim"}).decode())
    env = {
        "HARNESS__SERVER__ADMIN_TOKEN": ADMIN,
        "HARNESS__SERVER__LOG_REQUESTS": "true",
        "HARNESS__SERVER__MAX_PRELOAD_BYTES": str(PRELOAD_LIMIT),
    }
    with harness_server(log_dir, "--cache", "--api-keys", str(keys), env=env) as srv:
        yield srv


@pytest.fixture(scope="module")
def single(tmp_path_factory) -> ServerProc:
    env = {"HARNESS__SERVER__API_KEY": SINGLE}
    with harness_server(tmp_path_factory.mktemp("serve-single"), "--protect-metrics", env=env) as srv:
        yield srv


# ---------------------------------------------------------------- the issue's poisoning, refused


@pytest.mark.slow
def test_the_issues_poisoning_sequence_is_refused(keyed):
    """Issue #21's two requests: a preload for tenant ``victim`` with no credentials answered
    ``stored: 1`` and the victim's next request was ``HIT-L1`` with the planted text."""
    planted = httpx.post(
        keyed.url + "/cache/preload",
        content=preload_line(POISON_PROMPT, POISON),
        headers={"X-Tenant-ID": "victim"},
        timeout=60,
    )
    refused(planted, 401, "missing_admin_token")
    # With a valid tenant key, for that same tenant's own cache: still not the admin.
    with_key = httpx.post(
        keyed.url + "/cache/preload", content=preload_line(POISON_PROMPT, POISON), headers=auth(VICTIM)
    )
    refused(with_key, 401, "invalid_admin_token")
    # The line's tenant field is no way around it either.
    with_field = httpx.post(
        keyed.url + "/cache/preload",
        content=preload_line(POISON_PROMPT, POISON, tenant="victim"),
        headers=auth(ALICE),
    )
    refused(with_field, 401, "invalid_admin_token")
    victim = complete(keyed.url, POISON_PROMPT, auth(VICTIM))
    assert victim.headers["x-cache"] == "MISS"
    assert POISON not in text_of(victim)


@pytest.mark.slow
def test_another_tenants_key_cannot_reach_the_victims_cache(keyed):
    prompt = "Where do I send my invoices?"
    # Spoofing the tenant with a valid key: refused before anything is cached or generated.
    spoofed = complete(keyed.url, prompt, auth(ALICE) | {"X-Tenant-ID": "victim"})
    err = refused(spoofed, 403, "tenant_mismatch")
    assert "victim" in err.error.message
    # Alice's own request for the prompt is cached under alice (from her key), not under the header.
    assert complete(keyed.url, prompt, auth(ALICE)).headers["x-cache"] == "MISS"
    assert complete(keyed.url, prompt, auth(ALICE)).headers["x-cache"].startswith("HIT-")
    # The victim never sees alice's entry: another key, another tenant.
    assert complete(keyed.url, prompt, auth(VICTIM)).headers["x-cache"] == "MISS"
    # The header naming the key's own tenant is accepted.
    assert complete(keyed.url, prompt, auth(VICTIM) | {"X-Tenant-ID": "victim"}).status_code == 200


@pytest.mark.slow
def test_the_admin_may_plant_for_a_tenant(keyed):
    """The positive control of the refusals above: with the admin token a preload stores answers,
    for the tenant a line names (honoured for the admin only) or the header's, and they are hit."""
    prompt_a, prompt_v = "admin planted for alice", "admin planted for victim"
    body = preload_line(prompt_a, " from the admin", tenant="alice") + preload_line(prompt_v, " also admin")
    r = httpx.post(
        keyed.url + "/cache/preload",
        content=body,
        headers=auth(ADMIN) | {"X-Tenant-ID": "victim"},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    assert r.json()["stored"] == 2
    hit = complete(keyed.url, prompt_a, auth(ALICE))
    assert hit.headers["x-cache"].startswith("HIT-") and text_of(hit) == " from the admin"
    assert complete(keyed.url, prompt_a, auth(VICTIM)).headers["x-cache"] == "MISS"
    hit = complete(keyed.url, prompt_v, auth(VICTIM))
    assert hit.headers["x-cache"].startswith("HIT-") and text_of(hit) == " also admin"


@pytest.mark.slow
def test_oversized_and_malformed_preloads_store_nothing(keyed):
    prompt = "oversized preload prompt"
    big = preload_line(prompt, "x" * PRELOAD_LIMIT)
    # Without the token the size does not matter: 401 before the body is read.
    refused(
        httpx.post(keyed.url + "/cache/preload", content=big, headers={"X-Tenant-ID": "victim"}),
        401,
        "missing_admin_token",
    )
    r = httpx.post(keyed.url + "/cache/preload", content=big, headers=auth(ADMIN) | {"X-Tenant-ID": "victim"})
    assert r.status_code == 413 and ErrorResponse.model_validate(r.json()).error.code == "request_too_large"
    # A valid first line followed by a malformed one: one 400, and not even the first line is stored.
    malformed = preload_line("malformed preload prompt", POISON) + b'{"prompt": "x", "completion": \n'
    r = httpx.post(
        keyed.url + "/cache/preload", content=malformed, headers=auth(ADMIN) | {"X-Tenant-ID": "victim"}
    )
    assert r.status_code == 400 and "line 2" in r.text
    for p in (prompt, "malformed preload prompt"):
        victim = complete(keyed.url, p, auth(VICTIM))
        assert victim.headers["x-cache"] == "MISS" and POISON not in text_of(victim)


# ---------------------------------------------------------------- /v1 credentials


@pytest.mark.slow
@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer"},
        {"Authorization": "Bearer sk-alice-3b1f0c9e7"},  # a prefix of a real key
        {"Authorization": f"Basic {ALICE}"},  # the right key in the wrong scheme
        {"Authorization": ALICE},  # no scheme at all
        {"Authorization": f"Token {ALICE}"},
        {"X-Api-Key": ALICE},  # not where keys go
        {"Authorization": f"Bearer {ADMIN}"},  # the admin token is not an API key
    ],
)
def test_v1_needs_a_valid_bearer_key(keyed, headers):
    code = "invalid_api_key"
    refused(complete(keyed.url, "who am i", headers), 401, code)
    refused(httpx.get(keyed.url + "/v1/models", headers=headers), 401, code)
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    refused(httpx.post(keyed.url + "/v1/chat/completions", json=chat, headers=headers), 401, code)
    refused(httpx.post(keyed.url + "/echo", json=chat, headers=headers), 401, code)  # the floor opens nothing


def test_echo_answers_a_valid_key(keyed):
    body = {"messages": [{"role": "user", "content": "hi"}]}
    r = httpx.post(keyed.url + "/echo", json=body, headers=auth(ALICE))
    assert r.status_code == 200 and r.json() == body


@pytest.mark.slow
def test_keys_and_tokens_leak_nowhere(keyed):
    ok = complete(keyed.url, "a logged request", auth(ALICE) | {"X-Tenant-ID": "alice"})
    assert ok.status_code == 200
    complete(keyed.url, "a refused request", {"Authorization": f"Bearer {ALICE}x"})
    models = httpx.get(keyed.url + "/v1/models", headers=auth(ALICE))
    assert models.status_code == 200
    assert_no_secret(models.text)
    health = httpx.get(keyed.url + "/health")  # always open
    assert health.status_code == 200
    assert_no_secret(health.text)
    assert_no_secret(keyed.info.model_dump_json())
    assert_no_secret((keyed.log_dir / "ready.json").read_text())
    assert_no_secret((keyed.log_dir / "server.log").read_text())


@pytest.mark.slow
async def test_no_secret_in_the_request_log_or_errors(tmp_path: Path, caplog) -> None:
    """The per-request log line (on here), warnings and refusals, in-process so caplog sees every
    record at INFO: the tenant is logged, never a key or the token."""
    from harness.target.engine.factory import create_engine
    from harness.target.engine.settings import EngineSettings
    from harness.target.server.app import create_app

    keys = tmp_path / "keys.json"
    keys.write_text(orjson.dumps({ALICE: "alice"}).decode())
    settings = ServerSettings(api_keys_file=keys, admin_token=ADMIN, log_requests=True, warmup=False)
    app = create_app(create_engine(EngineSettings(preset="tiny", device="cpu")), settings=settings)
    caplog.set_level("DEBUG")
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://t") as c,
    ):
        body = {"prompt": "logged", "max_tokens": 2, "temperature": 0}
        ok = await c.post("/v1/completions", json=body, headers=auth(ALICE))
        assert ok.status_code == 200, ok.text
        for headers in (auth(ALICE + "x"), auth(ADMIN), auth(ALICE) | {"X-Tenant-ID": "victim"}):
            r = await c.post("/v1/completions", json=body, headers=headers)
            assert r.status_code in (401, 403)
            assert_no_secret(r.text + str(r.headers))
        r = await c.post("/reset_prefix_cache", headers=auth(ALICE))
        assert r.status_code == 401
        assert_no_secret(r.text)
        assert (await c.post("/reset_prefix_cache", headers=auth(ADMIN))).status_code == 200
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "tenant=alice" in logged  # the request log line is there, naming the tenant …
    assert "status=401" in logged and "status=403" in logged  # … refusals included …
    assert_no_secret(logged)  # … and no key or token anywhere


# ---------------------------------------------------------------- the admin API


ADMIN_ROUTES = [
    ("POST", "/cache/flush"),
    ("POST", "/reset_prefix_cache"),
    ("GET", "/cache/stats"),
    ("POST", "/cache/drain?timeout_s=1"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("method", "path"), ADMIN_ROUTES)
def test_admin_routes_need_the_admin_token(keyed, method, path):
    url = keyed.url + path
    refused(httpx.request(method, url), 401, "missing_admin_token")
    refused(httpx.request(method, url, headers=auth(ADMIN + "x")), 401, "invalid_admin_token")
    refused(httpx.request(method, url, headers=auth(ALICE)), 401, "invalid_admin_token")
    refused(
        httpx.request(method, url, headers={"Authorization": f"Basic {ADMIN}"}), 401, "missing_admin_token"
    )
    assert httpx.request(method, url, headers=auth(ADMIN), timeout=60).status_code == 200


@pytest.mark.slow
def test_a_flush_without_the_token_drops_nothing(keyed):
    prompt = "survives an anonymous flush"
    assert complete(keyed.url, prompt, auth(VICTIM)).headers["x-cache"] == "MISS"
    refused(httpx.post(keyed.url + "/cache/flush", params={"tier": "all"}), 401, "missing_admin_token")
    assert complete(keyed.url, prompt, auth(VICTIM)).headers["x-cache"].startswith("HIT-")


@pytest.mark.slow
def test_metrics_open_by_default(keyed):
    assert httpx.get(keyed.url + "/metrics").status_code == 200


@pytest.mark.slow
def test_keys_without_admin_token_close_the_admin_api(single):
    for method, path in (("POST", "/reset_prefix_cache"), ("GET", "/cache/stats"), ("POST", "/cache/flush")):
        for headers in ({}, auth(SINGLE)):
            err = refused(httpx.request(method, single.url + path, headers=headers), 403, "admin_disabled")
            assert "--admin-token" in err.error.message


@pytest.mark.slow
def test_a_single_key_alone_is_the_operators_and_picks_the_tenant(single):
    # One principal (vLLM's --api-key): X-Tenant-ID partitions its own cache, as on an unkeyed server.
    assert text_of(complete(single.url, "single key", auth(SINGLE)))
    assert complete(single.url, "single key", auth(SINGLE) | {"X-Tenant-ID": "default"}).status_code == 200
    assert complete(single.url, "single key", auth(SINGLE) | {"X-Tenant-ID": "other"}).status_code == 200
    refused(complete(single.url, "single key", {}), 401, "invalid_api_key")
    refused(complete(single.url, "single key", {"X-Tenant-ID": "other"}), 401, "invalid_api_key")


def test_a_single_key_beside_a_key_file_is_the_default_tenant_only(tmp_path):
    path = tmp_path / "keys.json"
    path.write_text(orjson.dumps({ALICE: "alice"}).decode())
    policy = AuthPolicy.from_settings(ServerSettings(api_keys_file=path, api_key=SINGLE))
    assert not policy.operator_key
    assert policy.tenant({"authorization": f"Bearer {SINGLE}"}) == "default"
    with pytest.raises(APIError) as err:
        policy.tenant({"authorization": f"Bearer {SINGLE}", "X-Tenant-ID": "alice"})
    assert err.value.status == 403


@pytest.mark.slow
def test_protected_metrics_need_a_credential(single):
    refused(httpx.get(single.url + "/metrics"), 401, "invalid_api_key")
    refused(httpx.get(single.url + "/metrics", headers=auth(SINGLE + "x")), 401, "invalid_api_key")
    r = httpx.get(single.url + "/metrics", headers=auth(SINGLE))
    assert r.status_code == 200 and "harness_server" in r.text
    assert httpx.get(single.url + "/health").status_code == 200


# ---------------------------------------------------------------- configuration (no server)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "does not exist"),
        ("{not json", "not JSON"),
        (f'["{ALICE}"]', "JSON object"),
        ("{}", "no keys"),
        (f'{{"{ALICE}": "alice", "{ALICE}": "mallory"}}', "twice (entry 2)"),
        ('{"": "alice"}', "entry 1: the key is empty"),
        (f'{{"{ALICE}": ""}}', "entry 1: the tenant must be a non-empty string"),
        (f'{{"{ALICE}": 7}}', "entry 1: the tenant must be a non-empty string"),
        (f'{{"{ALICE}": "alice", "sk two": "bob"}}', "entry 2: the key contains whitespace"),
    ],
)
def test_a_bad_key_file_is_a_config_error_naming_file_and_field(tmp_path: Path, content, expected) -> None:
    path = tmp_path / "keys.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError) as info:
        load_api_keys(path)
    err = info.value
    assert expected in err.message
    assert err.file == str(path) and err.field is not None and "--api-keys" in err.field
    assert ALICE not in str(err)
    assert err.exit_code == ExitCode.CONFIG


def test_a_good_key_file_maps_keys_to_tenants(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    path.write_text(orjson.dumps({ALICE: "alice", VICTIM: "victim"}).decode())
    assert load_api_keys(path) == {ALICE: "alice", VICTIM: "victim"}
    policy = AuthPolicy.from_settings(ServerSettings(api_keys_file=path, api_key=SINGLE))
    assert policy.tenant(httpx.Headers(auth(ALICE))) == "alice"
    assert policy.tenant(httpx.Headers(auth(SINGLE))) == "default"  # --api-key and --api-keys combine
    assert policy.tenant(httpx.Headers({"authorization": f"bearer {VICTIM}"})) == "victim"  # any case


def test_credentials_that_cannot_work_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    path.write_text(orjson.dumps({ALICE: "alice"}).decode())
    with pytest.raises(ConfigError, match="also an API key"):
        AuthPolicy.from_settings(ServerSettings(api_keys_file=path, admin_token=ALICE))
    with pytest.raises(ConfigError, match="another tenant"):
        AuthPolicy.from_settings(ServerSettings(api_keys_file=path, api_key=ALICE))
    with pytest.raises(ConfigError, match="--protect-metrics needs"):
        AuthPolicy.from_settings(ServerSettings(protect_metrics=True))
    with pytest.raises(ConfigError, match="non-empty"):
        AuthPolicy.from_settings(ServerSettings(api_key=" "))
    token = tmp_path / "admin.txt"
    token.write_text(ADMIN + "\n")
    policy = AuthPolicy.from_settings(ServerSettings(admin_token_file=token))
    policy.require_admin(
        httpx.Headers(auth(ADMIN))
    )  # the trailing newline of the file is not part of the token
    with pytest.raises(ConfigError, match="not both"):
        AuthPolicy.from_settings(ServerSettings(admin_token_file=token, admin_token=ADMIN))


def test_secrets_are_redacted_in_settings(monkeypatch) -> None:
    monkeypatch.setenv("HARNESS__SERVER__API_KEY", SINGLE)
    monkeypatch.setenv("HARNESS__SERVER__ADMIN_TOKEN", ADMIN)
    s = ServerSettings()
    assert s.api_key is not None and s.api_key.get_secret_value() == SINGLE
    assert_no_secret(repr(s) + str(s) + s.model_dump_json())


def test_bearer_parsing() -> None:
    assert bearer({"authorization": "Bearer abc"}) == "abc"
    assert bearer({"authorization": "  BEARER   abc  "}) == "abc"
    for value in ("", "Bearer", "Bearer ", "Basic abc", "abc", "Bearerabc"):
        assert bearer({"authorization": value}) is None


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.1.2.3", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("LocalHost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.5", False),
        ("llm.example.internal", False),
        ("localhost.example.com", False),
    ],
)
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


# ---------------------------------------------------------------- protected mode


@pytest.fixture
def no_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """``prepare`` is all these tests run; a model load or a Redis start would be a failure."""
    import harness.target.engine.factory as engine_factory

    monkeypatch.setattr(engine_factory, "create_engine", lambda *a, **k: pytest.fail("a model was loaded"))
    monkeypatch.setenv("HARNESS__RUN_DIR", "/nonexistent/never-created")


def test_protected_mode_refuses_a_remote_bind_without_credentials(no_model, tmp_path: Path) -> None:
    keys = tmp_path / "keys.json"
    keys.write_text(orjson.dumps({ALICE: "alice"}).decode())
    for overrides in ({}, {"api_keys_file": keys}, {"admin_token": ADMIN}):
        with pytest.raises(ConfigError, match="protected mode") as info:
            cli.prepare({"preset": "tiny"}, {"host": "0.0.0.0", "port": 0, **overrides})
        assert info.value.exit_code == ExitCode.CONFIG and "--insecure-no-auth" in str(info.value)
        assert_no_secret(str(info.value))


@pytest.mark.parametrize("host", ["0.0.0.0", "::"])
def test_protected_mode_lets_credentials_or_insecure_through(
    no_model, tmp_path: Path, host: str, capsys
) -> None:
    keys = tmp_path / "keys.json"
    keys.write_text(orjson.dumps({ALICE: "alice"}).decode())
    plan = cli.prepare(
        {"preset": "tiny"}, {"host": host, "port": 0, "api_keys_file": keys, "admin_token": ADMIN}
    )
    plan.sock.close()
    assert "INSECURE" not in capsys.readouterr().err
    plan = cli.prepare({"preset": "tiny"}, {"host": host, "port": 0, "insecure_no_auth": True})
    plan.sock.close()
    assert plan.auth.open
    assert "INSECURE (--insecure-no-auth)" in capsys.readouterr().err
    # Loopback needs nothing: development stays as it was.
    cli.prepare({"preset": "tiny"}, {"host": "127.0.0.1", "port": 0}).sock.close()


def test_check_protected_mode_warning_names_what_is_open() -> None:
    s = ServerSettings(host="0.0.0.0", insecure_no_auth=True)
    warning = check_protected_mode(s, AuthPolicy.from_settings(s))
    assert warning is not None and "plant cached answers" in warning
    s = ServerSettings(host="0.0.0.0", insecure_no_auth=True, api_key=SINGLE)
    warning = check_protected_mode(s, AuthPolicy.from_settings(s))
    assert warning is not None and "admin API stays closed" in warning


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--bind", "0.0.0.0"], "protected mode"),
        (["--api-keys", "/no/such/keys.json"], "/no/such/keys.json"),
    ],
)
def test_cli_refuses_with_exit_4_before_loading(tmp_path: Path, args: list[str], expected: str) -> None:
    env = {**os.environ, "HARNESS__RUN_DIR": str(tmp_path / "run"), "HARNESS__SERVER__ADMIN_TOKEN": ADMIN}
    p = subprocess.run(
        [sys.executable, "-m", "harness.cli", "serve", "--preset", "tiny", "--port", "0", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert p.returncode == int(ExitCode.CONFIG), p.stderr
    assert expected in p.stderr and "Traceback" not in p.stderr
    assert "serving" not in p.stdout
    assert_no_secret(p.stdout + p.stderr)


@pytest.mark.slow
def test_harness_cache_needs_the_admin_token_and_never_prints_it(keyed):
    """The operator's client (`harness cache …`): refused without the token (exit 5, a hint naming
    --admin-token, no traceback), served with it from the environment; the token is in none of its
    output."""
    env = {k: v for k, v in os.environ.items() if k != "HARNESS_ADMIN_TOKEN"}

    def cache(*args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "harness.cli", "cache", *args, "--url", keyed.url]
        extra = {"HARNESS_ADMIN_TOKEN": token} if token else {}
        return subprocess.run(cmd, check=False, capture_output=True, text=True, env={**env, **extra})

    anon = cache("stats")
    assert anon.returncode == int(ExitCode.UNAVAILABLE), anon.stderr
    assert "--admin-token" in anon.stderr and "Traceback" not in anon.stderr
    wrong = cache("flush", "--admin-token", ADMIN + "x")
    assert wrong.returncode == int(ExitCode.UNAVAILABLE) and ADMIN not in wrong.stderr
    ok = cache("flush", token=ADMIN)
    assert ok.returncode == 0, ok.stderr
    assert '"dropped"' in ok.stdout and ADMIN not in ok.stdout + ok.stderr
