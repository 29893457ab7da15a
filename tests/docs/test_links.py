"""Every relative link and ``#anchor`` in README.md and docs/*.md resolves (GitHub's anchor rules), so
do the ``docs/FILE.md#anchor`` references the code writes into its output (a calibrated baseline's
header); and the user docs carry no development history."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.docs.snippets import (
    ROOT,
    Link,
    anchors,
    broken,
    code_anchor_refs,
    doc_files,
    github_slug,
    links,
    prose_lines,
)

DOCS = doc_files()


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_resolves(doc: Path) -> None:
    bad = [f"{doc.relative_to(ROOT)}:{link.line}: {link.target}: {why}"
           for link in links(doc) if (why := broken(link)) is not None]  # fmt: skip
    assert not bad, "\n".join(bad)


def test_the_code_names_anchors_that_exist() -> None:
    refs = list(code_anchor_refs())
    assert any(doc == "gates.md" for _, _, doc, _ in refs)  # the calibrated baseline's header
    bad = [f"{file.relative_to(ROOT)}:{line}: docs/{doc}#{anchor}"
           for file, line, doc, anchor in refs
           if not (ROOT / "docs" / doc).is_file() or anchor not in anchors(ROOT / "docs" / doc)]  # fmt: skip
    assert not bad, "\n".join(bad)


def test_the_docs_index_lists_every_page() -> None:
    index = (ROOT / "docs" / "README.md").read_text(encoding="utf-8")
    missing = [
        p.name
        for p in DOCS
        if p.parent.name == "docs" and p.name != "README.md" and f"({p.name})" not in index
    ]
    assert not missing, f"docs/README.md does not list {missing}"


HISTORY = re.compile(
    r"\bissue\s+#?\d+|(?<![\w/&])#\d+\b|\bthe old recipe\b|\bsince stop \d+|\bstop \d+\b"
    r"|\bbefore this change\b|\bno longer\s+\w+s\b|\bused to be\b",
    re.IGNORECASE,
)
"""Development history in user docs: an issue or pull-request number, "the old recipe", "since stop
N", "before this change" … (docs/benchmarks.md's dated log is history by design)."""


@pytest.mark.parametrize("doc", [d for d in DOCS if d.name != "benchmarks.md"], ids=lambda p: p.name)
def test_user_docs_carry_no_history(doc: Path) -> None:
    found = [f"{doc.relative_to(ROOT)}:{n}: {m.group(0)!r}"
             for n, line in prose_lines(doc.read_text(encoding="utf-8"))
             for m in HISTORY.finditer(line)]  # fmt: skip
    assert not found, "\n".join(found)


# ---- the checks themselves catch what they are for ------------------------------------------------


@pytest.mark.parametrize(
    ("heading", "slug"),
    [
        ("Calibration: `harness baseline calibrate`", "calibration-harness-baseline-calibrate"),
        ("The baseline: `fixtures/baselines/tiny-cpu.yaml`", "the-baseline-fixturesbaselinestiny-cpuyaml"),
        ("Latency gates that travel (`_rel`)", "latency-gates-that-travel-_rel"),
        ("load — 2026-12-03 07:26 UTC", "load--2026-12-03-0726-utc"),
        ("`locust -f`: the same options", "locust--f-the-same-options"),
        ("1. 用户画像", "1-用户画像"),
    ],
)
def test_slugs_follow_github(heading: str, slug: str) -> None:
    assert github_slug(heading) == slug


def test_a_wrong_link_or_anchor_is_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.docs import snippets

    monkeypatch.setattr(snippets, "ROOT", tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A\n\n## Two words\n\n## Two words\n", encoding="utf-8")
    page = tmp_path / "README.md"
    page.write_text(
        "[ok](docs/a.md#two-words) [ok](docs/a.md#two-words-1) [ok](#top) [web](https://x.example/#y)\n"
        "[gone](docs/b.md) [anchor](docs/a.md#three-words) [self](#nowhere)\n"
        "`[in code](docs/c.md)`\n\n```\n[in a block](docs/d.md)\n```\n\n# Top\n",
        encoding="utf-8",
    )
    found = {link.target: broken(link) for link in links(page)}
    assert found == {
        "docs/a.md#two-words": None,
        "docs/a.md#two-words-1": None,
        "#top": None,
        "https://x.example/#y": None,
        "docs/b.md": "docs/b.md: no such file",
        "docs/a.md#three-words": "#three-words: no such heading in docs/a.md",
        "#nowhere": "#nowhere: no such heading in README.md",
    }
    assert broken(Link(page, 1, "docs/a.md#two-words-2")) is not None


def test_history_words_are_caught() -> None:
    for text in ("as issue #18 asked", "Issue 11 asked for exit 2", "(#19 item 4)", "the old recipe's TTFT",
                 "since stop 3", "before this change: all padded"):  # fmt: skip
        assert HISTORY.search(text), text
    for text in ("HIT-L1 & #nbsp", "a 404 (not found)", "the previous turn", "`[pass p]`", "C#5"):
        assert not HISTORY.search(text), text
