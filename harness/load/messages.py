"""Master ↔ worker messages of a distributed run, and the master's view of its workers.

Everything that crosses between Locust processes is written and read here, so the wire format has one
place:

* at the start, the master puts the run's epoch, warmup id, worker indexes, the model the requests
  name when ``--model`` names none (the target's, asked once) and (a ladder) its first rate segments
  on ``parsed_options``, which Locust ships to every worker with its spawn message
  (:func:`publish_start`, read back by :func:`read_start`);
* ``harness_records`` (worker → master, once a second): a :class:`Batch` of records and the worker's
  progress;
* ``harness_segments`` (master → workers): new ladder rate segments (a rollback, the end);
* ``harness_stop`` (master → workers): release no more arrivals (``--until-precision`` was met).

Ladder segments travel as lists (msgpack has no dataclasses); :func:`encode_segments` and
:func:`decode_segments` are the one codec.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from harness.load.arrivals import Segment
from harness.load.results import RequestRecord
from harness.load.run_summary import WorkerShare

if TYPE_CHECKING:  # locust only for annotations: importing it monkey-patches the process (gevent)
    from locust.runners import MasterRunner, Runner

Role = Literal["local", "master", "worker"]
"""A process's part in a run: a single local process, or the master or a worker of a distributed one."""

MSG_RECORDS = "harness_records"
"""Worker → master: a :class:`Batch`."""
MSG_SEGMENTS = "harness_segments"
"""Master → workers: the ladder's new rate segments, and whether they are the last."""
MSG_STOP = "harness_stop"
"""Master → workers: release no more arrivals (``--until-precision`` was met); in-flight ones drain."""


# ------------------------------------------------------------------------------------------ codec


def encode_segments(segs: Iterable[Segment]) -> list[list[Any]]:
    """Segments as msgpack can carry them: ``[start_s, end_s, rate, stage]`` each."""
    return [[s.start_s, s.end_s, s.rate, s.stage] for s in segs]


def decode_segments(raw: Iterable[Sequence[Any]]) -> list[Segment]:
    """The inverse of :func:`encode_segments`."""
    return [Segment(float(a), float(b), float(r), s) for a, b, r, s in raw]


@dataclass(frozen=True)
class Batch:
    """A worker's records since its last batch, and its progress (``harness_records``)."""

    worker: int
    records: list[RequestRecord]
    sent: int
    """Arrivals the worker's pacer released so far."""
    scheduled: int | None
    """The worker's share of the arrivals (``None``: open-ended, e.g. a ladder)."""
    cpu_pct: float | None
    done: bool
    """The worker's share is sent and answered (or its drain timed out)."""

    def to_wire(self) -> dict[str, Any]:
        return {
            "worker": self.worker,
            "rows": [r.to_dict() for r in self.records],
            "sent": self.sent,
            "scheduled": self.scheduled,
            "cpu_pct": self.cpu_pct,
            "done": self.done,
        }

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> Batch:
        sched = data.get("scheduled")
        return cls(
            worker=int(data["worker"]),
            # A worker's records, made by our own code: rebuilt as they were, not validated again.
            records=[RequestRecord(**row) for row in data.get("rows") or []],
            sent=int(data.get("sent") or 0),
            scheduled=int(sched) if sched is not None else None,
            cpu_pct=data.get("cpu_pct"),
            done=bool(data.get("done")),
        )


@dataclass(frozen=True)
class Start:
    """What a worker learns of the run from the master's spawn message."""

    epoch_unix: float
    warmup_id: str
    workers: list[int]
    """Every worker's index, in slot order."""
    segments: list[Segment] | None
    """The ladder's first rate segments (``None``: not a ladder run)."""
    model: str | None = None
    """The target's model, for requests ``--model`` does not name (``None``: none to send)."""


def publish_start(
    po: Any,
    *,
    epoch_unix: float,
    warmup_id: str,
    workers: list[int] | None,
    segments: list[Segment] | None,
    model: str | None = None,
) -> None:
    """Local / master: put the run's start on ``parsed_options`` (Locust ships them to the workers)."""
    po.harness_epoch = epoch_unix
    po.harness_warmup_id = warmup_id
    po.harness_model = model  # set every test: a web UI's next test may meet another target
    if workers is not None:
        po.harness_workers = workers
    if segments is not None:
        po.harness_segments = encode_segments(segments)


