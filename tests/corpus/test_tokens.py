"""Token-length fitting and prefix sharing under the real MiniLM tokenizer (``tokenizers`` library)."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer

from harness.corpus.tokens import TargetTokenizer, default_tokenizer_path


@pytest.fixture(scope="module")
def tok() -> TargetTokenizer:
    return TargetTokenizer(seed=0)


@pytest.fixture(scope="module")
def ref() -> Tokenizer:
    """An independently loaded tokenizer to count with (special tokens off via add_special_tokens)."""
    t = Tokenizer.from_file(str(default_tokenizer_path()))
    t.no_truncation()  # the shipped file truncates and pads to 128 for the encoder; we count whole prompts
    t.no_padding()
    return t


def _ids(ref: Tokenizer, text: str) -> list[int]:
    return ref.encode(text, add_special_tokens=False).ids


def test_blocks_are_exact_and_deterministic(tok: TargetTokenizer, ref: Tokenizer) -> None:
    assert tok.additive
    for b in (0, 7, 123456):
        text = tok.block(b, 512)
        assert len(_ids(ref, text)) == 512
        assert TargetTokenizer(seed=0).block(b, 512) == text
    assert tok.block(1, 512) != tok.block(2, 512)
    assert TargetTokenizer(seed=1).block(1, 512) != tok.block(1, 512)


def test_shared_hash_ids_give_shared_leading_tokens(tok: TargetTokenizer, ref: Tokenizer) -> None:
    a = tok.prefix([10, 11, 12], 64) + "\n\nfirst request body"
    b = tok.prefix([10, 11, 99], 64) + "\n\nsecond request body"
    ia, ib = _ids(ref, a), _ids(ref, b)
    common = next(i for i, (x, y) in enumerate(zip(ia, ib, strict=False)) if x != y)
    assert common >= 2 * 64
    assert ia[:128] == _ids(ref, tok.prefix([10, 11], 64))


@pytest.mark.parametrize("budget", [1, 17, 200, 1000])
@pytest.mark.parametrize("text", ["短文本 {{ 7*7 }} with mixed 中文 and English.", "word " * 600])
def test_fit_lands_on_the_budget(tok: TargetTokenizer, ref: Tokenizer, text: str, budget: int) -> None:
    fitted, n, how = tok.fit(text, budget, key="k")
    assert len(_ids(ref, fitted)) == budget == n
    original = len(_ids(ref, text))
    assert how == ("exact" if original == budget else "padded" if original < budget else "truncated")
    if how == "padded":  # filler goes after the text's instructions, never in front of them
        assert fitted.startswith(text.rstrip())


@pytest.mark.parametrize("budget", [5, 40, 300])
def test_fit_keep_end_cuts_the_front(tok: TargetTokenizer, ref: Tokenizer, budget: int) -> None:
    text = "context " * 500 + "the request: where is my parcel?"
    fitted, n, how = tok.fit_keep_end(text, budget, key="k")
    assert len(_ids(ref, fitted)) == budget == n and how == "truncated"
    if budget >= 40:
        assert fitted.endswith("the request: where is my parcel?")


def test_shared_blocks_are_real_context_exact_and_shared(tok: TargetTokenizer, ref: Tokenizer) -> None:
    from harness.corpus.catalog import venue_lines
    from harness.corpus.tokens import SHARED_PREAMBLE, SharedBlocks

    blocks = SharedBlocks(tok, seed=0)
    a = blocks.prefix([10, 11, 12], 128)
    b = blocks.prefix([10, 11, 99], 128)
    assert len(_ids(ref, a)) == 3 * 128 == len(_ids(ref, b))
    assert _ids(ref, a)[:256] == _ids(ref, b)[:256] == _ids(ref, blocks.prefix([10, 11], 128))
    # The run opens with the shared system instruction; the rest is venue entries (the last of a
    # block cut at a token boundary), with no filler word anywhere.
    assert a.startswith("\n" + SHARED_PREAMBLE)
    lines = set(venue_lines())
    body = a[len("\n" + SHARED_PREAMBLE) :].split("\n")[1:]
    assert body and all(line in lines or any(v.startswith(line) for v in lines) for line in body)
    assert blocks.block(10, 128, True) != blocks.block(10, 128, False)  # only a run's first block is preceded
    # A block too small for the instruction to take at most half of it (a trace rescaled to 16-token
    # blocks) is its own context only: else every run's first block would be the same instruction
    # and two different block ids would share a prefix the trace says they do not.
    small = [blocks.block(b, 16, True) for b in (1, 2, 3)]
    assert len(set(small)) == 3 and not any(x.startswith("\n" + SHARED_PREAMBLE[:20]) for x in small)
    assert all(len(_ids(ref, x)) == 16 for x in small)


def test_head_and_tail_cut_at_token_boundaries(tok: TargetTokenizer, ref: Tokenizer) -> None:
    text = "北京贵都大酒店；评分 4.7；the hotel's gym opens at 6 am"
    n = len(_ids(ref, text))
    for k in range(n + 1):
        head, tail = tok.head(text, k), tok.tail(text, k)
        assert len(_ids(ref, head)) == k == len(_ids(ref, tail))
        assert text.startswith(head) and text.endswith(tail)


def test_line_memo_counts_like_the_tokenizer(tok: TargetTokenizer, ref: Tokenizer) -> None:
    assert tok.line_additive  # MiniLM's WordPiece splits at every whitespace, newlines included
    texts = ["你是客服助手。\n\n- 北京贵都大酒店；评分 4.7\n[meta] User: spell aaron", "one line", ""]
    texts.append("a\n\n\nb c")
    assert tok.count_each(texts) == [len(_ids(ref, t)) for t in texts]
    assert tok.count_lines(texts) == sum(len(_ids(ref, t)) for t in texts)
