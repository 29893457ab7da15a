"""The run summary: ``summary.json``, one :class:`RunSummary` per run, computed from its records,
and how it is written, read and printed.

:func:`summarize` turns a run's :class:`~harness.load.results.RequestRecord` list, and what the run
knew besides (its target, inputs, stages, workers, client CPU, the target's telemetry …), into a
:class:`RunSummary`: one :class:`~harness.common.stats.Distribution` per field of
:data:`METRIC_FIELDS`, the hit rates (:func:`harness.load.results.hit_rates`), per-turn summaries,
tool-call counts, the agent sessions (:mod:`harness.load.session_summary`) and warnings (client
jitter, a saturated target, approximate token counting, unread stream fields); it marks the run
``client_bound`` when the client's CPU was saturated.
:func:`write_summary` writes ``summary.json`` atomically, :func:`read_summary` reads it back
validated, :func:`summary_table` formats its latencies for printing. Gathering a finished run's state
into :func:`summarize`'s arguments is :mod:`harness.load.summary`; the records, their file and the
hit definitions the summary counts by are :mod:`harness.load.results`.

Every percentile here is the project's one definition, :mod:`harness.common.stats`.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError

from harness.common.errors import InputError
from harness.common.fingerprint import Environment
from harness.common.host import HostLoad
from harness.common.io import check_input_file, validation_input_error, write_json
from harness.common.model import StrictModel
from harness.common.stats import Distribution, percentile
from harness.load.results import (
    BYTES_FIELDS,
    KIND_SPLIT_FIELDS,
    LATENCY_FIELDS,
    RequestRecord,
    hit_rates,
    metric_values,
)
from harness.load.session_summary import AgentSessions, agent_sessions

SCHEMA_VERSION: Literal[1] = 1
SUMMARY_FILE = "summary.json"
METRIC_FIELDS: tuple[str, ...] = (*LATENCY_FIELDS, "reasoning_tokens", *BYTES_FIELDS)
"""The record fields summarized in ``summary.json`` (``metrics``)."""

CLIENT_BOUND_LATENESS_MS = 5.0
"""p99 of the client's own lateness above this adds a ``client jitter:`` warning. It no longer marks
the run client-bound: the gates widen each latency interval by the client's own lateness instead."""
CLIENT_BOUND_CPU_PCT = 90.0
"""Client CPU above this marks the run ``client_bound`` (its measurements are suspect)."""


class InputRef(StrictModel):
    """A file a run read, identified by content."""

    path: str
    sha256: str

    @classmethod
    def of(cls, path: str | Path) -> InputRef:
        h = hashlib.sha256()
        with Path(path).open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
        return cls(path=str(path), sha256=h.hexdigest())


class TargetInfo(StrictModel):
    url: str
    model: str | None = None
    """The ``model`` the run's requests named (``None``: none was sent); :attr:`model_source` says
    where it came from."""
    model_source: Literal["option", "target"] | None = None
    """``option``: ``--model``; ``target``: the first id of the target's ``GET /v1/models``, asked at
    the start because no ``--model`` was given; ``None``: no model sent (the target lists none, or
    has no ``/v1/models``), or a summary from before this field."""
    api: Literal["chat", "completions"] = "chat"
    identity: dict[str, Any] | None = None
    """What the target says it is (:func:`target_identity` of its ``GET /v1/models`` answer); ``None``:
    it did not answer. ``harness gate`` compares it with the baseline's (docs/gates.md)."""


IDENTITY_MAX_MODELS = 8
IDENTITY_MAX_TEXT = 200
_VOLATILE_MODEL_KEYS = frozenset({"created", "object", "permission"})
"""Keys of a ``/v1/models`` entry that change with every server start (vLLM's ``permission`` holds
ids and timestamps): they identify nothing and would make two starts of one target differ."""


def _bounded(value: Any, depth: int = 0) -> Any:
    if isinstance(value, str):
        return value[:IDENTITY_MAX_TEXT]
    if isinstance(value, bool | int | float) or value is None:
        return value
    if depth >= 3:
        return str(value)[:IDENTITY_MAX_TEXT]
    if isinstance(value, dict):
        return {str(k)[:64]: _bounded(v, depth + 1) for k, v in list(value.items())[:32]}
    if isinstance(value, list | tuple):
        return [_bounded(v, depth + 1) for v in list(value)[:32]]
    return str(value)[:IDENTITY_MAX_TEXT]


