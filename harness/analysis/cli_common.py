"""What every ``harness analysis`` command shares: the consoles, JSON output, help strings, the
``--api`` check (the load stage's choices) and the target's credentials options."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson
import typer

from harness.common import console as cons
from harness.common.auth import Credentials

console = cons.out()
err_console = cons.err()

JSON_HELP = "Print JSON instead of a table."


def echo_json(obj: Any) -> None:
    typer.echo(orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY).decode())


def say(text: str) -> None:
    err_console.print(text, highlight=False, markup=False, soft_wrap=True)


def pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.2f} %"


def check_api(value: str) -> Any:
    """``--api`` checked against the load stage's choices."""
    from typing import get_args

    from harness.load.arrivals import ApiChoice

    choices = get_args(ApiChoice)
    if value not in choices:
        raise typer.BadParameter(f"{value!r} is not one of {', '.join(choices)}", param_hint="--api")
    return value


ACCESS_OPTIONS = ("api_key", "admin_token", "header", "ca_bundle", "insecure")
"""The credentials options (declared once in :mod:`harness.common.auth`) of every analysis command
that talks to a target: ``@typer_options(*ACCESS_OPTIONS)`` or the ``…Option`` types themselves."""


def access_of(values: Mapping[str, Any]) -> Credentials:
    """The :class:`Credentials` of the given :data:`ACCESS_OPTIONS` values (absent: not given)."""
    ca = values.get("ca_bundle")
    return Credentials.of(
        api_key=values.get("api_key"),
        admin_token=values.get("admin_token"),
        headers=values.get("header") or (),
        ca_bundle=Path(ca) if ca else None,
        insecure=bool(values.get("insecure")),
    )
