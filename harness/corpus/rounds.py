"""A corpus build's generate-and-dedup rounds: per-language judges, candidates drawn and judged, dedup.

Each request's query is a real utterance of the logs (:mod:`harness.corpus.logs`), and dedup judges
exactly that text (:func:`dedup_text`), which the prompt shows verbatim: English with the MiniLM
embedder, Chinese with the character n-gram TF-IDF guard (:mod:`harness.corpus.dedup`, one judge per
language by the ``dedup_judges`` setting, made by :func:`_judges`; :mod:`harness.corpus.sessions`
makes its judges there too). Each language's candidates and what its judge kept are a
:class:`LangDedup`. Greedy first-come dedup (:func:`_greedy`) over the seeded candidate order is
prefix-stable (an item's fate depends only on items before it), so later rounds never change earlier
decisions and the corpus is the first ``n`` kept candidates: deterministic for a seed. A lexical judge
then re-checks the chosen texts with its IDF refitted on them and bans the later of each pair it
still finds (:func:`_refit_vetoes`).

For throughput the encoder judges a round's queries in a worker thread while the candidates are
dressed (:func:`_generate_and_judge`), and the first round encodes the next :data:`LOOKAHEAD` share of
queries too (:class:`_Draws`); neither changes which candidates are drawn or kept (docs/corpus.md,
"Build throughput").

:func:`harness.corpus.build.build_corpus` runs the rounds: how many candidates each one wants, and
when to stop.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from harness.corpus import dedup as dedup_mod
from harness.corpus.inputs import Drawn, InputSampler, Pick
from harness.corpus.logs import Utterance
from harness.corpus.model import RequestVariables
from harness.corpus.settings import CorpusSettings

Progress = Callable[[str, int, int], None]
"""``(phase, done, total)`` callback for progress bars."""


@dataclass
class LangDedup:
    """One language's dedup: its judge, the candidates it judged, and what it kept."""

    judge: dedup_mod.Judge
    index: list[int] = field(default_factory=list)
    """Candidate indices of this language, in order."""
    vectors: Any = None
    banned: set[int] = field(default_factory=set)
    """Positions (in ``index``) dropped by the refitted check of a lexical judge."""
    keep: set[int] = field(default_factory=set)
    dropped: dict[int, int] = field(default_factory=dict)
    pairs: int = 0
    sims: dict[tuple[int, int], float] = field(default_factory=dict)


def dedup_text(v: RequestVariables) -> str:
    """The text dedup judges: the user's query, exactly as the prompt shows it."""
    return v.query


def _judges(
    settings: CorpusSettings, utterances: Sequence[Utterance], langs: Sequence[str], tick: Progress
) -> dict[str, dedup_mod.Judge]:
    """One judge per language; the embedder is built (and its model loaded) only if one needs it."""
    out: dict[str, dedup_mod.Judge] = {}
    for lang in langs:
        name = settings.dedup_judges[lang]
        if name == "embedding":
            from harness.common.embeddings import shared_embedder
            from harness.common.settings import HarnessSettings

            cache = (
                HarnessSettings().run_dir / "cache" / "embeddings.sqlite" if settings.embed_cache else None
            )
            emb = shared_embedder(
                str(settings.embed_model) if settings.embed_model else None,
                settings.device,
                batch_size=settings.batch_size,
                cache_path=cache,
            )
            out[lang] = dedup_mod.judges.get(name)(
                emb, method=settings.dedup_method, tick=partial(tick, "embed")
            )
        else:
            out[lang] = dedup_mod.judges.get(name)(reference=[u.text for u in utterances if u.lang == lang])
    return out


def _greedy(d: LangDedup, threshold: float) -> None:
    """First-come greedy over one language's candidates, ``banned`` positions dropped outright."""
    i, j, s = d.judge.pairs(d.vectors, threshold - dedup_mod.MARGIN)
    d.pairs = len(i)
    d.sims = (
        {(int(a), int(b)): float(c) for a, b, c in zip(i, j, s, strict=True)} if len(i) <= 100_000 else {}
    )
    kept = np.ones(len(d.index), dtype=bool)
    for b in d.banned:
        kept[b] = False
    dropped: dict[int, int] = {b: -1 for b in d.banned}
    if len(i):
        order = np.lexsort((i, j))
        i, j = i[order], j[order]
        bounds = np.flatnonzero(np.diff(j)) + 1
        for gi, gj in zip(np.split(i, bounds), np.split(j, bounds), strict=True):
            jj = int(gj[0])
            if not kept[jj]:
                continue
            for cand in gi:
                if kept[cand]:
                    kept[jj] = False
                    dropped[jj] = int(cand)
                    break
    d.keep = {int(x) for x in np.flatnonzero(kept)}
    d.dropped = dropped