def target_identity(models_answer: Any) -> dict[str, Any] | None:
    """The stable part of a ``GET /v1/models`` answer: ``{"models": [entry, …]}``, each entry as the
    server returned it (``id``, ``owned_by``, ``max_model_len``, our server's ``harness`` block …)
    without the per-start keys, bounded in size (8 models, short strings). ``None`` for an answer
    that is not an OpenAI model list."""
    data = models_answer.get("data") if isinstance(models_answer, dict) else None
    if not isinstance(data, list):
        return None
    models = [
        {k: _bounded(v) for k, v in entry.items() if k not in _VOLATILE_MODEL_KEYS}
        for entry in data[:IDENTITY_MAX_MODELS]
        if isinstance(entry, dict)
    ]
    return {"models": models}


class Recipe(StrictModel):
    """What load a run offered, from its options: equal recipes make comparable latencies.

    ``rate_of_capacity`` is for runs whose rate was given relative to a measured capacity: when two
    recipes both have it, it is compared instead of the absolute ``rate`` (which then depends on the
    machine)."""

    corpus_sha256: str | None = None
    schedule_sha256: str | None = None
    rate: float | None = None
    """``--rate`` (arrivals/s), ``None`` with a schedule."""
    rate_of_capacity: float | None = None
    arrival: str | None = None
    duration: float | None = None
    max_requests: int | None = None
    max_tokens_cap: int | None = None
    api: str | None = None
    speedup: float | None = None
    concurrency: int | None = None
    seed: int | None = None
    bypass_fraction: float | None = None
    history: Literal["live", "log"] | None = None
    """``--history`` of a session corpus's replay (``None``: not a session corpus)."""
    salt_per_pass: bool | None = None
    """``--salt-per-pass`` when given (``None`` when off, so that runs without it keep the recipe of
    baselines written before the field existed)."""


class StageOutcome(StrictModel):
    """One stage of a staged run (the warmup ladder), as it ended."""

    name: str
    target_rate: float
    """Arrivals per second the stage offered."""
    started_s: float
    ended_s: float
    requests: int = 0
    errors: int = 0
    failure_rate: float = 0.0
    tolerance: float = 1.0
    verdict: Literal["passed", "rolled_back", "stopped", "interrupted"] = "passed"
    rolled_back_to: str | None = None
    """The stage the ladder went back to, when this one exceeded its tolerance."""


class WorkerShare(StrictModel):
    """What one worker of a distributed run was given and what came back from it."""

    worker: int
    scheduled: int
    recorded: int
    missing: bool = False
    """The worker was lost; its share's unsent requests are not in the records."""


class PrecisionState(StrictModel):
    """How precisely one watched percentile is known (``--until-precision``, docs/load.md).

    The interval is :func:`harness.common.stats.percentile_interval` over the run's OK records;
    ``rel_half_width`` is :func:`harness.common.stats.relative_half_width` of it.
    """

    field: str
    """The record field (``ttft_ms`` …)."""
    q: float
    """The percentile (95 for P95)."""
    n: int
    """OK samples of the field."""
    min_n: int
    """Samples needed before it can be judged at all: the interval's both ends within the sample
    (:func:`harness.common.stats.min_samples_for_interval`), or ``--precision-min-samples`` if larger."""
    value: float | None = None
    lo: float | None = None
    """The interval's lower end; ``None`` while the sample is too small for it."""
    hi: float | None = None
    rel_half_width: float | None = None
    """``max(hi − value, value − lo) / value``; ``None`` while an end is unbounded."""
    target: float
    """The ``--until-precision`` it must reach (0.1 = ±10 %)."""
    met: bool


