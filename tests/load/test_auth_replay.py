"""The load stage against an authenticated target (``harness serve --api-key --admin-token``, the
vLLM-style ``Authorization: Bearer`` check): refused without the key, served with it, and the key,
the admin token and the extra headers' values in none of the files the run leaves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.common.auth import SERVER_ADMIN_TOKEN_ENV, SERVER_API_KEY_ENV
from harness.load.results import read_records
from harness.load.run_summary import read_summary
from harness.load.runner import LoadSpec, run_locust
from harness.target.server.launch import running_server
from tests.load.helpers import make_corpus

pytestmark = pytest.mark.slow

KEY = "sk-replay-8c1d0e5f"
TOKEN = "adm-replay-31b7aa"
HEADER_VALUE = "org-secret-77"


def test_replay_with_a_key_succeeds_and_leaves_no_secret_behind(tmp_path: Path) -> None:
    corpus = make_corpus(tmp_path / "chat.jsonl", 4)
    preload = tmp_path / "preload.jsonl"
    preload.write_text(
        json.dumps({"prompt": "planted", "max_tokens": 4, "temperature": 0, "completion": " ok"}) + "\n"
    )
    env = {SERVER_API_KEY_ENV: KEY, SERVER_ADMIN_TOKEN_ENV: TOKEN}
    common = {"corpus": corpus, "rate": 4, "duration": 1, "max_tokens_cap": 4, "start_delay": 0.5}
    with running_server(["--preset", "tiny", "--cache"], log_dir=tmp_path / "server", env=env) as server:
        # No key: every request is refused (401), and the run says so (exit 1: requests failed).
        assert (
            run_locust(LoadSpec(host=server.url, results_dir=tmp_path / "anon", **common), timeout_s=300) == 1
        )
        # The key on the OpenAI routes, the admin token on the preload, an extra header on both.
        keyed = LoadSpec(
            host=server.url, results_dir=tmp_path / "keyed", api_key=KEY, admin_token=TOKEN,
            header=(f"X-Org: {HEADER_VALUE}",), preload=preload, **common,
        )  # fmt: skip
        assert run_locust(keyed, timeout_s=300) == 0
        # The key alone cannot preload: the admin routes want the admin token (exit 3, the file named).
        no_admin = LoadSpec(host=server.url, results_dir=tmp_path / "no-admin", api_key=KEY, preload=preload,
                            **common)  # fmt: skip
        assert run_locust(no_admin, timeout_s=300) == 3
    anon = list(read_records(tmp_path / "anon"))
    assert len(anon) == 4 and all(r.status == 401 and r.error for r in anon)
    s = read_summary(tmp_path / "keyed")
    assert s.requests == 4 and s.errors == 0, [r.error for r in read_records(tmp_path / "keyed")]
    assert s.preload is not None and s.preload["stored"] == 1
    assert s.target.identity is not None  # GET /v1/models went with the key too
    assert "admin-token" in (tmp_path / "no-admin" / "locust.log").read_text()
    leaked = [
        (str(p), secret)
        for p in tmp_path.rglob("*")
        if p.is_file()
        for secret in (KEY, TOKEN, HEADER_VALUE)
        if secret in p.read_text(errors="replace")
    ]
    assert leaked == []
