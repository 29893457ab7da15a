"""A replay without ``--model`` names the target's model: the OpenAI API requires ``model``, and a
server that enforces it answers 400 to a body without one.

The test SSE server (:mod:`tests.load.sse_server`) lists its models on ``GET /v1/models`` and answers
400 to a body without ``model``. The local process (or the master of a distributed run) asks for the
list once at test start and hands the first id to its workers; ``summary.json`` records which model
was sent and where it came from. A target without ``/v1/models`` gets no ``model``, as before.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.load.run_summary import read_summary
from harness.load.runner import LoadSpec, run_locust
from tests.load.sse_server import Behaviour, SSEServer

pytestmark = pytest.mark.slow
STRICT = Behaviour(first_token_s=0.005, gap_s=0.001, tokens=3, models=("served-model", "other"),
                   require_model=True)  # fmt: skip
COMMON = {"rate": 10, "duration": 1, "start_delay": 1.0, "concurrency": 4}


def log(run: Path) -> str:
    return (run / "locust.log").read_text()[-2000:]


def test_a_replay_without_model_names_the_targets_first_model(tmp_path: Path, corpus: Path) -> None:
    with SSEServer(STRICT) as srv:
        local = LoadSpec(host=srv.url, corpus=corpus, results_dir=tmp_path / "local", **COMMON)
        assert run_locust(local, timeout_s=180) == 0, log(tmp_path / "local")
        asked_local = srv.model_lists
        served_local = srv.requests
        # Two workers: the master asks once, and each worker's requests name what it was handed.
        spread = LoadSpec(host=srv.url, corpus=corpus, results_dir=tmp_path / "spread", processes=2, **COMMON)
        assert run_locust(spread, timeout_s=180) == 0, log(tmp_path / "spread")
        asked_spread = srv.model_lists - asked_local
        served_spread = srv.requests[len(served_local) :]
    for name, served, asked in (
        ("local", served_local, asked_local),
        ("spread", served_spread, asked_spread),
    ):
        s = read_summary(tmp_path / name)
        assert s.requests == 10 and s.errors == 0, name
        assert (s.target.model, s.target.model_source) == ("served-model", "target")
        assert s.target.identity is not None  # the same answer gave the identity
        assert len(served) == 10 and all(
            x.status == 200 and x.body["model"] == "served-model" for x in served
        )
        assert asked == 1, name
    assert {x.headers.get("X-Tenant-ID") for x in served_local} == {"acme", None}  # default: no header


def test_model_given_or_no_model_list(tmp_path: Path, corpus: Path) -> None:
    with SSEServer(STRICT) as srv:
        given = LoadSpec(host=srv.url, corpus=corpus, results_dir=tmp_path / "given", model="other", **COMMON)
        assert run_locust(given, timeout_s=180) == 0, log(tmp_path / "given")
        assert {x.body["model"] for x in srv.requests} == {"other"}
    s = read_summary(tmp_path / "given")
    assert (s.target.model, s.target.model_source, s.errors) == ("other", "option", 0)
    # No /v1/models (the stub answers 501): nothing named, as before.
    with SSEServer(Behaviour(first_token_s=0.005, gap_s=0.001, tokens=3)) as srv:
        bare = LoadSpec(host=srv.url, corpus=corpus, results_dir=tmp_path / "bare", **COMMON)
        assert run_locust(bare, timeout_s=180) == 0, log(tmp_path / "bare")
        assert all("model" not in x.body for x in srv.requests)
    s = read_summary(tmp_path / "bare")
    assert (s.target.model, s.target.model_source, s.errors) == (None, None, 0)
    doc = json.loads((tmp_path / "bare" / "summary.json").read_text())
    assert doc["target"]["model_source"] is None