class ToolCallCounts(StrictModel):
    """The tool calls a run's responses made (``summary.json``: ``tool_calls``)."""

    requests: int
    """Responses with at least one tool call."""
    calls: int
    """Tool calls in all."""
    names: dict[str, int] = Field(default_factory=dict)
    """Calls per function name."""
    results: dict[str, int] = Field(default_factory=dict)
    """Tool results the session turns sent, by source (``recorded``, ``synthetic``, ``log_call``:
    :attr:`~harness.load.results.RequestRecord.tool_results`)."""

    @classmethod
    def of(cls, records: Iterable[RequestRecord]) -> ToolCallCounts | None:
        """The counts over ``records``; ``None`` when no response called a tool and no turn sent a result."""
        requests = calls = 0
        names: Counter[str] = Counter()
        results: Counter[str] = Counter()
        for r in records:
            if r.tool_calls:
                requests += 1
                calls += r.tool_calls
                names.update(r.tool_names)
            if r.tool_results:
                results.update(r.tool_results)
        if not calls and not results:
            return None
        return cls(requests=requests, calls=calls, names=dict(sorted(names.items())),
                   results=dict(sorted(results.items())))  # fmt: skip


class TurnSummary(StrictModel):
    """One turn index of a session run: how TTFT, cached tokens and hits go as conversations grow."""

    turn: int
    requests: int
    errors: int
    ttft_ms: Distribution
    prompt_tokens: Distribution
    cached_tokens: Distribution
    cached_share: float | None = None
    """Sum of cached tokens / sum of prompt tokens over the turn's requests that reported both."""
    hit_rate: dict[str, float] = Field(default_factory=dict)
    """As :attr:`RunSummary.hit_rate`, over this turn's requests."""


def turn_summaries(records: Iterable[RequestRecord]) -> list[TurnSummary]:
    """Per turn index, over the records that carry one (``[]`` for a run without sessions)."""
    by_turn: dict[int, list[RequestRecord]] = {}
    for r in records:
        if r.turn is not None:
            by_turn.setdefault(r.turn, []).append(r)
    out: list[TurnSummary] = []
    for turn in sorted(by_turn):
        rs = by_turn[turn]
        both = [
            (r.prompt_tokens, r.cached_tokens) for r in rs if r.prompt_tokens and r.cached_tokens is not None
        ]
        out.append(
            TurnSummary(
                turn=turn,
                requests=len(rs),
                errors=sum(not r.ok for r in rs),
                ttft_ms=Distribution.of(metric_values(rs, "ttft_ms")),
                prompt_tokens=Distribution.of(metric_values(rs, "prompt_tokens")),
                cached_tokens=Distribution.of(metric_values(rs, "cached_tokens")),
                cached_share=sum(c for _, c in both) / sum(p for p, _ in both) if both else None,
                hit_rate=hit_rates(rs),
            )
        )
    return out


class ServerPhase(StrictModel):
    """The target's own counters over one phase of a run (``summary.json``: ``server_metrics``).

    Deltas of the prefix-cache counters from the last scrape at or before the phase's start to the
    last at or before its end (:func:`harness.load.server_metrics.counter_delta`): exact as the server
    counted them, with the phase's edges known to one scrape interval. ``None``: the server does not
    report it, or fewer than two scrapes fell in reach."""

    name: str
    """The phase: the run's stage label (``cold``, ``warm``, ``replay``), a ladder stage, or ``run``."""
    started_s: float | None = None
    """Seconds since the epoch (``None``: the run's first scrape)."""
    ended_s: float | None = None
    """``None``: the run's last scrape."""
    scrapes: int = 0
    prefix_queries: float | None = None
    """Prompt tokens the server looked up in its prefix cache during the phase."""
    prefix_hits: float | None = None
    """Of those, the tokens its prefix cache held."""
    prefix_hit_rate: float | None = None
    """``prefix_hits / prefix_queries``: the server's prefix hit rate (token-weighted)."""
    running_max: float | None = None
    waiting_max: float | None = None
    kv_usage_max: float | None = None
    """The KV cache's largest used share (0–1) seen."""


