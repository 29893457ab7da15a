"""An agent's conversations replayed against real vLLM: tools offered, tool calls and results in the
history, the agent loop carried on whatever the model answers.

vLLM accepts ``tool_choice: "auto"`` only when started with ``--enable-auto-tool-choice`` and a
``--tool-call-parser`` (``bench/vllm.sh serve --enable-auto-tool-choice --tool-call-parser hermes``);
the test skips saying so otherwise. The model the ``vllm`` tests serve on CPU, SmolLM2-135M-Instruct,
has no tool-call syntax in its chat template (docs/load.md, *Reasoning and tool calls*): it answers
in words, so the claim here is the traffic's (0 errors, every tool turn's results sent, the log's
calls carried where the model made none), not the model's tool use. Run with ``HARNESS_VLLM_URL``
(tests/vllm/conftest.py); skipped elsewhere.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from harness.common.settings import load_settings
from harness.corpus.sessions import SessionBuildInputs, build_sessions
from harness.corpus.settings import CorpusSettings
from harness.corpus.timing import ThinkTime
from harness.load.results import read_records
from harness.load.run_summary import read_summary
from harness.load.runner import LoadSpec, run_locust
from tests.vllm.conftest import VLLM_MODEL_NAME

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
LOG = Path(__file__).resolve().parents[2] / "fixtures" / "corpus" / "agent_sessions.jsonl"
TOOL_TURNS = 5
"""Turns of the fixture's conversations opened by tool results."""


def test_an_agents_sessions_replay_against_vllm_with_auto_tool_choice(vllm_url: str, tmp_path: Path) -> None:
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    probe = {
        "model": VLLM_MODEL_NAME, "max_tokens": 4, "tool_choice": "auto", "tools": [tool],
        "messages": [{"role": "user", "content": "weather in Paris?"}],
    }  # fmt: skip
    r = httpx.post(vllm_url + "/v1/chat/completions", json=probe, timeout=120)
    if r.status_code == 400 and "auto-tool-choice" in r.text.replace("_", "-"):
        pytest.skip(
            "vLLM was started without --enable-auto-tool-choice --tool-call-parser hermes: " + r.text[:200]
        )
    assert r.status_code == 200, r.text
    corpus = tmp_path / "corpus"
    build_sessions(
        SessionBuildInputs(out=corpus, logs=[LOG], think_time=ThinkTime.parse("constant:0.05")),
        load_settings(CorpusSettings, seed=2),
    )
    spec = LoadSpec(host=vllm_url, corpus=corpus, rate=2, duration=2, results_dir=tmp_path / "r",
                    start_delay=2.0, concurrency=4, max_tokens_cap=16, model=VLLM_MODEL_NAME)  # fmt: skip
    assert run_locust(spec, timeout_s=600) == 0
    s = read_summary(tmp_path / "r")
    recs = list(read_records(tmp_path / "r"))
    assert s.errors == 0 and s.requests == 12, [r.error for r in recs if r.error]
    # Every turn a tool result opened sent results: the log's for the model's own call, a stated
    # synthetic one for another call, or the log's call carried where the model answered in words.
    assert sum(sum((r.tool_results or {}).values()) for r in recs) >= TOOL_TURNS
    assert all(r.ttft_ms is not None and r.ttfa_ms is not None for r in recs if r.completion_tokens)
