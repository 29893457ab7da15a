"""The target's one client (:class:`harness.load.target.TargetClient`) and every command that talks
to a keyed target through it.

A real ``harness serve --cache --api-keys FILE`` (tenants ``alice`` and ``bob``, the admin token
handed through the environment, as ``tests/server/test_auth.py`` starts one) is the keyed target:

* the client's calls with the right credentials, and without them an error that names the missing
  option and shows no secret;
* a tenant's key replays a corpus of default-tenant records with no error (a default-tenant record
  sends no ``X-Tenant-ID``); a record of another tenant is refused with the hint that says how
  tenants map to keys;
* ``harness cache stats``, ``harness analysis avalanche --url`` and ``harness analysis decay-sweep``
  get in with the admin token and fail with exit 5 and a hint without it.

The test SSE server (:mod:`tests.load.sse_server`) is the target without admin routes or model list.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from harness.common.auth import ADMIN_TOKEN_ENV, API_KEY_ENV, Credentials
from harness.common.errors import ExitCode, InputError, UnavailableError
from harness.corpus.model import CorpusRecord
from harness.load.arrivals import prepare_requests
from harness.load.client import TENANT_MISMATCH_HINT
from harness.load.results import read_records
from harness.load.run_summary import read_summary
from harness.load.runner import LoadSpec, run_locust
from harness.load.target import NotExposed, TargetClient
from harness.target.server.launch import ServerProcess
from tests.load.sse_server import Behaviour, SSEServer
from tests.server.conftest import harness_server

ROOT = Path(__file__).resolve().parents[2]
ALICE = "sk-alice-client-4e1d9b"
BOB = "sk-bob-client-70ac2f"
ADMIN = "adm-client-c93f1e5a"
SECRETS = (ALICE, BOB, ADMIN)
ALICE_ONLY = Credentials.of(api_key=ALICE)
OPERATOR = Credentials.of(api_key=ALICE, admin_token=ADMIN)
"""Alice's key on the OpenAI routes and the admin token on the admin routes."""


def write_corpus(path: Path, n: int, *, tenant: str = "default") -> Path:
    """``n`` greedy chat records of ``tenant``, every field written out as ``harness corpus build``
    writes it (``"tenant": "default"`` included)."""
    rows = []
    for i in range(n):
        rec = CorpusRecord.model_validate(
            {
                "id": f"r{i}", "tenant": tenant, "max_tokens": 4, "expected_output_tokens": 4, "lang": "en",
                "domain": "test", "intent": "test", "sampling": {"temperature": 0.0},
                "messages": [{"role": "user", "content": f"tenant question {i}"}],
                "provenance": {"seed": 0, "candidate": i, "template": "t", "template_sha256": "0" * 64},
            }
        )  # fmt: skip
        rows.append(rec.model_dump(mode="json", exclude_none=True))
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``harness ARGS`` in a subprocess, with no credentials in its environment but ``env``'s."""
    base = {k: v for k, v in os.environ.items() if k not in (API_KEY_ENV, ADMIN_TOKEN_ENV)}
    full = {**base, "PYTHONPATH": str(ROOT), "COLUMNS": "200", **(env or {})}
    cmd = [sys.executable, "-m", "harness.cli", *args]
    return subprocess.run(cmd, check=False, capture_output=True, text=True, env=full, timeout=600)


def assert_no_secret(*texts: str) -> None:
    for text in texts:
        for secret in SECRETS:
            assert secret not in text


# ---------------------------------------------------------------- a target without admin routes


def test_a_target_without_admin_routes_or_model_list() -> None:
    with SSEServer(Behaviour(metrics=True)) as srv:  # GET of anything but /metrics: 404
        client = TargetClient(srv.url + "/")
        assert client.url == srv.url
        assert client.first_model() is None  # no /v1/models: no model to name
        with pytest.raises(NotExposed) as exc:
            client.cache_stats()
        assert (
            exc.value.exit_code == ExitCode.UNAVAILABLE and "/cache/stats answered 404" in exc.value.message
        )
        with pytest.raises(NotExposed):
            client.cache_flush("all")
        assert "vllm:prefix_cache_hits_total" in client.metrics()
    with SSEServer(Behaviour(models=("m1", "m2"), require_model=True)) as srv:
        client = TargetClient(srv.url)
        assert [m["id"] for m in client.models()["data"]] == ["m1", "m2"]
        assert client.first_model() == "m1"
        # A body the target refuses (400) is the caller's input: exit 3 with the server's message.
        with pytest.raises(InputError, match="you must provide a model parameter"):
            client.complete("/v1/completions", {"prompt": "hi", "max_tokens": 2})
    gone = TargetClient("http://127.0.0.1:9", Credentials.of(admin_token=ADMIN))
    with pytest.raises(UnavailableError) as exc:
        gone.cache_stats()
    assert "cannot reach http://127.0.0.1:9/cache/stats" in exc.value.message and exc.value.hint
    assert_no_secret(str(exc.value))


