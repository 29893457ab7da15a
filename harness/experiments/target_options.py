"""The two ways a gating command gets its target, as typer options: start one or use one.

``harness run`` and ``harness capacity`` both either start ``harness serve`` (``--serve-args``) or use
a running OpenAI-compatible server (``--url``); declaring the pair once keeps their help and their
"not both" rule the same in both commands.
"""

from __future__ import annotations

from typing import Annotated

import typer

from harness.common.errors import ConfigError

ServeArgs = Annotated[
    str | None,
    typer.Option(
        "--serve-args",
        help='Start `harness serve` with these arguments (default "--preset tiny --cache").',
    ),
]
Url = Annotated[
    str | None,
    typer.Option("--url", help="Use this running OpenAI-compatible server instead of starting one."),
]


def check_one_target(serve_args: str | None, url: str | None) -> None:
    """Refuse ``--serve-args`` together with ``--url`` (exit 4): one run, one target."""
    if url is not None and serve_args is not None:
        raise ConfigError("give --serve-args (start a server) or --url (use one), not both", field="--url")
