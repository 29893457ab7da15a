"""``--seed-policy keep|drop``: the records' sampling ``seed`` sent as it is, or left out of every body."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from harness.common.errors import ConfigError
from harness.corpus.model import CorpusRecord
from harness.load.inputs import Inputs
from harness.load.options import LoadOptions


def seeded_corpus(path: Path, n: int = 3) -> Path:
    rows = []
    for i in range(n):
        rec = {
            "id": f"r{i}", "tenant": "default", "max_tokens": 4, "expected_output_tokens": 4, "lang": "en",
            "domain": "test", "intent": "test", "sampling": {"temperature": 0.8, "seed": 100 + i},
            "provenance": {"seed": 0, "candidate": i, "template": "t", "template_sha256": "0" * 64},
            "messages": [{"role": "user", "content": f"q{i}"}],
        }  # fmt: skip
        rows.append(CorpusRecord.model_validate(rec).model_dump(mode="json", exclude_none=True))
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path


def bodies(corpus: Path, **opts: object) -> list[dict[str, object]]:
    inputs = Inputs.load(
        LoadOptions.validated({"corpus": corpus, "rate": 1, "duration": 3, **opts}), ladder=False
    )
    return [orjson.loads(r.body) for r in inputs.requests]


def test_keep_sends_each_records_seed_and_drop_sends_none(tmp_path: Path) -> None:
    corpus = seeded_corpus(tmp_path / "c.jsonl")
    assert [b["seed"] for b in bodies(corpus)] == [100, 101, 102]  # the default: keep
    dropped = bodies(corpus, seed_policy="drop")
    assert all("seed" not in b for b in dropped)
    # Nothing else changes: the same bodies but for the seed.
    kept = bodies(corpus, seed_policy="keep")
    assert [{k: v for k, v in b.items() if k != "seed"} for b in kept] == dropped
    # A variant of the options with another policy prepares the bodies again (not the cached ones).
    inputs = Inputs.load(LoadOptions.validated({"corpus": corpus, "rate": 1, "duration": 3}), ladder=False)
    variant = inputs.with_options(inputs.opts.evolve(seed_policy="drop"))
    assert all(b"seed" not in r.body for r in variant.requests)
    assert "--seed-policy" in variant.opts.to_args()


def test_an_unknown_policy_names_the_flag(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        LoadOptions.validated({"corpus": tmp_path, "seed_policy": "strip"})
    assert err.value.field == "--seed-policy"