# ---------------------------------------------------------------- a keyed multi-tenant target


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log_dir = tmp_path_factory.mktemp("serve-keyed-client")
    keys = log_dir / "keys.json"
    keys.write_text(json.dumps({ALICE: "alice", BOB: "bob"}))
    env = {"HARNESS__SERVER__ADMIN_TOKEN": ADMIN}
    with harness_server(log_dir, "--cache", "--api-keys", str(keys), env=env) as srv:
        yield srv


@pytest.mark.slow
def test_every_call_carries_the_credentials_and_says_which_is_missing(
    keyed: ServerProcess, tmp_path: Path
) -> None:
    anon = TargetClient(keyed.url)
    errors: list[str] = []
    for call, option in ((anon.models, "--api-key"), (anon.cache_stats, "--admin-token")):
        with pytest.raises(UnavailableError) as exc:
            call()
        assert exc.value.exit_code == ExitCode.UNAVAILABLE and option in (exc.value.hint or "")
        errors.append(str(exc.value))
    # A key is not the admin token: the admin routes still say which option is missing.
    with pytest.raises(UnavailableError) as exc:
        TargetClient(keyed.url, ALICE_ONLY).cache_flush("l1")
    assert "401" in exc.value.message and "--admin-token" in (exc.value.hint or "")
    errors.append(str(exc.value))

    client = TargetClient(keyed.url, OPERATOR)
    assert client.first_model() == keyed.model
    assert client.health()
    assert "# TYPE" in client.metrics()
    answer = client.complete("/v1/completions", {"model": keyed.model, "prompt": "client", "max_tokens": 3})
    assert answer["choices"][0]["text"]
    # Alice's key naming Bob's tenant: refused, with how a corpus's tenants map to keys.
    with pytest.raises(UnavailableError) as exc:
        client.complete("/v1/completions", {"prompt": "client", "max_tokens": 3}, tenant="bob")
    assert "403" in exc.value.message and "tenant_mismatch" in exc.value.message
    assert exc.value.hint == TENANT_MISMATCH_HINT
    errors.append(str(exc.value))

    preload = tmp_path / "preload.jsonl"
    preload.write_text(
        json.dumps({"prompt": "planted", "max_tokens": 3, "temperature": 0, "completion": " ok"})
    )
    assert client.cache_preload(preload, tenant="alice")["stored"] == 1
    assert client.cache_drain(30.0) == {"pending": 0}
    assert set(client.cache_stats()["tiers"]) == {"l1", "l2", "l3"}
    assert "l1" in client.cache_flush("l1")["dropped"]
    assert client.reset_prefix_cache() is not None
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"no_prompt": 1}\n')
    with pytest.raises(InputError) as bad_exc:
        client.cache_preload(bad)
    assert bad_exc.value.file == str(bad)
    # The probes: streamed as the load stage sends them, the key on each, the stage header set.
    reqs = prepare_requests(
        CorpusRecord.model_validate_json(x) for x in write_corpus(tmp_path / "c", 2).open()
    )
    probes = client.probe(reqs, no_cache=True, concurrency=2)
    assert [p.ok for p in probes] == [True, True] and all(p.cache == "BYPASS" for p in probes)
    assert all(p.ttft_ms is not None and p.prompt_tokens for p in probes)
    refused = TargetClient(keyed.url).probe(reqs[:1])
    assert refused[0].status == 401 and not refused[0].ok
    assert_no_secret(*errors, *(p.error or "" for p in refused))