LOOKAHEAD = 0.25
"""Share of the first round's size drawn ahead and encoded with it: later rounds (the ones that replace
near-duplicates) then find their queries' vectors in the judge's memo instead of paying a
forward pass of their own over a few dozen texts (measured: a round of 81 texts took 0.23 s,
about 40 % more per text than the first round's 400; docs/corpus.md)."""


class _Draws:
    """The sampler's candidates in index order, some drawn ahead of the round that takes them.

    Drawing ahead changes nothing about which query candidate ``i`` gets: draws are made in index
    order either way, and the first draw that finds no query is the last one made.
    """

    def __init__(self, sampler: InputSampler) -> None:
        self.sampler = sampler
        self.ahead: deque[Drawn] = deque()
        self.ended = False
        self.next = 0

    def _draw(self) -> Drawn | None:
        if self.ended:
            return None
        got = self.sampler.draw(self.next)
        if got is None:
            self.ended = True
        else:
            self.next += 1
        return got

    def take(self, want: int) -> tuple[list[Drawn], bool]:
        """The next ``want`` candidates, and whether the queries ran out before that many."""
        out: list[Drawn] = []
        while len(out) < want:
            got = self.ahead.popleft() if self.ahead else self._draw()
            if got is None:
                return out, True
            out.append(got)
        return out, False

    def peek(self, count: int) -> list[Drawn]:
        """The next ``count`` candidates (fewer when the queries run out), left for :meth:`take`."""
        while len(self.ahead) < count:
            got = self._draw()
            if got is None:
                break
            self.ahead.append(got)
        return list(self.ahead)[:count]

    def exhausted(self) -> bool:
        return not self.ahead and (self.ended or self.sampler.exhausted())


def _generate_and_judge(
    draws: _Draws,
    *,
    judging: Executor,
    per_lang: dict[str, LangDedup],
    cand: list[tuple[RequestVariables, Pick]],
    want: int,
    tick: Progress,
) -> bool:
    """``want`` more candidates appended to ``cand``, their queries judged into ``per_lang``; true
    when the queries ran out first.

    The round's queries are drawn first (cheap: which utterance each candidate takes) and handed
    to the judges in ``judging``, one call per language, with the next :data:`LOOKAHEAD` share of
    queries as ``ahead`` (encoded in the same pass, kept in the judge's memo); meanwhile this
    thread dresses the candidates (Faker, sessions, constraints), which needs no vector.
    """
    start = len(cand)
    drawn, exhausted = draws.take(want)
    # Only the first round looks ahead: its size ignores the near-duplicates dedup will drop;
    # later rounds are sized by the measured rate, and a look-ahead of theirs would cost an
    # encoder pass of a few texts for queries that are rarely needed.
    ahead = draws.peek(math.ceil(want * LOOKAHEAD) + 2) if start == 0 and not exhausted else []
    jobs: list[tuple[LangDedup, list[int], Future[Any]]] = []
    for lang, d in per_lang.items():
        fresh = [start + k for k, x in enumerate(drawn) if x.lang == lang]
        if fresh:
            # Drawn.query is what dedup_text reads from the dressed candidate (the same string).
            texts = [drawn[k - start].query for k in fresh]
            later = [x.query for x in ahead if x.lang == lang]
            jobs.append((d, fresh, judging.submit(d.judge.vectors, texts, ahead=later)))
    for k, x in enumerate(drawn):
        cand.append(draws.sampler.dress(x))
        if k % 50 == 0:
            tick("generate", k, want)
    tick("generate", want, want)
    for d, fresh, job in jobs:
        vecs = job.result()
        d.vectors = vecs if d.vectors is None else d.judge.stack(d.vectors, vecs)
        d.index.extend(fresh)
    return exhausted


def _refit_vetoes(
    per_lang: dict[str, LangDedup],
    chosen: set[int],
    cand: list[tuple[RequestVariables, Pick]],
    threshold: float,
) -> bool:
    """Ban the later of any chosen pair a lexical judge finds with the IDF refitted on the chosen texts."""
    changed = False
    for d in per_lang.values():
        refit = getattr(d.judge, "refit_pairs", None)
        if refit is None:
            continue
        pos = [p for p, k in enumerate(d.index) if k in chosen and p in d.keep]
        if len(pos) < 2:
            continue
        _, j, _ = refit([dedup_text(cand[d.index[p]][0]) for p in pos], threshold - dedup_mod.MARGIN)
        for b in j.tolist():
            if pos[b] not in d.banned:
                d.banned.add(pos[b])
                changed = True
    return changed