class ServerTelemetry(StrictModel):
    """What the target's ``/metrics`` said during the run (:mod:`harness.load.telemetry`)."""

    file: str
    """The scrapes, one a line, beside ``records.jsonl`` (``server_metrics.jsonl``)."""
    kind: str | None = None
    """The server kind detected (``harness``, ``vllm``, ``sglang``, ``llamacpp``, ``tgi``); ``None``:
    no scrape succeeded."""
    interval_s: float
    scrapes: int = 0
    """Scrapes attempted."""
    failed: int = 0
    error: str | None = None
    """The first failure (404: no ``/metrics``; a refused credential …)."""
    gpu: bool = False
    """Lines carry the local GPUs (NVML)."""
    total: ServerPhase
    """The whole run."""
    phases: list[ServerPhase] = Field(default_factory=list)
    """The run's phases: its stage label, or the ladder's stages."""

    def phase(self, name: str | None) -> ServerPhase | None:
        """The phase called ``name`` (``None``: the whole run)."""
        if name is None:
            return self.total
        return next((p for p in self.phases if p.name == name), None)


class TargetDeath(StrictModel):
    """The target died during the run (:mod:`harness.load.liveness`): its requests stopped being
    answered and its health check then proved it gone. Times are seconds from the run's epoch."""

    detected_s: float
    """When the health check found it dead (sending stopped then)."""
    failing_since_s: float | None
    """``sent_s`` of the first request of the final streak of failed ones."""
    last_ok_s: float | None
    """``sent_s`` of the last request that succeeded (``None``: none did; it was alive at the start)."""
    failed_in_a_row: int
    """Requests in a row that failed on the target's side (no answer, a 5xx, a stream that carried the
    server's error or broke off: :func:`harness.load.liveness.unanswered`) when it was found dead."""
    last_error: str | None = None
    """What the last of them saw (``ConnectionRefusedError: …``, ``HTTP 500: …``)."""
    evidence: str
    """The health check's answer (``GET /health: ConnectionRefusedError: …``, ``… answered 503``)."""

    def describe(self) -> str:
        """One line: what died, when, and the evidence."""
        since = f" from {self.failing_since_s:.1f} s on" if self.failing_since_s is not None else ""
        ok = f", last success sent at {self.last_ok_s:.1f} s" if self.last_ok_s is not None else ""
        return (
            f"the target died during the run: {self.failed_in_a_row} requests in a row failed on its side"
            f"{since}{ok}; {self.evidence}"
        )


class RunSummary(StrictModel):
    """``summary.json``: the run's totals, computed from its records (see :func:`summarize`)."""

    schema_version: Literal[1] = SCHEMA_VERSION
    requests: int
    errors: int
    metrics: dict[str, Distribution]
    """``metrics.<field>.{n, p50, p90, p95, p99, max, mean, …}`` for every field in :data:`METRIC_FIELDS`."""
    hit_rate: dict[str, float]
    """Share of requests answered by each ``x-cache`` status, plus ``any`` (any ``HIT-*``) and
    ``prefix`` (share of requests with ``cached_tokens > 0``). Empty when the target sends neither."""
    target_rate: float | None = None
    """Arrivals per second the schedule offered: requests, or with a session corpus, session starts
    (``None``: no schedule, closed loop)."""
    achieved_rate: float
    """Requests sent per second of the send window."""
    client_cpu_pct: float | None = None
    client_bound: bool = False
    interrupted: bool = False
    started_at: str
    """ISO 8601 wall time of the epoch."""
    duration_s: float
    target: TargetInfo
    corpus: InputRef | None = None
    schedule: InputRef | None = None
    stages: list[StageOutcome] = Field(default_factory=list)
    workers: list[WorkerShare] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
    token_counting: dict[str, int] = Field(default_factory=dict)
    """Requests per token counting mode (``usage``, ``logprobs``, ``tokenizer``, ``final-usage``,
    ``chunks``); the last two make ITL/TPOT approximate and add a warning."""
    warmup_id: str | None = None
    """The run's ``X-Warmup-ID``."""
    plan: InputRef | None = None
    """The warmup ladder plan, for ladder runs."""
    preload: dict[str, int] | None = None
    """The server's answer to ``POST /cache/preload`` (``lines``, ``stored``, ``generated``, ``failed``)."""
    environment: Environment | None = None
    """The machine and software that measured the run (:mod:`harness.common.fingerprint`)."""
    interference: HostLoad | None = None
    """How much of the machine other work took while the run measured (:mod:`harness.common.host`);
    ``None``: not measured (not Linux, a loopback target whose process is hidden, an old summary)."""
    recipe: Recipe | None = None
    """The load offered (corpus, schedule or rate, max tokens …), from the run's options."""
    stop_reason: str | None = None
    """Why sending stopped, for runs with ``--until-precision`` or ``--max-duration`` (``precision
    reached: …``, ``max duration 300 s reached before precision: …``, ``schedule ended before
    precision: …``); ``None`` for other runs."""
    precision: dict[str, PrecisionState] | None = None
    """Each watched percentile (``"ttft_ms:95"`` …) over every OK record of the run, as it ended."""
    sessions: int | None = None
    """Sessions the records hold (a session corpus); ``None`` otherwise."""
    turns: list[TurnSummary] = Field(default_factory=list)
    """Per turn index (a session corpus): TTFT, prompt and cached tokens, hit rates."""
    server_metrics: ServerTelemetry | None = None
    """The target's own telemetry (``server_metrics.jsonl``) summed up per phase; ``None``: not
    scraped (``--server-metrics-interval 0``, or a summary from before it)."""
    target_died: TargetDeath | None = None
    """Set when the target died during the run (:mod:`harness.load.liveness`): the errors after it are
    the death's, not the requests'; the run exits 7."""
    tool_calls: ToolCallCounts | None = None
    """The tool calls the responses made and the tool results session turns sent; ``None``: none."""
    reasoning_counting: dict[str, int] = Field(default_factory=dict)
    """Requests with thinking tokens, by where their count came from: ``usage`` (the target reported
    ``completion_tokens_details.reasoning_tokens``) or ``counted`` (the client, as ``token_counting``
    says). Empty: no request had thinking tokens."""
    agent_sessions: AgentSessions | None = None
    """Agent sessions replayed as call graphs (:mod:`harness.load.session_summary`); ``None``: none."""


