"""The tier policy file: ``HARNESS__CACHE__TIER_FILE`` feeds ``TablePolicy`` and sets the TTLs."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from harness.common.errors import ConfigError, InputError
from harness.common.io import write_json
from harness.target.cache.api import CachedCompletion
from harness.target.cache.policy import TablePolicy, TierFile, load_tier_file
from harness.target.cache.settings import CacheSettings, with_tier_file
from tests.cache.conftest import StackFactory, chat, l2_of, raw_redis

FP_HOT = "a" * 32
FP_COLD = "b" * 32


def tier_file(path: Path, **kw: object) -> Path:
    doc = {
        "version": 1,
        "ttl_s": {"hot": 900.0, "warm": 90.0, "cold": 9.0},
        "entries": [
            {"tier": "hot", "prompt_fp": FP_HOT, "query": "a hot one"},
            {"tier": "cold", "prompt_fp": FP_COLD},
            {"tier": "warm", "key": "default:" + "c" * 32},
        ],
    }
    doc.update(kw)
    write_json(path, doc)
    return path


def comp(fp: str | None = None, **kw: object) -> CachedCompletion:
    base: dict[str, object] = {
        "text": "x",
        "finish_reason": "stop",
        "model": "m",
        "prompt_tokens": 1,
        "completion_tokens": 1,
        "created": int(time.time()),
        "mean_entropy": 3.0,  # the heuristic would say cold
        "meta": {"prompt_fp": fp} if fp else {},
    }
    base.update(kw)
    return CachedCompletion(**base)  # type: ignore[arg-type]


def test_table_policy_reads_the_file(tmp_path: Path) -> None:
    s = CacheSettings(tier_file=tier_file(tmp_path / "t.json"))
    policy = TablePolicy(s)
    assert policy.tier("default:" + "0" * 32, comp(FP_HOT), 0) == "hot"
    assert policy.tier("default:" + "0" * 32, comp(FP_COLD, mean_entropy=0.1), 0) == "cold"
    assert policy.tier("default:" + "c" * 32, comp(FP_HOT), 0) == "warm"  # a key entry wins
    assert policy.tier("default:" + "0" * 32, comp(), 0) == "cold"  # unlisted: the heuristic
    with_default = TablePolicy(CacheSettings(tier_file=tier_file(tmp_path / "d.json", default_tier="warm")))
    assert with_default.tier("k", comp(), 0) == "warm"


def test_the_file_selects_the_table_policy_and_its_ttls(tmp_path: Path) -> None:
    s = with_tier_file(CacheSettings(tier_file=tier_file(tmp_path / "t.json")))
    assert (s.tier_policy, s.ttl_hot_s, s.ttl_warm_s, s.ttl_cold_s) == ("table", 900.0, 90.0, 9.0)
    with pytest.raises(ConfigError, match="table"):
        with_tier_file(CacheSettings(tier_file=tmp_path / "t.json", tier_policy="fixed-warm"))


def test_bad_files_name_the_field(tmp_path: Path) -> None:
    with pytest.raises(InputError) as exc:
        load_tier_file(tier_file(tmp_path / "a.json", ttl_s={"hot": 1, "warm": 2, "cold": 1}))
    assert exc.value.field == "ttl_s"
    with pytest.raises(InputError) as exc:
        load_tier_file(tier_file(tmp_path / "b.json", entries=[{"tier": "lukewarm", "prompt_fp": FP_HOT}]))
    assert exc.value.field == "entries.0.tier"
    with pytest.raises(InputError, match="prompt_fp' or 'key"):
        load_tier_file(tier_file(tmp_path / "c.json", entries=[{"tier": "hot"}]))
    (tmp_path / "d.json").write_text("{not json")
    with pytest.raises(InputError, match="invalid JSON"):
        load_tier_file(tmp_path / "d.json")
    assert TierFile.model_json_schema()["required"] == ["ttl_s"]


async def test_stack_writes_with_the_files_tier_and_ttl(make_stack: StackFactory, tmp_path: Path) -> None:
    stack = await make_stack(tier_file=tier_file(tmp_path / "t.json"))
    assert stack.stats()["policy"] == "table"
    assert stack.stats()["ttl_s"] == {"hot": 900.0, "warm": 90.0, "cold": 9.0}
    t0 = time.time()
    k_hot = await stack.put("chat.completions", chat("hot question"), "default", comp(FP_HOT))
    k_cold = await stack.put("chat.completions", chat("cold question"), "default", comp(FP_COLD))
    hot, cold = stack.l1.get(k_hot), stack.l1.get(k_cold)
    assert hot is not None and cold is not None
    assert (hot.value_tier, cold.value_tier) == ("hot", "cold")
    # L1 caps every entry at its own TTL (60 s); L2 carries the tier's TTL.
    assert cold.expires_at - t0 <= 9 + 5
    r = raw_redis(stack)
    assert 900_000 - 10_000 <= r.pttl(l2_of(stack).rkey(k_hot)) <= 900_000
    assert 0 < r.pttl(l2_of(stack).rkey(k_cold)) <= 9_000
    reg = stack.metrics.registry
    assert reg.get_sample_value("cache_writebacks_total", {"value_tier": "hot"}) == 1
    assert reg.get_sample_value("cache_writebacks_total", {"value_tier": "cold"}) == 1
