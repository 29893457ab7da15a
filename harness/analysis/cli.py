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
    gpu_frag_cli,
    index_cli,
    tiers_cli,
    warmup_cli,
)

app = typer.Typer(
    help="Warmup analyses: hit-rate ceiling, warmup plan, hot-zone tiers, QPS decay, avalanche/RTO, "
    "index warmup, GPU fragmentation, anomaly attribution.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)

COMMANDS: tuple[tuple[str, Callable[..., None]], ...] = (
    ("hitrate", warmup_cli.hitrate),
    ("plan", warmup_cli.plan),
    ("tiers", tiers_cli.tiers),
    ("decay", decay_cli.decay),
    ("decay-sweep", decay_cli.decay_sweep),
    ("avalanche", avalanche_cli.avalanche),
    ("rto", avalanche_cli.rto),
    ("rto-calibrate", avalanche_cli.rto_calibrate),
    ("rto-measure", avalanche_cli.rto_measure),
    ("index", index_cli.index),
    ("gpu-frag", gpu_frag_cli.gpu_frag),
    ("scrape", anomaly_cli.scrape),
    ("anomaly", anomaly_cli.anomaly),
)
"""Command name → function, in the order ``harness analysis --help`` lists them."""

for _name, _command in COMMANDS:
    app.command(_name)(_command)
