"""A stand-in for a paired run in calibration tests: writes a paired run's result sets (cold, warm,
ladder) to the run's directory as the load stage would, seeded by the directory's name (``cal-K``),
run K's latencies scaled by the K-th of ``drifts`` where given; returns ``exit_code``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from harness.common.fingerprint import Environment, Hardware, Software
from harness.experiments.calibrate import RunOnce
from harness.experiments.recipe import Recipe
from harness.load.run_summary import Recipe as OfferedLoad
from tests.gates.factory import make_run

ENV = Environment(
    hardware=Hardware(cpu_model="AMD EPYC 7B13", cpu_count=2),
    software=Software(python="3.11", harness="0.1.0"),
)


def fake_run(
    exit_code: int = 0, drifts: Sequence[float] | None = None, seen: list[Recipe] | None = None
) -> RunOnce:
    """A :data:`RunOnce` that writes made-up result sets; ``seen`` collects the recipes it was given."""

    def run(recipe: Recipe, out: Path, source: Path | None) -> int:
        if seen is not None:
            seen.append(recipe)
        k = int(out.name.rsplit("-", 1)[-1])
        out.mkdir(parents=True, exist_ok=True)
        kw = {"environment": ENV, "recipe": OfferedLoad(rate=4.0, max_tokens_cap=16)}
        drift = 1.0 + 0.03 * k  # each run a little slower: a machine's run-to-run drift
        scaled: dict[str, float] = {}
        if drifts is not None:  # run K's factor (a neighbour's burst)
            drift = drifts[k - 1]
            scaled["tpot_ms"] = 4.0 * drift  # a busy machine slows decode too
        make_run(
            out / "cold", 400, 10 * k, ttft_ms=50 * drift, hit_l1=0, hit_l2=0, hit_l3=0, prefix_hit=0,
            **scaled, **kw,
        )  # fmt: skip
        make_run(
            out / "warm", 400, 10 * k + 1, ttft_ms=20 * drift, hit_l1=0.8, hit_l2=0.1, hit_l3=0.05,
            **scaled, **kw,
        )  # fmt: skip
        make_run(out / "ladder", 50, 10 * k + 2, **kw)
        return exit_code

    return run
