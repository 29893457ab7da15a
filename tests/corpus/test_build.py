"""End-to-end builds: determinism, trace replay with shared prefixes, messages, CLI exit codes."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from harness.corpus.build import BuildInputs, build_corpus
from harness.corpus.model import read_corpus
from harness.corpus.settings import CorpusSettings
from harness.corpus.tokens import default_tokenizer_path

from .conftest import FIXTURES, TEMPLATES

pytestmark = pytest.mark.slow


def _settings(**kw: object) -> CorpusSettings:
    return CorpusSettings(**{"seed": 7, "embed_cache": False, "device": "cpu", **kw})  # type: ignore[arg-type]


def test_same_seed_same_corpus_and_records_validate(tmp_path: Path) -> None:
    common = dict(template=TEMPLATES / "four_section.j2", n=30, fewshot=[FIXTURES / "fewshot_log.jsonl"])
    a = build_corpus(BuildInputs(out=tmp_path / "a", **common), _settings())  # type: ignore[arg-type]
    b = build_corpus(BuildInputs(out=tmp_path / "b", **common), _settings())  # type: ignore[arg-type]
    c = build_corpus(BuildInputs(out=tmp_path / "c", **common), _settings(seed=8))  # type: ignore[arg-type]
    # Without the few-shot pool cache (b and a read or wrote it): the same corpus and pool.
    d = build_corpus(BuildInputs(out=tmp_path / "d", **common), _settings(pool_cache=False))  # type: ignore[arg-type]
    raw_a = (tmp_path / "a" / "corpus.jsonl").read_bytes()
    assert (
        raw_a
        == (tmp_path / "b" / "corpus.jsonl").read_bytes()
        == (tmp_path / "d" / "corpus.jsonl").read_bytes()
    )
    assert a.manifest.fewshot == b.manifest.fewshot == d.manifest.fewshot
    assert raw_a != (tmp_path / "c" / "corpus.jsonl").read_bytes()
    records = list(read_corpus(tmp_path / "a"))
    assert len(records) == 30 == len(a.records)
    assert len({r.id for r in records}) == 30
    assert {r.lang for r in records} == {"en", "zh"}
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert manifest["seed"] == 7 and manifest["counts"]["records"] == 30
    assert manifest["counts"]["candidates"] == a.candidates >= 30
    quality = json.loads((tmp_path / "a" / "quality.json").read_text())
    assert quality["metrics"]["dup_rate_after"] == 0.0
    # Every record names the few-shot lines it shows, and they are in its prompt.
    log = {
        json.loads(line)["id"]: json.loads(line)["text"] for line in (FIXTURES / "fewshot_log.jsonl").open()
    }
    for r in records:
        assert r.variables is not None and r.prompt is not None
        for fid in r.variables.fewshot_ids:
            assert log[fid] in r.prompt
    del b, c


def test_trace_replay_fits_lengths_and_shares_prefixes(tmp_path: Path) -> None:
    trace = FIXTURES / "mooncake_sample.jsonl"
    rows = [json.loads(line) for line in trace.open()][:16]
    res = build_corpus(
        BuildInputs(template=TEMPLATES / "four_section.j2", out=tmp_path / "t", n=16, trace=trace),
        _settings(),
    )
    records = list(read_corpus(tmp_path / "t"))
    ref = Tokenizer.from_file(str(default_tokenizer_path()))
    ref.no_truncation()
    ref.no_padding()
    ids = [ref.encode(r.text(), add_special_tokens=False).ids for r in records]
    t0 = rows[0]["timestamp"]
    counts = Counter(h for row in rows for h in set(row["hash_ids"]))
    checked = 0
    for r, row, toks in zip(records, rows, ids, strict=True):
        assert len(toks) == row["input_length"] == r.prompt_tokens
        assert r.expected_output_tokens == row["output_length"]
        assert r.arrival_offset_s == pytest.approx((row["timestamp"] - t0) / 1000)
    # Independently from the raw file: leading ids shared by two requests ⇒ that many shared tokens.
    for i in range(len(rows)):
        for j in range(i + 1, len(rows)):
            hi, hj = rows[i]["hash_ids"], rows[j]["hash_ids"]
            lead = 0
            while lead < min(len(hi), len(hj)) and hi[lead] == hj[lead] and counts[hi[lead]] >= 2:
                lead += 1
            want = min(
                lead * 512,
                (rows[i]["input_length"] - 32) // 512 * 512,
                (rows[j]["input_length"] - 32) // 512 * 512,
            )
            if want <= 0:
                continue
            assert ids[i][:want] == ids[j][:want]
            checked += 1
    assert checked >= 4  # the first 16 sample rows hold 4 pairs sharing a leading block
    sharing = sum(1 for row in rows if counts[row["hash_ids"][0]] >= 2 and row["input_length"] - 32 >= 512)
    assert sharing >= 4
    assert sum(1 for r in records if r.prefix_group) == sharing
    assert res.manifest.counts["fitted_exact"] == 16
    # Shared runs are real context behind a shared system instruction; every prompt opens with
    # instructions (never filler), and these lengths were reached without filler words.
    from harness.corpus.tokens import SHARED_PREAMBLE

    for r in records:
        assert (
            r.text().startswith("\n" + SHARED_PREAMBLE)
            if r.prefix_group
            else r.text().startswith(("You are", "你是"))
        )
    # Filler only once the real material of the record's language ran out: Chinese prompts have
    # the whole venue catalogue, English ones only the sample log's lines (warned about).
    for r in records:
        fill = r.provenance.fill
        if fill is not None and fill.filler:
            assert r.lang == "en" and fill.fewshot > 10_000, (r.id, fill)
    assert res.warnings and 0 < (res.metrics["filler_token_share"] or 0) < 0.5


def test_max_input_tokens_clips_trace_lengths(tmp_path: Path) -> None:
    """A cap for a short-context target: long trace prompts are fitted to it, short ones untouched."""
    trace = FIXTURES / "mooncake_sample.jsonl"
    rows = [json.loads(line) for line in trace.open()][:8]
    cap = 200
    build_corpus(
        BuildInputs(template=TEMPLATES / "four_section.j2", out=tmp_path / "c", n=8, trace=trace),
        _settings(max_input_tokens=cap),
    )
    records = list(read_corpus(tmp_path / "c"))
    assert any(row["input_length"] > cap for row in rows), "the sample must hold a prompt over the cap"
    for r, row in zip(records, rows, strict=True):
        assert r.prompt_tokens == min(row["input_length"], cap)
        assert r.variables is not None and r.variables.query in r.text()  # cut around the request


def test_messages_template_and_scenarios(tmp_path: Path) -> None:
    res = build_corpus(
        BuildInputs(
            template=TEMPLATES / "chat.messages.json",
            out=tmp_path / "m",
            n=24,
            scenarios=FIXTURES / "scenarios.json",
        ),
        _settings(),
    )
    records = list(read_corpus(tmp_path / "m"))
    assert all(r.messages and r.prompt is None for r in records)
    assert all(r.messages[0].role == "system" and r.messages[-1].role == "user" for r in records)  # type: ignore[index]
    scen = json.loads((FIXTURES / "scenarios.json").read_text())
    names = {c["name"] for c in scen["classes"]}
    assert {r.scenario for r in records} <= names
    # The hotel/flight class (weight 0.5) maps to travel requests (English) and hotels (Chinese).
    hotel = [r for r in records if r.scenario == scen["classes"][0]["name"]]
    assert hotel and all(r.domain == ("travel" if r.lang == "en" else "hotel") for r in hotel)
    # Classes with token distributions give fitted prompts within their min/max.
    for r in records:
        cls = next(c for c in scen["classes"] if c["name"] == r.scenario)
        if "input_tokens" in cls:
            assert cls["input_tokens"]["min"] <= r.target_input_tokens <= cls["input_tokens"]["max"]
            assert r.prompt_tokens == r.target_input_tokens
    assert res.metrics["token_ks"] is not None


def test_cli_build_stats_and_exit_codes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    from harness.cli import main

    out = tmp_path / "cli"
    base = ["corpus", "build", "--template", str(TEMPLATES / "four_section.j2"), "--n", "12", "--seed", "3"]
    with pytest.raises(SystemExit) as ok:
        main([*base, "--out", str(out)])
    assert ok.value.code == 0
    assert len((out / "corpus.jsonl").read_text().splitlines()) == 12
    assert "field_completeness" in capsys.readouterr().out  # the quality table
    with pytest.raises(SystemExit) as st:
        main(["corpus", "stats", str(out), "--json"])
    assert st.value.code == 0
    assert json.loads(capsys.readouterr().out)["records"] == 12
    # A threshold the corpus cannot meet: exit 1 with one line naming the metric, no traceback.
    monkeypatch.setenv("HARNESS__CORPUS__MIN_DISTINCT_2", "0.999")
    with pytest.raises(SystemExit) as bad:
        main([*base, "--out", str(tmp_path / "bad")])
    assert bad.value.code == 1
    err = capsys.readouterr().err
    assert "distinct_2" in err and "Traceback" not in err
    # A template escaping its root: a config error (exit 4).
    evil = tmp_path / "evil.j2"
    evil.write_text("{% include '../x.j2' %}")
    with pytest.raises(SystemExit) as cfg:
        main(["corpus", "build", "--template", str(evil), "--n", "2", "--out", str(tmp_path / "e")])
    assert cfg.value.code == 4


@pytest.mark.realdata
def test_real_mooncake_trace_lengths(realdata: Path, tmp_path: Path) -> None:
    trace = realdata / "mooncake" / "synthetic_trace.jsonl"
    rows = [json.loads(line) for _, line in zip(range(8), trace.open(), strict=False)]
    build_corpus(
        BuildInputs(template=TEMPLATES / "four_section.j2", out=tmp_path / "r", n=8, trace=trace), _settings()
    )
    records = list(read_corpus(tmp_path / "r"))
    assert [r.prompt_tokens for r in records] == [row["input_length"] for row in rows]
    assert [r.provenance.source_line for r in records] == list(range(1, 9))


def test_block_tokens_rescale_a_trace_and_keep_its_reuse(tmp_path: Path) -> None:
    # Mooncake's 512-token blocks at 16 tokens: lengths ÷ 32, the same requests share the same blocks.
    trace = FIXTURES / "mooncake_sample.jsonl"
    rows = [json.loads(line) for line in trace.open()]
    build_corpus(
        BuildInputs(template=TEMPLATES / "four_section.j2", out=tmp_path / "t", trace=trace),
        _settings(block_tokens=16),
    )
    records = list(read_corpus(tmp_path / "t"))
    counts = Counter(h for row in rows for h in set(row["hash_ids"]))
    ref = Tokenizer.from_file(str(default_tokenizer_path()))
    ref.no_truncation()
    ref.no_padding()
    with_blocks = 0
    for r, row in zip(records, rows, strict=True):
        assert r.target_input_tokens == max(1, round(row["input_length"] * 16 / 512))
        lead = 0
        while lead < len(row["hash_ids"]) and counts[row["hash_ids"][lead]] >= 2:
            lead += 1
        room = max(0, (r.target_input_tokens - 32) // 16)
        assert r.prefix_block_ids == row["hash_ids"][: min(lead, room)]
        assert r.prefix_tokens == 16 * len(r.prefix_block_ids)
        with_blocks += bool(r.prefix_block_ids)
    assert with_blocks >= 10
    # Two records opening with the same block ids open with the same tokens, that many of them.
    by_first: dict[int, list[int]] = {}
    for i, r in enumerate(records):
        if r.prefix_block_ids:
            by_first.setdefault(r.prefix_block_ids[0], []).append(i)
    shared = [ix for ix in by_first.values() if len(ix) >= 2]
    assert shared
    for ix in shared:
        a, b = records[ix[0]], records[ix[1]]
        n = 0
        while n < min(len(a.prefix_block_ids), len(b.prefix_block_ids)):
            if a.prefix_block_ids[n] != b.prefix_block_ids[n]:
                break
            n += 1
        ta = ref.encode(a.text(), add_special_tokens=False).ids
        tb = ref.encode(b.text(), add_special_tokens=False).ids
        assert ta[: 16 * n] == tb[: 16 * n]
