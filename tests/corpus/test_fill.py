"""Prompt lengths from real content: material order, filler only after the instructions, the demo recipe."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from harness.corpus.build import BuildInputs, build_corpus
from harness.corpus.model import read_corpus
from harness.corpus.settings import CorpusSettings

from .conftest import FIXTURES, TEMPLATES

pytestmark = pytest.mark.slow

INSTRUCTION = re.compile(r"^(You are |你是)")


def _settings(**kw: object) -> CorpusSettings:
    return CorpusSettings(**{"seed": 5, "embed_cache": False, "device": "cpu", **kw})  # type: ignore[arg-type]


def _filler_words() -> set[str]:
    from faker.providers.lorem.en_US import Provider

    return {w for w in Provider.word_list if w.isalpha()}


def test_filler_only_after_the_instructions_when_material_runs_out(tmp_path: Path) -> None:
    """A template that shows none of the material (no dialogue, reference or shots): targets can
    only be reached with filler, which must come after the instruction line, be counted and warned."""
    bare = tmp_path / "bare.j2"
    instructions = {
        "zh": "你是客服助手，请回答用户的请求。",
        "en": "You are a customer assistant. Answer the request.",
    }
    bare.write_text(
        f'{{% if lang == "zh" %}}{instructions["zh"]}{{% else %}}{instructions["en"]}{{% endif %}}\n\n'
        "{{ query }}\n"
    )
    res = build_corpus(
        BuildInputs(template=bare, out=tmp_path / "c", n=10, scenarios=FIXTURES / "scenarios.json"),
        _settings(),
    )
    words = _filler_words()
    padded = [r for r in res.records if r.provenance.fitted == "padded"]
    assert padded, "the scenario targets (300+ tokens) exceed what the bare template renders"
    for r in padded:
        text = r.text()
        first, _, rest = text.partition("\n\n")
        assert first == instructions[r.lang]  # the instructions come first, nothing in front of them ...
        filler_run = rest.split("\n")[0].split()
        assert filler_run and set(filler_run) <= words  # ... and the filler right after them
        assert rest.rstrip().endswith(r.variables.query if r.variables else "?")
        assert r.provenance.fill is not None and r.provenance.fill.filler > 0
        assert r.prompt_tokens == r.target_input_tokens
    share = res.metrics["filler_token_share"]
    total = sum(r.prompt_tokens or 0 for r in res.records)
    assert share == pytest.approx(sum(r.provenance.fill.filler for r in padded if r.provenance.fill) / total)
    assert share is not None and share > 0.5
    assert res.warnings and "filler" in res.warnings[0]
    assert json.loads((tmp_path / "c" / "quality.json").read_text())["warnings"] == res.warnings


def test_material_in_order_and_records_name_their_shots(tmp_path: Path) -> None:
    """With the bundled template, scenario targets are reached from the dialogue so far, catalogue
    entries and pool shots, in that order, without filler."""
    res = build_corpus(
        BuildInputs(
            template=TEMPLATES / "four_section.j2",
            out=tmp_path / "c",
            n=16,
            scenarios=FIXTURES / "scenarios.json",
        ),
        _settings(max_input_tokens=600),
    )
    assert res.metrics["filler_token_share"] == 0.0 and not res.warnings
    filled = [r for r in res.records if r.provenance.fitted == "filled"]
    assert filled
    pool = {e["id"]: e["text"] for e in res.manifest.fewshot["entries"]}  # type: ignore[union-attr]
    for r in filled:
        fill = r.provenance.fill
        assert fill is not None and r.prompt_tokens == r.target_input_tokens
        assert INSTRUCTION.match(r.text())
        if r.lang == "en":  # no dialogue, no catalogue with content: shots only
            assert fill.history == fill.catalog == 0 and fill.fewshot > 0
        elif fill.catalog > 0:  # the whole dialogue so far came first
            assert "参考资料" in r.text()
        # Every shot the prompt names is shown (the last added may be cut at a token boundary).
        shown = [pool[i] for i in r.variables.fewshot_ids] if r.variables else []
        assert sum(t in r.text() for t in shown) >= len(shown) - 1


def test_demo_and_ci_recipe_need_no_filler(tmp_path: Path) -> None:
    from harness.cli import main
    from harness.demo import TRACE, corpus_build_args

    cold = tmp_path / "cold.jsonl"
    for args in (
        ["traces", "coldpaths", str(TRACE), "--hops", "all", "--protocol", "any", "--cache-scope", "hop",
         "-o", str(cold)],
        ["traces", "scenarios", str(cold), "--k", "12", "-o", str(tmp_path / "scenarios.json")],
        corpus_build_args(tmp_path, 60),
    ):  # fmt: skip
        with pytest.raises(SystemExit) as done:
            main(args)
        assert done.value.code == 0
    quality = json.loads((tmp_path / "corpus" / "quality.json").read_text())
    assert quality["metrics"]["filler_token_share"] == 0.0 and quality["warnings"] == []
    records = list(read_corpus(tmp_path / "corpus"))
    fitted = [r for r in records if r.target_input_tokens is not None]
    assert fitted and all(r.prompt_tokens == r.target_input_tokens for r in fitted)
    assert all(INSTRUCTION.match(r.text()) for r in records)
