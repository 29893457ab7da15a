"""``harness analysis``: the warmup analyses (see ``docs/analysis.md``).

Every command reads real inputs (request traces, load runs, corpora, scrapes, cache state), prints a
table (or ``--json``), writes its files atomically, and reports bad input as one line with the
documented exit code. This module only wires the typer app; each command lives with the others of
its analysis (``*_cli.py`` beside the analysis it runs), and what they share is in
:mod:`harness.analysis.cli_common`.
"""

from __future__ import annotations

from collections.abc import Callable

import typer

from harness.analysis import (
    anomaly_cli,
    avalanche_cli,
    decay_cli,
    effect_cli,
    gpu_frag_cli,
    index_cli,
    tiers_cli,
    warmup_cli,
)

app = typer.Typer(
    help="Warmup analyses: hit-rate ceiling, warmup plan, its effect measured, hot-zone tiers, QPS decay, "
    "avalanche/RTO, index warmup, GPU fragmentation, anomaly attribution.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)

URL = "http://127.0.0.1:8000"
MOONCAKE = "fixtures/traces/mooncake_synthetic_head20.jsonl"
COMMANDS: tuple[tuple[str, Callable[..., None], str], ...] = (
    (
        "hitrate",
        warmup_cli.hitrate,
        f"--trace {MOONCAKE} --unit blocks --cache-capacity 50 --cache-capacity 500",
    ),
    (
        "plan",
        warmup_cli.plan,
        f"--trace {MOONCAKE} --unit blocks --cache-capacity 100 --window-fraction 0.5 -o runs/plan",
    ),
    (
        "effect",
        effect_cli.effect,
        "--corpus runs/mooncake-corpus --split 0.75 --serve-args '--preset tiny' --max-tokens-cap 4 "
        "-o runs/effect",
    ),
    ("tiers", tiers_cli.tiers, "--corpus runs/corpus --run runs/replay -o runs/tiers.json"),
    ("decay", decay_cli.decay, "--points runs/decay-points.jsonl --plot runs/decay.png --json"),
    (
        "decay-sweep",
        decay_cli.decay_sweep,
        f"--url {URL} --corpus runs/corpus --rate 2 --cmr 0,0.5,1 -o runs/decay",
    ),
    ("avalanche", avalanche_cli.avalanche, f"--url {URL} --window-s 60 --target-p 0.05"),
    ("rto", avalanche_cli.rto, "--expired-keys 400 --gen-s 1.5 --slots 8 --utilization 0.5"),
    ("rto-calibrate", avalanche_cli.rto_calibrate, "runs/rto-cases.jsonl -o runs/rto.json"),
    ("rto-measure", avalanche_cli.rto_measure, "runs/replay --event-s 30 --window-s 10"),
    ("index", index_cli.index, "--corpus runs/corpus --sizes 1000,10000 --kinds flat,hnsw --json"),
    ("gpu-frag", gpu_frag_cli.gpu_frag, "--size-mb 64 --cycles 100 --json"),
    ("scrape", anomaly_cli.scrape, f"--url {URL} --every-s 5 --count 12 -o runs/server_metrics.jsonl"),
    ("anomaly", anomaly_cli.anomaly, "--scrapes runs/replay --baseline-window 0:60 --json"),
)
"""Command name → function and the example its help shows, in the order ``harness analysis --help``
lists them."""

for _name, _command, _example in COMMANDS:
    app.command(_name, epilog=f"Example: harness analysis {_name} {_example}")(_command)