APPROXIMATE_COUNTING = ("final-usage", "chunks")


def summarize(
    records: list[RequestRecord],
    *,
    started_at: str,
    duration_s: float,
    target: TargetInfo,
    target_rate: float | None = None,
    client_cpu_pct: float | None = None,
    interrupted: bool = False,
    corpus: InputRef | None = None,
    schedule: InputRef | None = None,
    stages: list[StageOutcome] | None = None,
    workers: list[WorkerShare] | None = None,
    warnings: list[str] | None = None,
    warmup_id: str | None = None,
    plan: InputRef | None = None,
    preload: dict[str, int] | None = None,
    environment: Environment | None = None,
    interference: HostLoad | None = None,
    recipe: Recipe | None = None,
    stop_reason: str | None = None,
    precision: dict[str, PrecisionState] | None = None,
    server_metrics: ServerTelemetry | None = None,
    target_died: TargetDeath | None = None,
) -> RunSummary:
    """The :class:`RunSummary` of ``records``; marks the run ``client_bound`` (the client's CPU was
    saturated) and warns about client jitter and a saturated target."""
    warnings = list(warnings or [])
    metrics = {name: Distribution.of(metric_values(records, name)) for name in METRIC_FIELDS}
    if records:
        first = min(r.sent_s for r in records)
        last = max(r.sent_s for r in records)
        window = last - first
        achieved = (len(records) - 1) / window if window > 0 else math.nan
    else:
        achieved = 0.0
    # Only the client's own state makes a run client-bound: a starved CPU. Its own lateness (jitter)
    # widens the gates' latency intervals instead; waiting for a busy user is the target's doing.
    own_p99 = metrics["client_lateness_ms"].p99
    client_bound = False
    if own_p99 is not None and own_p99 > CLIENT_BOUND_LATENESS_MS:
        warnings.append(
            f"client jitter: p99 of the client's own lateness {own_p99:.1f} ms > "
            f"{CLIENT_BOUND_LATENESS_MS:g} ms (the pacer or a user woke late: the client's CPU or "
            "scheduling); the latency gates' intervals are widened by it"
        )
    waited = [r.queue_wait_ms for r in records if r.queue_wait_ms]
    if waited:
        warnings.append(
            f"saturated: {len(waited)} of {len(records)} requests waited for a free user (p99 wait "
            f"{percentile(waited, 99):.1f} ms): the target did not keep up; the *_from_intended "
            "latencies include the wait"
        )
    if client_cpu_pct is not None and client_cpu_pct > CLIENT_BOUND_CPU_PCT:
        client_bound = True
        warnings.append(f"client-bound: client CPU {client_cpu_pct:.0f} % > {CLIENT_BOUND_CPU_PCT:g} %")
    counting = Counter(r.token_counting for r in records if r.token_counting is not None)
    approx = sum(counting[m] for m in APPROXIMATE_COUNTING)
    if approx:
        modes = ", ".join(f"{m}: {counting[m]}" for m in APPROXIMATE_COUNTING if counting[m])
        warnings.append(
            f"ITL/TPOT approximate for {approx} of {len(records)} requests ({modes}): the target sent no "
            "per-chunk token counts (use a server with continuous_usage_stats, --token-counting logprobs, "
            "or --tokenizer)"
        )
    unread: Counter[str] = Counter(f for r in records for f in r.unread_fields)
    if unread:
        fields_ = ", ".join(f"{f}: {n}" for f, n in sorted(unread.items()))
        warnings.append(
            f"unread stream fields: {sum(1 for r in records if r.unread_fields)} of {len(records)} responses "
            f"carried delta fields the client does not read ({fields_}); their tokens were neither timed "
            "nor counted"
        )
    return RunSummary(
        requests=len(records),
        errors=sum(not r.ok for r in records),
        metrics=metrics,
        hit_rate=hit_rates(records),
        target_rate=target_rate,
        achieved_rate=0.0 if math.isnan(achieved) else achieved,
        client_cpu_pct=client_cpu_pct,
        client_bound=client_bound,
        interrupted=interrupted,
        started_at=started_at,
        duration_s=duration_s,
        target=target,
        corpus=corpus,
        schedule=schedule,
        stages=stages or [],
        workers=workers or [],
        warnings=warnings,
        token_counting=dict(sorted(counting.items())),
        warmup_id=warmup_id,
        plan=plan,
        preload=preload,
        environment=environment,
        interference=interference,
        recipe=recipe,
        stop_reason=stop_reason,
        precision=precision,
        sessions=len({r.session_id for r in records if r.session_id is not None}) or None,
        turns=turn_summaries(records),
        server_metrics=server_metrics,
        target_died=target_died,
        tool_calls=ToolCallCounts.of(records),
        reasoning_counting=dict(
            sorted(
                Counter(
                    r.reasoning_source for r in records if r.reasoning_tokens and r.reasoning_source
                ).items()
            )
        ),
        agent_sessions=agent_sessions(records),
    )


