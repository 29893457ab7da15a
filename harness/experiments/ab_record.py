"""``OUT/ab.json`` of an A/B run (:mod:`harness.experiments.ab`): the two arms, the layout of ``OUT``, and
the record rewritten after every step (:class:`ABRun`: the targets, their flushes, every block and look,
the warm pass, the verdict and the exit code).

What ``harness ab`` and a CI job read back; it changes when what a run reports changes, not when its
steps or its checks do.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from harness.common.model import StrictModel
from harness.experiments.paired_record import FlushRecord
from harness.experiments.recipe import RECIPE_FILE
from harness.gates.ab import ABJudgement
from harness.load.run_summary import InputRef

Arm = Literal["base", "candidate"]
ARMS: tuple[Arm, Arm] = ("base", "candidate")
AB_FILE = "ab.json"
BLOCKS_DIR = "blocks"
SERVER_DIR = "server"
WARM_DIR = "warm"
CAPACITY_DIR = "capacity"
CANDIDATE_CAPACITY_DIR = "capacity-candidate"
GATE_JSON = "gate.json"
GATE_JUNIT = "gate.junit.xml"
OUTPUTS = (
    *ARMS, BLOCKS_DIR, SERVER_DIR, WARM_DIR, CAPACITY_DIR, CANDIDATE_CAPACITY_DIR, AB_FILE, RECIPE_FILE,
    GATE_JSON, GATE_JUNIT,
)  # fmt: skip
"""Everything ``harness ab`` writes under ``OUT`` (``--force`` removes exactly these)."""


class TargetRecord(StrictModel):
    url: str
    model: str | None
    started: bool
    serve_args: list[str] | None = None
    log: str | None = None


class BlockRecord(StrictModel):
    """One block: one arm's replay of one pair's requests (``pair`` 0: the arm's warm pass)."""

    pair: int
    arm: Arm
    dir: str
    exit_code: int
    seconds: float
    requests: int = 0
    errors: int = 0
    client_bound: bool = False
    interrupted: bool = False


class LookRecord(StrictModel):
    """One look at the verdict: after how many block pairs, what it said, and how long the blocks took."""

    look: int
    block_pairs: int
    verdict: str
    headline: str
    seconds: float


class CapacityNote(StrictModel):
    """The base's capacity, measured in the run, and the rate both arms got from it; the candidate's,
    measured the same way (so both arms have served the same probe traffic before the first block)."""

    capacity_rps: float
    share: float
    rate_rps: float
    file: str
    bounded: bool | None = None
    candidate_capacity_rps: float | None = None
    """Information, not judged: a capacity search's resolution (its bisection) is coarser than the
    ratios the blocks measure."""
    candidate_file: str | None = None
    candidate_reason: str | None = None


class GateNote(StrictModel):
    """``--gate FILE`` judged on the candidate: its verdict and where it is written."""

    baseline: str
    verdict: str
    exit_code: int
    counts: dict[str, int]
    confidence: float
    """Each gate's two-sided confidence: ``1 − 2α / tests`` (its share of the family's α)."""
    file: str


class ABRun(StrictModel):
    """``OUT/ab.json``: what the A/B run did, rewritten after every step, and its verdict."""

    schema_version: Literal[1] = 1
    started_at: str
    finished_at: str | None = None
    out: str
    corpus: InputRef | None = None
    distinct_requests: int | None = None
    block_pairs: int
    """Block pairs a look."""
    looks_planned: int = 1
    block_requests: int | None = None
    rate_rps: float | None = None
    capacity: CapacityNote | None = None
    bypass_cache: bool
    load: list[str] = Field(default_factory=list)
    """Every block's load options as flags (its corpus, size and stage aside; secrets never)."""
    unused: list[str] = Field(default_factory=list)
    """The recipe's settings an A/B run does not use."""
    order: list[str] = Field(default_factory=list)
    """The blocks in the order they run (``base/01``, ``candidate/01``, ``candidate/02`` …)."""
    targets: dict[str, TargetRecord] = Field(default_factory=dict)
    flush: dict[str, list[FlushRecord]] = Field(default_factory=dict)
    blocks: list[BlockRecord] = Field(default_factory=list)
    looks: list[LookRecord] = Field(default_factory=list)
    stop_reason: str | None = None
    """Why the blocks stopped: a look decided, the budget, or the last look."""
    warm: list[BlockRecord] = Field(default_factory=list)
    judgement: ABJudgement | None = None
    gate: GateNote | None = None
    verdict: str | None = None
    exit_code: int | None = None
    message: str | None = None
    interrupted: bool = False
