"""A stand-in for ``harness run`` in calibration tests: writes a paired run's result sets (cold, warm,
ladder) to ``--out`` as the load stage would, seeded by the output's name, run K's latencies scaled
by the K-th of ``FAKE_RUN_DRIFTS`` where set; exits ``FAKE_RUN_EXIT``."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from harness.common.fingerprint import Environment, Hardware, Software
from harness.load.results import Recipe
from tests.gates.factory import make_run

ENV = Environment(
    hardware=Hardware(cpu_model="AMD EPYC 7B13", cpu_count=2),
    software=Software(python="3.11", harness="0.1.0"),
)


def main(argv: list[str]) -> int:
    out = Path(argv[argv.index("--out") + 1])
    k = int(out.name.rsplit("-", 1)[-1])
    out.mkdir(parents=True, exist_ok=True)
    (out / "argv.json").write_text(json.dumps(argv))
    kw = {"environment": ENV, "recipe": Recipe(rate=4.0, max_tokens_cap=16)}
    drift = 1.0 + 0.03 * k  # each run a little slower: a machine's run-to-run drift
    scaled: dict[str, float] = {}
    if drifts := os.environ.get("FAKE_RUN_DRIFTS"):  # "1,2,1.3": run K's factor (a neighbour's burst)
        drift = float(drifts.split(",")[k - 1])
        scaled["tpot_ms"] = 4.0 * drift  # a busy machine slows decode too
    make_run(
        out / "cold",
        400,
        10 * k,
        ttft_ms=50 * drift,
        hit_l1=0,
        hit_l2=0,
        hit_l3=0,
        prefix_hit=0,
        **scaled,
        **kw,
    )
    make_run(
        out / "warm", 400, 10 * k + 1, ttft_ms=20 * drift, hit_l1=0.8, hit_l2=0.1, hit_l3=0.05, **scaled, **kw
    )
    make_run(out / "ladder", 50, 10 * k + 2, **kw)
    return int(os.environ.get("FAKE_RUN_EXIT", "0"))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
