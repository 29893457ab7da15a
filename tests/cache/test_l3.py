"""L3 semantic cache with real MiniLM embeddings and real FAISS: paraphrases hit, unrelated prompts
miss, the verifier refuses near-duplicates across models / params / tenants / numbers / negation,
TTL, persistence with the reload consistency check, and the switch to HNSW."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import numpy as np
import orjson
import pytest
from prometheus_client import CollectorRegistry

from harness.common.embeddings import shared_embedder
from harness.target.cache.l3 import SemanticCache
from harness.target.cache.stack import CacheStack
from tests.cache.conftest import StackFactory, chat, completion, make_settings

pytestmark = pytest.mark.slow  # loads MiniLM (seconds) once per session

PARAPHRASES = [
    ("What is the capital of France?", "Which city is the capital of France?"),
    ("How do I reverse a list in Python?", "How can I reverse a list in Python?"),
    ("Explain how photosynthesis works.", "Can you explain how photosynthesis works?"),
    ("What are the health benefits of green tea?", "What health benefits does green tea have?"),
]
UNRELATED = ["What's a good recipe for banana bread?", "How do I sort a dictionary by value in Python?"]


def cosine(a: str, b: str) -> float:
    """Independent of the cache: the embedder directly, on the text the cache embeds."""
    v = shared_embedder(device="cpu").encode([f"user: {a}", f"user: {b}"])
    return float(v[0] @ v[1])


async def l3_stack(make_stack: StackFactory, **kw: object):
    return await make_stack(l3_enabled=True, l3_warm_on_start=True, embed_device="cpu", **kw)


async def miss(stack, body, tenant="default") -> str:
    t = await stack.begin("chat.completions", body, tenant)
    if t.status == "MISS":
        await stack.finish(t, None)
    return str(t.status)


async def test_paraphrases_hit_l3_and_unrelated_prompts_miss(make_stack: StackFactory) -> None:
    stack = await l3_stack(make_stack)
    for original, _ in PARAPHRASES:
        await stack.put("chat.completions", chat(original), "default", completion(f"A: {original}"))
    for original, para in PARAPHRASES:
        assert cosine(original, para) >= 0.90  # the premise, checked without the cache
        t = await stack.begin("chat.completions", chat(para), "default")
        assert t.status == "HIT-L3", para
        assert t.completion is not None and t.completion.text == f"A: {original}"
        assert t.context["l3_score"] >= 0.90
    for q in UNRELATED:
        assert max(cosine(q, o) for o, _ in PARAPHRASES) < 0.90
        assert await miss(stack, chat(q)) == "MISS"
    # A served paraphrase is promoted under its own key: next time it is an exact hit.
    assert (await stack.begin("chat.completions", chat(PARAPHRASES[0][1]), "default")).status == "HIT-L1"
    assert await stack.drain() == 0  # the promotion to L2 is written in the background
    await stack.flush("l1")
    assert (await stack.begin("chat.completions", chat(PARAPHRASES[0][1]), "default")).status == "HIT-L2"


async def test_verifier_refuses_other_params_tenants_numbers_and_negation(make_stack: StackFactory) -> None:
    stack = await l3_stack(make_stack)
    orig, para = PARAPHRASES[1]
    await stack.put("chat.completions", chat(orig), "acme", completion("reverse with [::-1]"))
    assert (await stack.begin("chat.completions", chat(para), "acme")).status == "HIT-L3"
    assert await miss(stack, chat(para, model="other-model"), "acme") == "MISS"
    assert await miss(stack, chat(para, temperature=0.5, seed=1), "acme") == "MISS"
    assert await miss(stack, chat(para, system="Answer in French."), "acme") == "MISS"
    assert await miss(stack, chat(para, max_tokens=5), "acme") == "MISS"
    assert stack.l3.refused["params"] >= 4
    assert await miss(stack, chat(para), "globex") == "MISS"  # another tenant's index is never searched
    assert "globex" not in stack.l3.tenants
    a, b = "What is 1234 plus 5678?", "What is 1234 plus 5679?"
    assert cosine(a, b) >= 0.90  # MiniLM alone would serve the wrong sum
    await stack.put("chat.completions", chat(a), "acme", completion("6912"))
    assert await miss(stack, chat(b), "acme") == "MISS"
    assert stack.l3.refused["numbers"] >= 1
    c, d = "Is Python a compiled language?", "Is Python not a compiled language?"
    assert cosine(c, d) >= 0.90
    await stack.put("chat.completions", chat(c), "acme", completion("No, interpreted."))
    assert await miss(stack, chat(d), "acme") == "MISS"
    assert stack.l3.refused["negation"] >= 1


async def test_tenant_isolation_at_l3_for_the_identical_prompt(make_stack: StackFactory) -> None:
    stack = await l3_stack(make_stack, bloom_enabled=False, l2_enabled=False)
    orig, para = PARAPHRASES[2]
    await stack.put("chat.completions", chat(orig), "a", completion("answer of tenant a"))
    await stack.put("chat.completions", chat(orig), "b", completion("answer of tenant b"))
    await stack.flush("l1")
    for tenant in ("a", "b"):
        for prompt in (orig, para):
            t = await stack.begin("chat.completions", chat(prompt), tenant)
            assert t.status == "HIT-L3"
            assert t.completion is not None and t.completion.text == f"answer of tenant {tenant}"
        await stack.flush("l1")
    assert await miss(stack, chat(orig), "c") == "MISS"


async def test_l3_entries_expire(make_stack: StackFactory) -> None:
    """A cold entry (1 s) expires while a hot one (an hour) is still served. Real time has to pass
    for that; a sleep is a lower bound on it, so a slow machine cannot make this fail."""
    stack = await l3_stack(make_stack, ttl_hot_s=3600.0, ttl_warm_s=3600.0, ttl_cold_s=1.0)
    (hot, hot_para), (cold, cold_para) = PARAPHRASES[2], PARAPHRASES[3]
    await stack.put("chat.completions", chat(hot), "default", completion("light", mean_entropy=0.1))
    await stack.put("chat.completions", chat(cold), "default", completion("tea", mean_entropy=3.0))
    await asyncio.sleep(1.0)
    assert await miss(stack, chat(cold_para)) == "MISS"
    # Dropped either by that lookup (refused as expired) or by the expiry sweep of the housekeeping
    # pass the first lookup started; after one more pass it is gone either way.
    await stack.refresh()
    assert stack.l3.entries() == 1
    t = await stack.begin("chat.completions", chat(hot_para), "default")
    assert t.status == "HIT-L3" and t.completion is not None and t.completion.text == "light"


async def test_persistence_and_reload_consistency_check(make_stack: StackFactory, tmp_path: Path) -> None:
    stack = await l3_stack(make_stack, persist=True)
    for orig, _ in PARAPHRASES:
        await stack.put("chat.completions", chat(orig), "t1", completion(f"A: {orig}"))
    await stack.close()
    d = tmp_path / "state" / "l3" / "t1"
    assert {p.name for p in d.iterdir()} == {"index.faiss", "vectors.npy", "meta.json"}
    meta = orjson.loads((d / "meta.json").read_bytes())
    assert meta["count"] == len(PARAPHRASES)
    # The stored vectors are the embeddings of the stored texts (computed here independently).
    vecs = np.load(d / "vectors.npy", allow_pickle=False)
    expect = shared_embedder(device="cpu").encode([f"user: {o}" for o, _ in PARAPHRASES])
    assert np.max(np.abs(vecs - expect)) < 1e-4

    again = await l3_stack(make_stack, persist=True)
    assert again.l3.consistency == {"t1": "ok"}
    t = await again.begin("chat.completions", chat(PARAPHRASES[0][1]), "t1")
    assert t.status == "HIT-L3" and t.completion.text == f"A: {PARAPHRASES[0][0]}"
    await again.close()

    # An index whose vectors drifted from the stored ones is detected and rebuilt from them.
    import faiss

    bad = faiss.IndexFlatIP(vecs.shape[1])
    bad.add(np.ascontiguousarray(vecs[::-1]))
    faiss.write_index(bad, str(d / "index.faiss"))
    rebuilt = await l3_stack(make_stack, persist=True)
    assert rebuilt.l3.consistency == {"t1": "rebuilt"}
    t = await rebuilt.begin("chat.completions", chat(PARAPHRASES[1][1]), "t1")
    assert t.status == "HIT-L3" and t.completion.text == f"A: {PARAPHRASES[1][0]}"
    await rebuilt.close()

    # Vectors that fail their checksum: the tenant is dropped, never served from.
    np.save(d / "vectors.npy", vecs + 0.01, allow_pickle=False)
    dropped = await l3_stack(make_stack, persist=True)
    assert dropped.l3.consistency["t1"].startswith("dropped")
    assert await miss(dropped, chat(PARAPHRASES[1][1]), "t1") == "MISS"


async def test_switches_to_hnsw_and_still_finds_paraphrases(make_stack: StackFactory) -> None:
    stack = await l3_stack(make_stack, l3_hnsw_min=30, l2_enabled=False)
    topics = ["Rome", "Egypt", "China", "Peru", "Mali", "Japan"] * 5
    fillers = [f"Tell me fact number {i} about the history of {topic}." for i, topic in enumerate(topics)]
    for q in fillers:
        await stack.put("chat.completions", chat(q), "default", completion("filler"))
    orig, para = PARAPHRASES[0]
    await stack.put("chat.completions", chat(orig), "default", completion("Paris"))
    assert stack.l3.tenants["default"].kind == "hnsw"
    await stack.flush("l1")
    t = await stack.begin("chat.completions", chat(para), "default")
    assert t.status == "HIT-L3" and t.completion.text == "Paris"
    assert stack.stats()["tiers"]["l3"]["tenants"]["default"]["index"] == "hnsw"


async def test_embedding_runs_off_the_event_loop(tmp_path: Path) -> None:
    """The embedder below checks, inside every encode() call, that it is not on the event loop's
    thread and that the loop is free meanwhile (it has the loop run a coroutine and waits for it:
    on the loop's own thread that would deadlock). The property itself, not a speed ratio."""
    loop = asyncio.get_running_loop()
    loop_thread = threading.get_ident()
    real = shared_embedder(device="cpu")
    calls: list[int] = []

    class CheckingEmbedder:
        dim = real.dim

        def encode(self, texts, *, show_progress: bool = False):
            if threading.get_ident() == loop_thread:
                raise AssertionError("encode() ran on the event loop's thread")
            calls.append(len(texts))
            asyncio.run_coroutine_threadsafe(asyncio.sleep(0), loop).result(timeout=60)
            return real.encode(texts, show_progress=show_progress)

    settings = make_settings(tmp_path, l3_enabled=True, l2_enabled=False)
    semantic = SemanticCache(settings, embedder=CheckingEmbedder())  # type: ignore[arg-type]
    stack = CacheStack(settings, CollectorRegistry(), redis_url=None, semantic=semantic)
    try:
        for i in range(3):
            q = f"question number {i} about embeddings and event loops"
            assert await miss(stack, chat(q)) == "MISS"  # one lookup embedding each
        await stack.put("chat.completions", chat("stored for the add path"), "default", completion("x"))
        assert len(calls) == 4
    finally:
        await stack.close()