@pytest.mark.slow
def test_a_tenant_key_replays_a_default_tenant_corpus(keyed: ServerProcess, tmp_path: Path) -> None:
    common = {"rate": 4, "duration": 1, "max_tokens_cap": 3, "start_delay": 0.5, "api_key": ALICE}
    default = LoadSpec(host=keyed.url, corpus=write_corpus(tmp_path / "default.jsonl", 4),
                       results_dir=tmp_path / "default", **common)  # fmt: skip
    assert run_locust(default, timeout_s=300) == 0, (tmp_path / "default" / "locust.log").read_text()[-2000:]
    s = read_summary(tmp_path / "default")
    assert s.requests == 4 and s.errors == 0
    assert [r.tenant for r in read_records(tmp_path / "default")] == ["default"] * 4
    # No --model: the target's first /v1/models id, asked with the key, named by every request.
    assert (s.target.model, s.target.model_source) == (keyed.model, "target")
    # Bob's records with Alice's key: each refused, the record saying how tenants map to keys.
    other = LoadSpec(host=keyed.url, corpus=write_corpus(tmp_path / "bob.jsonl", 2, tenant="bob"),
                     results_dir=tmp_path / "bob", **{**common, "duration": 0.5})  # fmt: skip
    assert run_locust(other, timeout_s=300) == 1
    recs = list(read_records(tmp_path / "bob"))
    assert len(recs) == 2 and all(r.status == 403 and "tenant_mismatch" in (r.error or "") for r in recs)
    assert all(TENANT_MISMATCH_HINT in (r.error or "") for r in recs)


@pytest.mark.slow
def test_cache_and_avalanche_commands_take_the_admin_token(keyed: ServerProcess) -> None:
    anon = cli("cache", "stats", "--url", keyed.url)
    assert anon.returncode == int(ExitCode.UNAVAILABLE), anon.stderr
    assert "--admin-token" in anon.stderr and "Traceback" not in anon.stderr
    ok = cli("cache", "stats", "--url", keyed.url, "--json", env={ADMIN_TOKEN_ENV: ADMIN})
    assert ok.returncode == 0, ok.stderr
    assert set(json.loads(ok.stdout)["tiers"]) == {"l1", "l2", "l3"}
    # The live-server path of the avalanche analysis: /cache/stats (admin) and /metrics.
    args = ("analysis", "avalanche", "--url", keyed.url, "--json")
    refused = cli(*args)
    assert refused.returncode == int(ExitCode.UNAVAILABLE), refused.stderr
    assert "--admin-token" in refused.stderr and "Traceback" not in refused.stderr
    report = cli(*args, "--admin-token", ADMIN)
    assert report.returncode == 0, report.stderr
    assert {c["name"] for c in json.loads(report.stdout)["classes"]} >= {"hot", "warm", "cold"}
    assert_no_secret(
        anon.stdout, anon.stderr, ok.stdout, ok.stderr, refused.stderr, report.stdout, report.stderr
    )


@pytest.mark.slow
def test_decay_sweep_preloads_with_the_admin_token(keyed: ServerProcess, tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "corpus.jsonl", 3)
    sweep = ("analysis", "decay-sweep", "--url", keyed.url, "--corpus", str(corpus), "--cmr", "0,0.5,1",
             "--duration", "2", "--settle", "0.5", "--concurrency", "2", "--max-tokens-cap", "3")  # fmt: skip
    without = cli(*sweep, "-o", str(tmp_path / "without"), env={API_KEY_ENV: ALICE})
    assert without.returncode == int(ExitCode.UNAVAILABLE), without.stderr
    assert "/cache/preload answered 401" in without.stderr and "--admin-token" in without.stderr
    assert not (tmp_path / "without" / "stages").exists()  # stopped before any stage
    out = tmp_path / "with"
    done = cli(*sweep, "-o", str(out), "--json", env={API_KEY_ENV: ALICE, ADMIN_TOKEN_ENV: ADMIN})
    assert done.returncode == 0, done.stderr
    fit = json.loads((out / "fit.json").read_text())
    assert fit["preload"]["stored"] == 3 and len(fit["stages"]) == 3
    assert all(st["errors"] == 0 and st["completed"] > 0 for st in fit["stages"]), fit["stages"]
    # Every stage's requests went with the key and named the target's model.
    for st in fit["stages"]:
        assert read_summary(st["run"]).target.model == keyed.model
    files = [p.read_text(errors="replace") for p in out.rglob("*") if p.is_file() and p.suffix != ".png"]
    assert_no_secret(without.stdout, without.stderr, done.stdout, done.stderr, *files)
