"""Every ``harness …`` and ``locust -f locustfiles/…`` command line in the docs' code blocks parses
against the real command line: the command exists and every option it gives is one of that command's,
spelt as it is now (an old spelling that still works is a mistake in a document). README.md and
docs/ci.md are the pages a newcomer copies from; every other page is held to the same rule."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs.snippets import (
    ROOT,
    CommandLine,
    check_harness,
    check_locust,
    command_lines,
    doc_files,
    problems_of,
    shell_commands,
)

DOCS = doc_files()


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_command_line_parses(doc: Path) -> None:
    bad = [f"{cmd}\n    {problem}" for cmd in command_lines(doc) for problem in problems_of(cmd)]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("name", ["README.md", "docs/ci.md", "docs/cli.md", "docs/load.md"])
def test_the_pages_newcomers_copy_from_have_commands(name: str) -> None:
    found = list(command_lines(ROOT / name))
    assert any(c.words[0] == "harness" for c in found), name
    if name in ("README.md", "docs/load.md"):
        assert any(c.words[0] == "locust" for c in found), name


def test_the_readme_blocks_create_what_they_read() -> None:
    """Each role block of the README starts from the bundled fixtures: a file under runs/ that a
    block reads is one an earlier command of the same block wrote (or `harness run` writes into its
    --out directory); `rm -f runs/…` removes a file and reads nothing."""
    from tests.docs.snippets import code_blocks

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = [
        body for _, info, body in code_blocks(text) if info == "bash" and any("runs/" in b for b in body)
    ]
    assert len(blocks) >= 4
    for body in blocks:
        written: list[str] = []
        for _, words in shell_commands(body):
            if words[0] == "rm":
                continue
            for k, w in enumerate(words):
                if not w.startswith("runs/"):
                    continue
                prev = words[k - 1] if k else ""
                writes = prev in ("-o", "--out", "--ready-file") or ("=" in w and w.startswith("runs/"))
                if writes:
                    written.append(w.rstrip("/"))
                    continue
                path = w.split("=", 1)[-1]
                assert any(
                    path == o or path.startswith(o + "/") or o.startswith(path + "/") for o in written
                ), f"README block reads {path} before writing it: {' '.join(words)}"


# ---- the checks themselves catch what they are for ------------------------------------------------


def parse(line: str) -> list[str]:
    ((_, words),) = list(shell_commands([line]))
    return words


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("harness corpus build --n 60 -o runs/corpus", None),
        ("harness corpus biuld --n 60", "no command 'biuld'"),
        ("harness corpus build --nn 60", "no option --nn"),
        ("harness serve --host 0.0.0.0", "--host is an old spelling"),
        ('harness run --url http://x --rate=4 --capacity "$(jq .capacity_rps c.json)" -o runs/p', None),
        ("harness run --url http://x --rate 70% --capacty 3", "no option --capacty"),
        ("harness --log-level INFO gate --baseline b.yaml runs/x --json-out g.json", None),
        ("harness baseline calibrate --runs 3 -o b.yaml -- --corpus c --rate 4", "old form"),
        ("harness baseline calibrate --runs 3 -o b.yaml -- --corpus c --rat 4", "no option --rat"),
        ("harness cache stats --url http://x --json", None),
        ("harness traces schedule --rate 2 --output s.jsonl", "--output is an old spelling"),
    ],
)
def test_a_wrong_harness_command_is_caught(line: str, problem: str | None) -> None:
    _, problems = check_harness(parse(line))
    if problem is None:
        assert problems == []
    else:
        assert any(problem in p for p in problems), problems


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        (
            "locust -f locustfiles/replay.py --headless --host http://x --corpus c --rate 2 --max-requests 9 "
            "--out r",
            None,
        ),
        ("locust -f locustfiles/warmup.py -H http://x --corpus c --plan p.yaml --processes 4 -t 60s", None),
        (
            "locust -f locustfiles/replay.py --headless --host http://x --corpus c --results-dir r",
            "no option --results-dir",
        ),
        ("locust -f locustfiles/replay.py --host http://x --corpsu c", "no option --corpsu"),
        ("locust -f locustfiles/nope.py --host http://x", "no locustfile locustfiles/nope.py"),
    ],
)
def test_a_wrong_locust_command_is_caught(line: str, problem: str | None) -> None:
    problems = check_locust(parse(line))
    if problem is None:
        assert problems == []
    else:
        assert any(problem in p for p in problems), problems


def test_commands_are_found_in_blocks_continuations_and_prefixes(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "Prose: harness corpus biuld is not a command here.\n\n"
        "```bash\n"
        "mkdir -p runs && harness traces schedule --rate 2 \\\n"
        "    --count 5 -o runs/s.jsonl   # a comment --nope\n"
        "OPENAI_API_KEY=sk-x harness cache stats --url http://x | head\n"
        "for k in 1 2; do harness run --recipe r.yaml -o runs/$k; done\n"
        "$ harness corpus stats runs/corpus --jsn\n"
        "```\n\n"
        "```python\nharness = 1  # not shell\n```\n\n"
        "    harness engine info --preset tiny\n",
        encoding="utf-8",
    )
    found = list(command_lines(page))
    assert [c.words[:3] for c in found] == [
        ["harness", "traces", "schedule"],
        ["harness", "cache", "stats"],
        ["harness", "run", "--recipe"],
        ["harness", "corpus", "stats"],
        ["harness", "engine", "info"],
    ]
    assert found[0].words[-2:] == ["-o", "runs/s.jsonl"]  # the continuation joined, the comment dropped
    problems = {str(c.words[:3]): problems_of(c) for c in found}
    assert problems.pop("['harness', 'corpus', 'stats']") == ["harness corpus stats: no option --jsn"]
    assert all(p == [] for p in problems.values()), problems
    assert isinstance(found[0], CommandLine)
