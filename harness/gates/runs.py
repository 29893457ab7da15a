"""Result sets as the gates and reports read them: a labelled run directory, its records as columns.

A run directory (written by the load stage, :mod:`harness.load.results`) holds ``records.jsonl``
and ``summary.json``. The gates compute every number from the records (the summary carries no
intervals) and take from the summary only what the records cannot say: whether the run was
interrupted or client-bound, and whether a worker of a distributed run was lost.

Records are held as columns (:class:`RunFrame`, one NumPy array per field, NaN where a record has
no value) rather than as a list of models, so a run of a few hundred thousand requests fits in a
few tens of MB and a selection (a scenario, a stage) is a boolean mask.

Labels: ``harness gate`` and ``harness report`` take ``LABEL=DIR`` or ``DIR`` (labelled by the
directory's name). A paired run (``harness run``) hands over two sets labelled ``cold`` and
``warm``; a baseline gate with ``phase: cold`` applies to the set labelled ``cold``.

**Fail closed.** Anything that makes a run's numbers untrustworthy becomes a *problem* of the result
set (:attr:`ResultSet.problems`); a gate on a set with problems cannot pass.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from harness.common.errors import InputError
from harness.load.results import (
    BYTES_FIELDS,
    RECORDS_FILE,
    STREAM_LATENCY_FIELDS,
    TOKEN_FIELDS,
    RequestRecord,
    cache_hit,
    cache_told,
    prefix_hit,
    read_records,
)
from harness.load.run_summary import SUMMARY_FILE, RunSummary, ServerTelemetry, read_summary
from harness.load.session_summary import session_outcomes

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
ObjArray = npt.NDArray[np.object_]

RECORD_FLOAT_COLUMNS: tuple[str, ...] = (
    "intended_s",
    "sent_s",
    "lateness_ms",
    "queue_wait_ms",
    *STREAM_LATENCY_FIELDS,
    *TOKEN_FIELDS,
    *BYTES_FIELDS,
)
"""Numeric record fields kept as float64 columns (NaN: the record has no value; byte counts stay
exact below 2⁵³)."""
SESSION_COLUMNS: tuple[str, ...] = ("session_makespan_ms", "session_ok")
"""Per agent session (:func:`harness.load.session_summary.session_outcomes`, the summary's own), on
the row of its first record and NaN on every other: its makespan, and 1 / 0 whether every call
succeeded. A session is one sample of the session metrics, so it is one row: a selection, a bootstrap
or a pool then takes or repeats whole sessions, as it does requests."""
FLOAT_COLUMNS: tuple[str, ...] = (*RECORD_FLOAT_COLUMNS, *SESSION_COLUMNS)
"""Every float64 column of a :class:`RunFrame`."""
TEXT_COLUMNS: tuple[str, ...] = ("id", "scenario", "stage", "cache")
"""Text record fields kept as object columns (``id``: the corpus record id, which pairs the same
request across two runs: ``harness ab``)."""

_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


@dataclass(frozen=True)
class RunFrame:
    """The records of one run as columns, one row per request, in file order.

    ``nonfinite`` marks samples that were NaN or ±inf *in the file* (as opposed to absent, which is
    also NaN in the column): a measurement that is not a number is a broken measurement, and the
    gates refuse to judge a metric computed from one, where :func:`~harness.common.stats.percentile`
    would silently drop it.
    """

    floats: dict[str, FloatArray]
    text: dict[str, ObjArray]
    status: npt.NDArray[np.int64]
    ok: BoolArray
    peak_measured: npt.NDArray[np.int8]
    """1 measured, 0 estimated, -1 not reported."""
    worker: npt.NDArray[np.int64]
    nonfinite: dict[str, BoolArray] = field(default_factory=dict)
    server: ServerTelemetry | None = None
    """The target's own counters during the run (``summary.json``: ``server_metrics``); ``None``: not
    scraped. Server-wide: a selection by stage picks that phase's, one by scenario has none."""
    server_stage: str | None = None
    """The stage :meth:`select` narrowed to (``None``: the whole run)."""
    server_scenario: str | None = None
    """The scenario :meth:`select` narrowed to: server counters cannot be split by it."""
    kv_measured: npt.NDArray[np.int8] | None = None
    """Per row, whether ``prefill_kv_bytes`` was counted by the engine's block manager: 1 measured,
    0 not, -1 not reported (``None``: no row says)."""
    itl: ObjArray | None = None
    """Each row's inter-token gaps (ms) as a float array (``None``: not kept; :meth:`gaps` is then
    empty): the per-token ITL gates pool them, and resample whole requests."""

    @property
    def n(self) -> int:
        return int(self.status.size)

    def col(self, name: str) -> FloatArray:
        """A numeric column (NaN where absent)."""
        return self.floats[name]

    def bad(self, name: str) -> BoolArray:
        """Rows whose ``name`` was NaN or infinite in the file."""
        mask = self.nonfinite.get(name)
        return mask if mask is not None else np.zeros(self.n, dtype=bool)

    def take(self, rows: BoolArray | npt.NDArray[np.intp]) -> RunFrame:
        """The rows a boolean mask or an index array picks (indices may repeat)."""
        return RunFrame(
            floats={k: v[rows] for k, v in self.floats.items()},
            text={k: v[rows] for k, v in self.text.items()},
            status=self.status[rows],
            ok=self.ok[rows],
            peak_measured=self.peak_measured[rows],
            worker=self.worker[rows],
            nonfinite={k: v[rows] for k, v in self.nonfinite.items()},
            server=self.server,
            server_stage=self.server_stage,
            server_scenario=self.server_scenario,
            itl=self.itl[rows] if self.itl is not None else None,
            kv_measured=self.kv_measured[rows] if self.kv_measured is not None else None,
        )

    def gaps(self) -> ObjArray:
        """Each row's inter-token gaps (an empty array for a row with none)."""
        if self.itl is not None:
            return self.itl
        out = np.empty(self.n, dtype=object)
        out[:] = [_NO_GAPS] * self.n
        return out

    def sample(self, rng: np.random.Generator, n: int) -> RunFrame:
        """``n`` rows drawn with replacement: a bootstrap replicate of the run."""
        return self.take(rng.integers(0, self.n, size=n))

    def select(self, *, scenario: str | None = None, stage: str | None = None) -> RunFrame:
        """The rows of one scenario and/or stage (``None``: any)."""
        if scenario is None and stage is None:
            return self
        mask = np.ones(self.n, dtype=bool)
        if scenario is not None:
            mask &= self.text["scenario"] == scenario
        if stage is not None:
            mask &= self.text["stage"] == stage
        picked = self.take(mask)
        return replace(
            picked,
            server_stage=stage if stage is not None else self.server_stage,
            server_scenario=scenario if scenario is not None else self.server_scenario,
        )

    def cache_told(self) -> BoolArray:
        """Rows whose response carried an ``x-cache`` header (:func:`harness.load.results.cache_told`)."""
        return cache_told(self.text["cache"])

    def cache_hit(self, tier: str | None = None) -> BoolArray:
        """Rows answered by response-cache ``tier`` (``HIT-L1`` …), or by any tier (``HIT-*``): the one
        definition, :func:`harness.load.results.cache_hit`."""
        return cache_hit(self.text["cache"], tier)

    def prefix_hit(self) -> tuple[BoolArray, BoolArray]:
        """``(reported, hit)``: rows that reported ``cached_tokens``, and those with ``cached_tokens > 0``
        (:func:`harness.load.results.prefix_hit`)."""
        return prefix_hit(self.col("cached_tokens"))

    def values(self, name: str) -> list[str]:
        """Distinct non-null values of a text column, in first-seen order."""
        seen: dict[str, None] = {}
        for v in self.text[name]:
            if v is not None:
                seen.setdefault(str(v), None)
        return list(seen)

    @classmethod
    def from_columns(
        cls,
        n: int,
        *,
        floats: dict[str, FloatArray] | None = None,
        text: dict[str, Sequence[str | None]] | None = None,
        ok: BoolArray | None = None,
        itl: Sequence[Sequence[float]] | None = None,
    ) -> RunFrame:
        """A frame of ``n`` successful requests from arrays (simulations; absent columns are NaN/None;
        ``itl``: each request's inter-token gaps)."""
        floats = floats or {}
        text = text or {}
        unknown = (set(floats) - set(FLOAT_COLUMNS)) | (set(text) - set(TEXT_COLUMNS))
        if unknown:
            raise ValueError(f"unknown columns: {', '.join(sorted(unknown))}")
        ok_arr = np.ones(n, dtype=bool) if ok is None else np.asarray(ok, dtype=bool)
        return cls(
            floats={
                k: np.asarray(floats.get(k, np.full(n, np.nan)), dtype=np.float64) for k in FLOAT_COLUMNS
            },
            text={k: _object_array(text.get(k, [None] * n)) for k in TEXT_COLUMNS},
            status=np.where(ok_arr, 200, 500).astype(np.int64),
            ok=ok_arr,
            peak_measured=np.full(n, -1, dtype=np.int8),
            worker=np.zeros(n, dtype=np.int64),
            itl=_ragged(itl) if itl is not None else None,
        )

    @classmethod
    def from_records(cls, records: Iterable[RequestRecord]) -> RunFrame:
        """Columns from validated records."""
        floats: dict[str, list[float]] = {k: [] for k in FLOAT_COLUMNS}
        text: dict[str, list[str | None]] = {k: [] for k in TEXT_COLUMNS}
        status: list[int] = []
        ok: list[bool] = []
        peak: list[int] = []
        worker: list[int] = []
        itl: list[list[float]] = []
        kv: list[int] = []
        nonfinite_rows: dict[str, list[int]] = {}
        graph: list[RequestRecord] = []
        first_row: dict[str, int] = {}
        for i, r in enumerate(records):
            itl.append(r.itl_ms)
            kv.append(-1 if r.prefill_kv_measured is None else int(r.prefill_kv_measured))
            if r.call is not None and r.session_id is not None:
                # Kept without its token gaps (copied to ``itl`` already): a session needs its times.
                graph.append(replace(r, itl_ms=[], itl_reasoning=[]))
                first_row.setdefault(r.session_id, i)
            for k in RECORD_FLOAT_COLUMNS:
                v = getattr(r, k)
                if v is None:
                    floats[k].append(math.nan)
                    continue
                fv = float(v)
                if not math.isfinite(fv):
                    nonfinite_rows.setdefault(k, []).append(i)
                floats[k].append(fv)
            for k in TEXT_COLUMNS:
                text[k].append(getattr(r, k))
            status.append(r.status)
            ok.append(r.ok)
            peak.append(-1 if r.peak_measured is None else int(r.peak_measured))
            worker.append(r.worker)
        n = len(status)
        for k in SESSION_COLUMNS:
            floats[k] = [math.nan] * n
        for o in session_outcomes(graph):
            row = first_row[o.session_id]
            floats["session_makespan_ms"][row] = o.makespan_ms
            floats["session_ok"][row] = float(o.ok)
            if not math.isfinite(o.makespan_ms):  # a broken time in one of its calls: refused, not dropped
                nonfinite_rows.setdefault("session_makespan_ms", []).append(row)
        nonfinite: dict[str, BoolArray] = {}
        for k, rows in nonfinite_rows.items():
            mask = np.zeros(n, dtype=bool)
            mask[rows] = True
            nonfinite[k] = mask
        return cls(
            floats={k: np.asarray(v, dtype=np.float64) for k, v in floats.items()},
            text={k: _object_array(v) for k, v in text.items()},
            status=np.asarray(status, dtype=np.int64),
            ok=np.asarray(ok, dtype=bool),
            peak_measured=np.asarray(peak, dtype=np.int8),
            worker=np.asarray(worker, dtype=np.int64),
            nonfinite=nonfinite,
            itl=_ragged(itl),
            kv_measured=np.asarray(kv, dtype=np.int8),
        )


_NO_GAPS: FloatArray = np.zeros(0, dtype=np.float64)


def _ragged(rows: Sequence[Sequence[float]]) -> ObjArray:
    """One float array per row, in an object array (a row's gaps stay together when rows are taken)."""
    out = np.empty(len(rows), dtype=object)
    out[:] = [np.asarray(r, dtype=np.float64) if len(r) else _NO_GAPS for r in rows]
    return out


def _object_array(values: Sequence[str | None]) -> ObjArray:
    arr = np.empty(len(values), dtype=object)
    arr[:] = values
    return arr


@dataclass(frozen=True)
class ResultSet:
    """One labelled run: where it is, its summary (``None`` when it never finished), its records."""

    label: str
    path: Path
    summary: RunSummary | None
    frame: RunFrame
    problems: tuple[str, ...] = ()
    """Why this run cannot be judged (empty: it can)."""

    @property
    def judgeable(self) -> bool:
        return not self.problems


def run_problems(summary: RunSummary | None, frame: RunFrame) -> list[str]:
    """Why a run cannot be judged, from its summary (fail closed: a missing summary is a problem)."""
    if summary is None:
        return [f"no {SUMMARY_FILE}: the run did not finish (interrupted? client-bound? unknown)"]
    problems: list[str] = []
    if summary.interrupted:
        problems.append("the run was interrupted (summary.json: interrupted)")
    if summary.target_died is not None:
        # Its errors are the death's, not the load's: judging them would call a crash a regression.
        problems.append(f"{summary.target_died.describe()} (summary.json: target_died)")
    if summary.client_bound:
        why = [w for w in summary.warnings if w.startswith("client-bound")]
        problems.append(
            "the run was client-bound (summary.json: client_bound): "
            + ("; ".join(why) if why else "the client, not the target, set the pace")
        )
    lost = [w.worker for w in summary.workers if w.missing]
    if lost:
        problems.append(
            f"worker(s) {', '.join(map(str, lost))} were lost; their share of the schedule is missing"
        )
    if summary.requests != frame.n:
        problems.append(
            f"{SUMMARY_FILE} counts {summary.requests} requests but {RECORDS_FILE} holds {frame.n}"
        )
    return problems


def load_result_set(path: str | Path, label: str | None = None) -> ResultSet:
    """Read a run directory; ``label`` defaults to the directory's name.

    Raises :class:`InputError` when ``path`` is not a run directory or a file in it is malformed; a
    run that is readable but untrustworthy (interrupted, client-bound, unfinished) loads with
    :attr:`ResultSet.problems` set instead.
    """
    p = Path(path)
    if not p.exists():
        raise InputError("no such results directory", file=p)
    if not p.is_dir():
        raise InputError(
            "is not a directory, expected a run directory (records.jsonl + summary.json)", file=p
        )
    records_path, summary_path = p / RECORDS_FILE, p / SUMMARY_FILE
    if not records_path.exists() and not summary_path.exists():
        raise InputError(f"not a run directory: neither {RECORDS_FILE} nor {SUMMARY_FILE} is there", file=p)
    name = label if label is not None else (p.resolve().name or "run")
    if not _LABEL.match(name):
        raise InputError(
            f"{name!r} cannot label a result set (letters, digits, '_', '.', '-')",
            file=p,
            hint="pass LABEL=DIR",
        )
    summary = read_summary(summary_path) if summary_path.exists() else None
    problems: list[str] = []
    if records_path.exists():
        frame = RunFrame.from_records(read_records(records_path))
        if summary is not None and summary.server_metrics is not None:
            frame = replace(frame, server=summary.server_metrics)
    else:
        frame = RunFrame.from_records([])
        problems.append(f"no {RECORDS_FILE}: nothing to measure")
    problems += run_problems(summary, frame)
    return ResultSet(label=name, path=p, summary=summary, frame=frame, problems=tuple(problems))


def parse_result_arg(arg: str) -> tuple[str | None, Path]:
    """``LABEL=DIR`` → ``(LABEL, DIR)``; ``DIR`` → ``(None, DIR)`` (an existing path wins)."""
    if "=" in arg and not Path(arg).exists():
        label, _, rest = arg.partition("=")
        if _LABEL.match(label) and rest:
            return label, Path(rest)
    return None, Path(arg)


def load_result_sets(args: Sequence[str | Path | tuple[str, str | Path]]) -> list[ResultSet]:
    """Several result sets from ``LABEL=DIR`` / ``DIR`` strings or ``(label, dir)`` pairs.

    Labels must be unique (a gate's ``phase`` names one).
    """
    sets: list[ResultSet] = []
    for arg in args:
        if isinstance(arg, tuple):
            label: str | None = arg[0]
            path = Path(arg[1])
        elif isinstance(arg, Path):
            label, path = None, arg
        else:
            label, path = parse_result_arg(arg)
        rs = load_result_set(path, label)
        if any(other.label == rs.label for other in sets):
            raise InputError(
                f"two result sets are labelled {rs.label!r}", file=path, hint="name them LABEL=DIR"
            )
        sets.append(rs)
    if not sets:
        raise InputError("no result sets given")
    return sets


def pooled_set(sets: Sequence[ResultSet], label: str) -> ResultSet:
    """Several runs of one target as one labelled set: their records concatenated (``harness ab``'s
    blocks of one arm), the first run's summary (its machine and target; the counters of one run are
    not the pool's, so none), and every run's problems, each naming its run."""
    if not sets:
        raise ValueError("no result sets to pool")
    frames = [rs.frame for rs in sets]

    def cat(arrays: Sequence[npt.NDArray[Any]]) -> npt.NDArray[Any]:
        return np.concatenate(arrays) if arrays else np.empty(0)

    itl: ObjArray | None = None
    if all(f.itl is not None for f in frames):
        itl = np.empty(sum(f.n for f in frames), dtype=object)
        itl[:] = [g for f in frames for g in f.gaps()]
    kv = [f.kv_measured for f in frames]
    frame = RunFrame(
        floats={k: cat([f.floats[k] for f in frames]) for k in frames[0].floats},
        text={k: cat([f.text[k] for f in frames]) for k in frames[0].text},
        status=cat([f.status for f in frames]),
        ok=cat([f.ok for f in frames]),
        peak_measured=cat([f.peak_measured for f in frames]),
        worker=cat([f.worker for f in frames]),
        nonfinite={k: cat([f.bad(k) for f in frames]) for k in {k for f in frames for k in f.nonfinite}},
        itl=itl,
        kv_measured=cat([k for k in kv if k is not None]) if all(k is not None for k in kv) else None,
    )
    problems = tuple(f"{rs.path}: {p}" for rs in sets for p in rs.problems)
    return ResultSet(
        label=label, path=sets[0].path.parent, summary=sets[0].summary, frame=frame, problems=problems
    )
