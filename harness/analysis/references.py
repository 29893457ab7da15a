"""Request histories reduced to what a cache simulator needs: one integer key per cache reference.

Two units of caching are modelled:

* ``entries``: one reference per request, keyed by what makes two requests the same cache entry.
  For an LLM request trace that is the whole prompt identity, i.e. the tuple of its
  ``prefix_block_ids`` (Mooncake ``hash_ids``; equal tuples mean equal prompts); for a load run's
  ``records.jsonl`` it is the corpus record id the request replayed.
* ``blocks``: one reference per KV block of the prompt, keyed by its block id, in prompt order, as a
  prefix cache (vLLM, SGLang, our engine) looks them up. Mooncake's ids are prefix hashes: equal ids
  at a position mean an equal prefix up to there, so a block id is a complete cache key.

Keys are partitioned by tenant (a tenant never hits another's entry, as in every tier of the
cache). Keys are mapped to dense integers so the simulators work on NumPy arrays.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np
import numpy.typing as npt

from harness.common.errors import InputError

if TYPE_CHECKING:
    from harness.corpus.model import CorpusRecord

Unit = Literal["entries", "blocks"]
UNITS: tuple[Unit, ...] = ("entries", "blocks")

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class RefTrace:
    """A reference sequence in arrival order.

    ``keys[i]`` is the dense key id of reference ``i`` and ``req[i]`` the request it belongs to;
    ``arrival_s[r]`` is request ``r``'s arrival (seconds from the first request);
    ``labels[k]`` is the original key of dense id ``k`` (a block id, a block-id tuple, a record id,
    each with its tenant); ``bodies`` maps a request index to where its text can be found (a corpus
    record id or a source line), when known.
    """

    unit: Unit
    keys: IntArray
    req: IntArray
    arrival_s: FloatArray
    labels: list[Hashable]
    source: str
    request_refs: list[str] = field(default_factory=list)
    """Per request: what identifies it in its source (``records:<id>`` or ``line:<n>``)."""

    @property
    def n_requests(self) -> int:
        return int(self.arrival_s.size)

    @property
    def n_refs(self) -> int:
        return int(self.keys.size)

    @property
    def distinct(self) -> int:
        return int(np.unique(self.keys).size) if self.keys.size else 0

    def head(self, fraction: float | None = None, requests: int | None = None) -> RefTrace:
        """The first ``requests`` requests (or the first ``fraction`` of them, at least one)."""
        if requests is None:
            if fraction is None or not 0.0 < fraction <= 1.0:
                raise InputError(f"fraction {fraction} is not in (0, 1]", field="fraction")
            requests = max(1, int(self.n_requests * fraction))
        return self.window(0, requests)

    def window(self, start: int, stop: int) -> RefTrace:
        """Requests ``start`` … ``stop − 1`` (key ids and labels are kept as they are)."""
        stop = min(stop, self.n_requests)
        lo = int(np.searchsorted(self.req, start, side="left"))
        hi = int(np.searchsorted(self.req, stop, side="left"))
        return RefTrace(
            unit=self.unit,
            keys=self.keys[lo:hi],
            req=self.req[lo:hi] - start,
            arrival_s=self.arrival_s[start:stop] - (self.arrival_s[start] if stop > start else 0.0),
            labels=self.labels,
            source=self.source,
            request_refs=self.request_refs[start:stop],
        )

    def ref_times(self) -> FloatArray:
        """Arrival time of the request of each reference."""
        return self.arrival_s[self.req]


class _Builder:
    def __init__(self, unit: Unit, source: str) -> None:
        self.unit = unit
        self.source = source
        self.ids: dict[Hashable, int] = {}
        self.labels: list[Hashable] = []
        self.keys: list[int] = []
        self.req: list[int] = []
        self.arrivals: list[float] = []
        self.refs: list[str] = []

    def _id(self, label: Hashable) -> int:
        k = self.ids.get(label)
        if k is None:
            k = self.ids[label] = len(self.labels)
            self.labels.append(label)
        return k

    def add(self, arrival_s: float, labels: Iterable[Hashable], ref: str) -> None:
        r = len(self.arrivals)
        self.arrivals.append(arrival_s)
        self.refs.append(ref)
        for label in labels:
            self.keys.append(self._id(label))
            self.req.append(r)

    def build(self) -> RefTrace:
        if not self.arrivals:
            raise InputError("no requests to analyse", file=self.source)
        arrivals = np.asarray(self.arrivals, dtype=np.float64)
        order = np.argsort(arrivals, kind="stable")
        if np.any(order != np.arange(order.size)):
            # Sort requests by arrival (records.jsonl is written in completion order).
            rank = np.empty_like(order)
            rank[order] = np.arange(order.size)
            req = rank[np.asarray(self.req, dtype=np.int64)]
            ref_order = np.lexsort((np.arange(req.size), req))
            keys = np.asarray(self.keys, dtype=np.int64)[ref_order]
            req = req[ref_order]
            arrivals = arrivals[order]
            refs = [self.refs[i] for i in order.tolist()]
        else:
            keys = np.asarray(self.keys, dtype=np.int64)
            req = np.asarray(self.req, dtype=np.int64)
            refs = self.refs
        return RefTrace(
            unit=self.unit,
            keys=keys,
            req=req,
            arrival_s=arrivals - (arrivals[0] if arrivals.size else 0.0),
            labels=self.labels,
            source=self.source,
            request_refs=refs,
        )


def is_run_dir(path: str | Path) -> bool:
    """A load run directory, or its ``records.jsonl``."""
    from harness.load.results import RECORDS_FILE

    p = Path(path)
    return (p.is_dir() and (p / RECORDS_FILE).is_file()) or p.name == RECORDS_FILE


def load_refs(
    path: str | Path, unit: Unit = "entries", *, format: str | None = None, skip_invalid: bool = False
) -> RefTrace:
    """The :class:`RefTrace` of a request trace (any format ``harness traces formats`` lists) or of a
    load run directory (``records.jsonl``: entries only, keyed by corpus record id).

    Raises :class:`InputError` when the source cannot identify cache entries: a trace without
    ``prefix_block_ids`` (Azure, BurstGPT carry only lengths) gives every request a unique prompt,
    so its hit rate would be 0 by construction.
    """
    if unit not in UNITS:
        raise InputError(f"unknown unit {unit!r}; expected one of {', '.join(UNITS)}", field="unit")
    if is_run_dir(path):
        return _from_records(path, unit)
    from harness.traces.api import read_requests

    b = _Builder(unit, str(path))
    with_ids = 0
    for i, ev in enumerate(read_requests(path, format=format, skip_invalid=skip_invalid)):
        tenant = ev.tenant or ""
        ids = ev.prefix_block_ids
        with_ids += bool(ids)
        ref = f"line:{ev.line}" if ev.line is not None else f"request:{i}"
        if unit == "blocks":
            b.add(ev.arrival_s, ((tenant, h) for h in ids), ref)
        else:
            b.add(ev.arrival_s, [(tenant, ids) if ids else ("unique", i)], ref)
    if not with_ids:
        raise InputError(
            "the trace has no prefix block ids (hash_ids), so no two requests can be identified as "
            "the same cache entry",
            file=path,
            hint="use a trace with hash_ids (Mooncake), or a load run directory (records.jsonl)",
        )
    return b.build()


def timed(records: Iterable[CorpusRecord], source: str) -> list[CorpusRecord]:
    """``records`` in arrival order; an :class:`InputError` naming the first without an
    ``arrival_offset_s`` (a warmup is planned and replayed on a timeline: a corpus built from a trace)."""
    out = list(records)
    for i, rec in enumerate(out):
        if rec.call is not None:
            # Checked first: only a session's first call carries an arrival, so the next check would
            # send the user to build from a trace, which is what they did.
            raise InputError(
                "the record is a call of an agent session (harness corpus graph): its calls share "
                "prefixes through their messages, not the trace's KV block ids a warmup is planned from",
                file=source, line=i + 1, field="call",
                hint="replay the sessions cold and warm with `harness run --corpus`; plan a warmup "
                "from a trace with hash_ids (Mooncake): harness corpus build --trace",
            )  # fmt: skip
        if rec.arrival_offset_s is None:
            raise InputError(
                "the record has no arrival_offset_s; build the corpus from a trace (--trace)",
                file=source, line=i + 1, field="arrival_offset_s",
            )  # fmt: skip
    return sorted(out, key=lambda r: float(r.arrival_offset_s or 0.0))


def corpus_refs(records: Iterable[CorpusRecord], source: str, *, tail_block: int | None = None) -> RefTrace:
    """The KV-block :class:`RefTrace` of a corpus built from a trace: each record's
    ``prefix_block_ids`` (the shared blocks its prompt opens with, labels ``(tenant, block id)``) at
    its ``arrival_offset_s``; ``request_refs`` are ``corpus:<id>``. A record without blocks is a
    request with no reference.

    ``tail_block``: also the full blocks (of that many tokens) of the rest of each prompt, one-off
    keys ``(tenant, record id, k)`` (:func:`is_tail`): a prefix cache stores every full block of a
    prompt, so these one-off blocks compete for its room with the shared ones (what a simulation of
    the engine must see)."""
    b = _Builder("blocks", source)
    for rec in timed(records, source):
        labels: list[Hashable] = [(rec.tenant, h) for h in rec.prefix_block_ids]
        if tail_block is not None and rec.prompt_tokens:
            labels += [(rec.tenant, rec.id, k) for k in range(rec.prompt_tokens // tail_block - len(labels))]
        b.add(float(rec.arrival_offset_s or 0.0), labels, f"corpus:{rec.id}")
    return b.build()


def is_tail(label: Hashable) -> bool:
    """A one-off block of :func:`corpus_refs` ``(tails=True)``, not a shared one."""
    return isinstance(label, tuple) and len(label) == 3


def _from_records(path: str | Path, unit: Unit) -> RefTrace:
    from harness.load.results import RECORDS_FILE, read_records

    p = Path(path)
    if p.is_dir():
        p = p / RECORDS_FILE
    if unit != "entries":
        raise InputError(
            "a load run's records carry no KV block ids; use --unit entries", file=p, field="unit"
        )
    b = _Builder(unit, str(p))
    for r in read_records(p):
        b.add(r.sent_s, [(r.tenant or "", r.id)], f"records:{r.id}")
    return b.build()
