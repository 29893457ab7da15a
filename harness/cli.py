"""The ``harness`` command line: one sub-command group per pipeline stage.

Each stage owns ``harness/<stage>/cli.py`` exposing a ``typer.Typer`` named ``app`` (and the server
also a top-level ``serve`` command). Stage CLIs import their heavy dependencies (torch, faiss,
sentence-transformers) inside the commands, so ``harness --help`` stays fast.

User mistakes surface as :class:`~harness.common.errors.HarnessError`: printed as one line on
stderr, exit code per ``docs/exit-codes.md``, never a traceback.
"""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Sequence

import click
import typer
from rich.logging import RichHandler
from rich.markup import escape

from harness import __version__
from harness.common import console
from harness.common.errors import ExitCode, HarnessError

# (group name, module) in pipeline order; a module may be absent while its stage is unbuilt.
STAGE_GROUPS: tuple[tuple[str, str], ...] = (
    ("traces", "harness.traces.cli"),
    ("corpus", "harness.corpus.cli"),
    ("load", "harness.load.cli"),
    ("engine", "harness.target.engine.cli"),
    ("cache", "harness.target.cache.cli"),
    ("baseline", "harness.gates.cli"),
    ("analysis", "harness.analysis.cli"),
    ("deploy", "harness.analysis.deploy_cli"),
)
# Top-level commands: (command name, module, attribute). A module's COMMAND_SETTINGS maps an attribute
# to typer's command keyword arguments (an epilog with an example).
TOP_COMMANDS: tuple[tuple[str, str, str], ...] = (
    ("serve", "harness.target.server.cli", "serve"),
    ("gate", "harness.gates.cli", "gate"),
    ("report", "harness.reports.cli", "report"),
    ("run", "harness.experiments.run_cli", "run"),
    ("capacity", "harness.experiments.capacity_cli", "capacity"),
    ("ab", "harness.experiments.ab_cli", "ab"),
)
# Commands of a group that live in another stage: (group, command name, module). The module defines a
# function of the command's name and may define COMMAND_SETTINGS (typer's command keyword arguments).
GROUP_COMMANDS: tuple[tuple[str, str, str], ...] = (
    # Judging a baseline is the gates'; running a recipe N times to make one is an experiment's.
    ("baseline", "calibrate", "harness.experiments.calibrate_cli"),
)

stderr = console.err()
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def _import_optional(module: str) -> object | None:
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name == module:  # the stage is not built yet; a missing dependency still raises
            return None
        raise


def _version(value: bool) -> None:
    if value:
        typer.echo(f"harness {__version__}")
        raise typer.Exit()


def build_app() -> typer.Typer:
    """Assemble the root app from the stage CLIs that exist."""
    app = typer.Typer(
        name="harness",
        help="Trace-driven load and cache-warmup harness for LLM inference.",
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        add_completion=False,
    )

    @app.callback()
    def root(
        log_level: str = typer.Option("WARNING", "--log-level", help="DEBUG, INFO, WARNING or ERROR."),
        version: bool = typer.Option(
            False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ) -> None:
        level = log_level.upper()
        if level not in LOG_LEVELS:
            raise typer.BadParameter(
                f"{log_level!r} is not one of {', '.join(LOG_LEVELS)}", param_hint="--log-level"
            )
        logging.basicConfig(
            level=level,
            format="%(message)s",
            handlers=[RichHandler(console=stderr, show_path=False)],
        )

    groups: dict[str, typer.Typer] = {}
    for name, module in STAGE_GROUPS:
        mod = _import_optional(module)
        if mod is not None:
            groups[name] = mod.app  # type: ignore[attr-defined]
    for group, name, module in GROUP_COMMANDS:
        mod = _import_optional(module)
        if mod is not None and group in groups:
            groups[group].command(name, **getattr(mod, "COMMAND_SETTINGS", {}))(getattr(mod, name))
    for name, sub in groups.items():
        app.add_typer(sub, name=name)
    for name, module, attr in TOP_COMMANDS:
        mod = _import_optional(module)
        if mod is not None:
            settings = getattr(mod, "COMMAND_SETTINGS", {}).get(attr, {})
            app.command(name, **settings)(getattr(mod, attr))
    return app


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``harness`` script."""
    command = typer.main.get_command(build_app())
    try:
        args = list(argv) if argv is not None else None
        rv = command.main(args=args, prog_name="harness", standalone_mode=False)
    except HarnessError as exc:
        # The message quotes user data (a cell like "[/x]"), which must not be read as Rich markup.
        stderr.print(f"[bold red]harness: error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        sys.exit(int(exc.exit_code))
    except (typer.Exit, click.exceptions.Exit) as exc:
        sys.exit(exc.exit_code)
    except (typer.Abort, click.exceptions.Abort, KeyboardInterrupt):
        stderr.print("harness: interrupted")
        sys.exit(int(ExitCode.INTERRUPTED))
    except Exception as exc:
        # Typer ships its own fork of click's exceptions; handle both by their shared interface.
        show = getattr(exc, "show", None)
        if show is None or not hasattr(exc, "exit_code"):
            raise
        if type(exc).__name__ == "NoArgsIsHelpError":
            show()
            sys.exit(int(ExitCode.OK))
        show()
        usage = any(cls.__name__ == "UsageError" for cls in type(exc).__mro__)
        sys.exit(int(ExitCode.USAGE) if usage else int(exc.exit_code))
    sys.exit(rv if isinstance(rv, int) else 0)


if __name__ == "__main__":
    main()