def read_start(po: Any) -> Start:
    """Worker: the run's start, as the master published it."""
    raw = getattr(po, "harness_segments", None)
    model = getattr(po, "harness_model", None)
    return Start(
        epoch_unix=float(po.harness_epoch),
        warmup_id=str(po.harness_warmup_id),
        workers=list(po.harness_workers),
        segments=decode_segments(raw) if raw else None,
        model=str(model) if model else None,
    )


# ------------------------------------------------------------------------------------------ sending


def send_batch(runner: Runner, batch: Batch) -> None:
    runner.send_message(MSG_RECORDS, batch.to_wire())


def send_segments(runner: Runner, segs: Iterable[Segment], *, final: bool) -> None:
    runner.send_message(MSG_SEGMENTS, {"segments": encode_segments(segs), "final": final})


def send_stop(runner: Runner, reason: str) -> None:
    runner.send_message(MSG_STOP, {"reason": reason})


def listen_master(runner: Runner, on_records: Callable[[Batch], None]) -> None:
    """Master: hand each worker's batch to ``on_records``."""
    runner.register_message(MSG_RECORDS, lambda msg, **_kw: on_records(Batch.from_wire(msg.data)))


def listen_worker(
    runner: Runner,
    on_segments: Callable[[list[Segment], bool], None],
    on_stop: Callable[[str], None],
) -> None:
    """Worker: hand the master's new segments (and whether they are final) and its stop to the callbacks."""
    runner.register_message(
        MSG_SEGMENTS,
        lambda msg, **_kw: on_segments(decode_segments(msg.data["segments"]), bool(msg.data["final"])),
    )
    runner.register_message(
        MSG_STOP, lambda msg, **_kw: on_stop(str(msg.data.get("reason") or "stopped by the master"))
    )


# ------------------------------------------------------------------------------------------ workers


def worker_index(runner: MasterRunner, client_id: str) -> int:
    return int(runner.get_worker_index(client_id))  # type: ignore[no-untyped-call]


def ready_workers(runner: MasterRunner) -> list[int]:
    """The indexes of the workers that take part in the test now starting, sorted (slot order)."""
    ready = runner.clients.ready + runner.clients.running + runner.clients.spawning
    return sorted(worker_index(runner, c.id) for c in ready)


@dataclass
class WorkerState:
    index: int
    slot: int
    scheduled: int | None = None
    sent: int = 0
    recorded: int = 0
    done: bool = False
    lost: bool = False
    cpu_pct: float | None = None


@dataclass
class Workers:
    """The master's view of its workers: progress from their batches, and which were lost."""

    states: dict[int, WorkerState] = field(default_factory=dict)

    @classmethod
    def of(cls, indexes: list[int]) -> Workers:
        return cls({ix: WorkerState(ix, slot) for slot, ix in enumerate(indexes)})

    def receive(self, batch: Batch) -> None:
        ws = self.states.get(batch.worker)
        if ws is None:
            return  # a worker that joined after the start has no share
        ws.recorded += len(batch.records)
        ws.sent = batch.sent
        ws.scheduled = batch.scheduled
        ws.cpu_pct = batch.cpu_pct
        ws.done = ws.done or batch.done

    def check(self, runner: MasterRunner) -> list[str]:
        """Mark the workers Locust no longer sees (missed heartbeats) lost; a warning for each new one."""
        alive = {worker_index(runner, c.id) for c in runner.clients.all if c.state not in ("missing",)}
        lost: list[str] = []
        for ws in self.states.values():
            if not ws.done and not ws.lost and ws.index not in alive:
                ws.lost = True
                lost.append(
                    f"worker {ws.index} was lost; its share is marked missing "
                    f"({ws.recorded} records received)"
                )
        return lost

    def settled(self) -> bool:
        """Every worker is done or lost."""
        return all(ws.done or ws.lost for ws in self.states.values())

    def lost(self) -> int:
        return sum(ws.lost for ws in self.states.values())

    def cpu_pcts(self) -> list[float]:
        return [ws.cpu_pct for ws in self.states.values() if ws.cpu_pct is not None]

    def shares(self) -> list[WorkerShare]:
        """``summary.json``'s ``workers``."""
        return [
            WorkerShare(
                worker=ws.index,
                scheduled=ws.scheduled if ws.scheduled is not None else ws.recorded,
                recorded=ws.recorded,
                missing=ws.lost,
            )
            for ws in self.states.values()
        ]
