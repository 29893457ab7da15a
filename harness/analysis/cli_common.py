"""What every ``harness analysis`` command shares: the consoles, JSON output, help strings, the
``--api`` check (the load stage's choices). The target's credentials options are
:func:`harness.common.auth.access_options`."""

from __future__ import annotations

from typing import Any

import orjson
import typer

from harness.common import console as cons

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