def write_summary(run_dir: str | Path, summary: RunSummary) -> Path:
    """Write ``summary.json`` atomically; returns its path."""
    path = Path(run_dir) / SUMMARY_FILE
    write_json(path, summary.model_dump(mode="json"))
    return path


def summary_table(metrics: dict[str, Distribution]) -> list[list[str]]:
    """Rows ``[metric, n, p50, p90, p95, p99, max, mean]`` of the latency metrics, formatted (and of
    ``reasoning_tokens`` when any request thought; the ITL splits by kind when they have samples)."""

    def fmt(v: float | None) -> str:
        return "–" if v is None else f"{v:.1f}" if abs(v) >= 100 else f"{v:.2f}"

    rows: list[list[str]] = []
    for name in (*LATENCY_FIELDS, "reasoning_tokens"):
        d = metrics.get(name)
        if d is None or (not d.n and name in (*KIND_SPLIT_FIELDS, "reasoning_tokens")):
            continue  # a run without thinking has no kind split to show
        if name == "reasoning_tokens" and not d.max:
            continue
        rows.append([name, str(d.n), *(fmt(x) for x in (d.p50, d.p90, d.p95, d.p99, d.max, d.mean))])
    return rows


def read_summary(run_dir: str | Path) -> RunSummary:
    """The validated ``summary.json`` of a run directory (or the file itself)."""
    p = Path(run_dir)
    if p.is_dir():
        p = p / SUMMARY_FILE
    check_input_file(p)
    try:
        return RunSummary.model_validate_json(p.read_bytes())
    except ValidationError as exc:
        raise validation_input_error(exc, file=p, expected="a run summary") from None
    except ValueError as exc:  # not JSON at all
        raise InputError(f"not a run summary: {exc}", file=p) from None
