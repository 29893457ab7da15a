"""One way to keep a renamed option's old spelling (:class:`harness.common.options.Renamed`), for a
model field's option (``Flag(deprecated=…)``, through ``with_options``) and for a plain typer option
(``@old_spellings``): the old spelling works, prints exactly one warning naming the new one, is
hidden from ``--help``, keeps the new one's checks; two spellings at once is an error."""

from __future__ import annotations

from typing import Annotated, Any

import pytest
import typer
from pydantic import BaseModel, Field
from typer.testing import CliRunner

from harness.common.options import (
    Flag,
    old_spellings,
    options_given,
    options_of,
    parse_command_line,
    with_options,
)


def warnings(text: str) -> list[str]:
    return [line for line in text.splitlines() if "deprecated" in line]


def flat(text: str) -> str:
    """An error as typer shows it, without its box and line breaks."""
    return " ".join(text.replace("│", " ").split())


def app_of(command: Any) -> typer.Typer:
    app = typer.Typer()
    app.command()(command)
    app.command("other")(lambda: None)  # two commands: the command is named on the command line
    return app


def invoke(app: typer.Typer, *args: str) -> tuple[int, str, str]:
    res = CliRunner().invoke(app, ["cmd", *args])
    return res.exit_code, res.stdout, res.stderr


# ---- a plain typer option: @old_spellings --------------------------------------------------------

got: list[dict[str, Any]] = []


@old_spellings(capacity=("--cache-size", "--capacity"), sizes="--size")
def cmd(
    *,
    capacity: Annotated[int, typer.Option("--cache-capacity", min=1, help="Entries the cache holds.")] = 5,
    sizes: Annotated[list[int] | None, typer.Option("--sizes", help="Repeatable.")] = None,
) -> None:
    got.append({"capacity": capacity, "sizes": sizes})


APP = app_of(cmd)


def test_the_new_spelling_and_the_default_need_no_warning() -> None:
    assert invoke(APP, "--cache-capacity", "7") == (0, "", "")
    assert invoke(APP) == (0, "", "")
    assert got[-2:] == [{"capacity": 7, "sizes": None}, {"capacity": 5, "sizes": None}]


@pytest.mark.parametrize("old", ["--cache-size", "--capacity", "--cache-size=7"])
def test_an_old_spelling_works_and_warns_once(old: str) -> None:
    args = [old] if "=" in old else [old, "7"]
    code, out, err = invoke(APP, *args)
    assert code == 0 and got[-1] == {"capacity": 7, "sizes": None} and out == ""
    name = old.split("=", maxsplit=1)[0]
    assert err == f"harness: warning: {name} is deprecated; use --cache-capacity\n"


def test_a_repeated_old_spelling_warns_once() -> None:
    code, _, err = invoke(APP, "--size", "1", "--size", "2")
    assert code == 0 and got[-1]["sizes"] == [1, 2]
    assert warnings(err) == ["harness: warning: --size is deprecated; use --sizes"]


def test_two_spellings_at_once_are_an_error() -> None:
    code, _, err = invoke(APP, "--cache-capacity", "7", "--cache-size", "8")
    assert code == 2 and "--cache-size is the old spelling of --cache-capacity: give one" in flat(err)
    code, _, err = invoke(APP, "--capacity", "7", "--cache-size", "8")
    assert code == 2 and "old spelling of --cache-capacity" in flat(err)


def test_an_old_spelling_keeps_the_new_ones_checks() -> None:
    code, _, err = invoke(APP, "--cache-size", "0")
    assert code == 2 and "--cache-size" in err and not warnings(err)


def test_old_spellings_are_hidden_from_help() -> None:
    code, out, _ = invoke(APP, "--help")
    assert code == 0 and "--cache-capacity" in out and "--sizes" in out
    assert "--cache-size" not in out and "--capacity " not in out and "--size " not in out
    assert "5" in out  # the default the command applies is still shown


def test_a_required_option_is_required_under_any_spelling() -> None:
    seen: list[str] = []

    @old_spellings(url="--host")
    def needs(*, url: Annotated[str, typer.Option("--url", help="Target.")]) -> None:
        seen.append(url)

    app = app_of(needs)
    res = CliRunner().invoke(app, ["needs", "--host", "h"])
    assert res.exit_code == 0 and seen == ["h"]
    assert warnings(res.stderr) == ["harness: warning: --host is deprecated; use --url"]
    res = CliRunner().invoke(app, ["needs"])
    assert res.exit_code == 2 and "Missing option '--url'" in flat(res.stderr)


# ---- a model field's option: Flag(deprecated=…) through with_options -----------------------------


class Model(BaseModel):
    cache_capacity: Annotated[int | None, Flag(deprecated=("--cache-size",))] = Field(
        None, ge=1, description="Entries the cache holds"
    )
    header: Annotated[list[str], Flag(deprecated=("-H",), metavar="NAME:VALUE")] = Field(
        default_factory=list, description="A header, repeatable"
    )


OPTIONS = options_of(Model)
given_to: list[dict[str, Any]] = []


@with_options(OPTIONS, required={"cache_capacity"})
def fields_cmd(*, given: dict[str, Any]) -> None:
    given_to.append(given)


FIELDS = app_of(fields_cmd)


def test_a_fields_old_spelling_works_warns_once_and_is_hidden() -> None:
    res = CliRunner().invoke(FIELDS, ["fields-cmd", "--cache-size", "3", "-H", "A:1", "-H", "B:2"])
    assert res.exit_code == 0 and given_to[-1] == {"cache_capacity": 3, "header": ["A:1", "B:2"]}
    assert warnings(res.stderr) == [
        "harness: warning: --cache-size is deprecated; use --cache-capacity",
        "harness: warning: -H is deprecated; use --header",
    ]
    res = CliRunner().invoke(FIELDS, ["fields-cmd", "--cache-capacity", "3"])
    assert res.exit_code == 0 and given_to[-1] == {"cache_capacity": 3} and not warnings(res.stderr)
    shown = CliRunner().invoke(FIELDS, ["fields-cmd", "--help"]).stdout
    assert "--cache-capacity" in shown and "--header" in shown
    assert "--cache-size" not in shown and "-H " not in shown


def test_a_fields_two_spellings_or_none_are_errors() -> None:
    res = CliRunner().invoke(FIELDS, ["fields-cmd", "--cache-capacity", "3", "--cache-size", "4"])
    assert res.exit_code == 2 and "--cache-size is the old spelling of --cache-capacity" in flat(res.stderr)
    res = CliRunner().invoke(FIELDS, ["fields-cmd"])
    assert res.exit_code == 2 and "Missing option '--cache-capacity'" in flat(res.stderr)


def test_a_parsed_command_line_resolves_old_spellings_the_same_way(
    capsys: pytest.CaptureFixture[str],
) -> None:
    ctx = parse_command_line(fields_cmd, ["--cache-size", "3"], prog="harness x", field="--")
    assert options_given(ctx.params, OPTIONS) == {"cache_capacity": 3}
    assert warnings(capsys.readouterr().err) == [
        "harness: warning: --cache-size is deprecated; use --cache-capacity"
    ]
