"""What the commands that drive a target share (``harness run``, ``harness capacity``): the target,
started from ``--serve-args`` or reached at ``--url``, the progress display, the output directory,
SIGTERM as Ctrl-C, and how a Locust child's exit code maps back to an error.

One module, so that :mod:`harness.experiments.paired` and :mod:`harness.experiments.capacity` need nothing of
each other's (``harness run --rate 50%`` measures the capacity first, so paired uses capacity, never
the other way round).
"""

from __future__ import annotations

import dataclasses
import secrets
import shlex
import shutil
import signal
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

from harness.common.auth import SECRET_VALUE_FLAGS, Credentials
from harness.common.errors import (
    ConfigError,
    ExitCode,
    HarnessError,
    InputError,
    TargetDied,
    UnavailableError,
)
from harness.experiments.target import Target
from harness.load.target import TargetClient
from harness.target.server.launch import ServerProcess, StartingServer, spawn_server

MODELS_TIMEOUT_S = 30.0
"""How long a ``--url`` target may take to list its models (the first call: it proves it is there)."""

ERRORS_BY_CODE: dict[int, type[HarnessError]] = {
    int(ExitCode.INPUT): InputError,
    int(ExitCode.CONFIG): ConfigError,
    int(ExitCode.UNAVAILABLE): UnavailableError,
    int(ExitCode.TARGET_DIED): TargetDied,
}
"""A Locust child's exit code that is an error of ours, and the error it becomes."""


def check_serve_args(args: Sequence[str]) -> list[str]:
    """Parse ``args`` with ``harness serve``'s own command line (an unknown option or a bad value is
    a :class:`ConfigError` now, not a server that exits later); paths made absolute, because the
    server runs in its log directory."""
    from harness.common.options import options_given, parse_command_line
    from harness.target.server.cli import SERVE_OPTIONS, check_settings, serve

    for arg in args:
        flag = arg.split("=", 1)[0]
        if flag in SECRET_VALUE_FLAGS:  # harness serve's secrets: never on the child's command line
            raise ConfigError(
                f"{flag} does not belong in --serve-args: give it to this command itself, which hands "
                "it to the server it starts through the environment (a command line is recorded in "
                "run.json and shown by ps)",
                field="--serve-args",
            )
    ctx = parse_command_line(serve, args, prog="harness serve", field="--serve-args")
    # The values too, as the server will check them before it loads a model (a range, a preset whose
    # weights were never fetched): a mistake costs milliseconds here, not a server start.
    try:
        check_settings(options_given(ctx.params, SERVE_OPTIONS))
    except ConfigError as exc:
        raise ConfigError(f"harness serve {' '.join(args)}: {exc}", field="--serve-args") from None
    command = ctx.command
    path_opts = {
        opt
        for param in command.params
        if isinstance(ctx.params.get(param.name or ""), Path)
        for opt in param.opts
        if opt.startswith("--")
    }
    out: list[str] = []
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if eq and name in path_opts:
            out.append(f"{name}={Path(value).resolve()}")
        elif i > 0 and args[i - 1] in path_opts:
            out.append(str(Path(arg).resolve()))
        else:
            out.append(arg)
    return out


def check_out_dir(out: Path, outputs: Iterable[str], *, force: bool, holds: str) -> None:
    """``--out`` must be a directory without an earlier command's ``outputs`` (unless ``--force``)."""
    if out.exists() and not out.is_dir():
        raise ConfigError("is not a directory", file=out, field="--out")
    earlier = [name for name in outputs if (out / name).exists()]
    if earlier and not force:
        raise ConfigError(
            f"holds {holds} ({', '.join(earlier)})",
            file=out,
            field="--out",
            hint="another --out, or --force to replace it",
        )


def clear_out_dir(out: Path, outputs: Iterable[str]) -> None:
    """Remove an earlier command's outputs (only the names ``outputs`` lists)."""
    for name in outputs:
        p = out / name
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        elif p.exists() or p.is_symlink():
            p.unlink()


@contextmanager
def open_target(
    url: str | None,
    serve_args: Sequence[str] | None,
    log_dir: Path,
    ui: Ui,
    server_timeout_s: float,
    *,
    credentials: Credentials | None = None,
) -> Iterator[Target]:
    """``url``: that server (its model: the first id of its ``GET /v1/models``, ``None`` when it has
    none); else ``harness serve SERVE_ARGS`` started on a free port (its log and run directory in
    ``log_dir``; ``Target.server`` set) and stopped on every exit path. An unreachable ``url``, or
    one that refuses the API key, is an :class:`UnavailableError` here, before anything else.

    A server started here is keyed with ``credentials`` (through its environment) and always gets an
    admin token: the one given, else a fresh random one that only this run knows, so that nothing
    else on the machine can flush or preload its caches meanwhile."""
    with open_targets(
        [TargetSpec(url, serve_args, log_dir)], ui, server_timeout_s, credentials=credentials
    ) as (target,):
        yield target


@dataclasses.dataclass(frozen=True)
class TargetSpec:
    """A target to open: at ``url``, or ``harness serve SERVE_ARGS`` logging into ``log_dir``."""

    url: str | None
    serve_args: Sequence[str] | None
    log_dir: Path


@contextmanager
def open_targets(
    specs: Sequence[TargetSpec],
    ui: Ui,
    server_timeout_s: float,
    *,
    credentials: Credentials | None = None,
) -> Iterator[list[Target]]:
    """:func:`open_target` for each of ``specs``, in order, with every server spawned before any is
    waited for (two start-ups, ~8 s each on 2 cores, overlap); stopped in the reverse order."""
    creds = credentials if credentials is not None else Credentials()
    with ExitStack() as stack:
        starting: dict[int, tuple[StartingServer, Credentials]] = {}
        for i, spec in enumerate(specs):
            if spec.url is not None:
                continue
            assert spec.serve_args is not None
            # Its own run directory: the cache's persisted state (L3, Bloom) and the embedded Redis of
            # an earlier run must not leak into this one.
            keyed = creds
            if keyed.admin_token is None:
                keyed = dataclasses.replace(creds, admin_token=secrets.token_urlsafe(32))
            env = {"HARNESS__RUN_DIR": str((spec.log_dir / "state").resolve()), **keyed.server_env()}
            ui.say(f"[dim]$ harness serve {escape(shlex.join(spec.serve_args))}[/]")
            child = spawn_server(spec.serve_args, log_dir=spec.log_dir, env=env)
            stack.callback(child.kill)  # until it serves, and after any error: a no-op once stopped
            starting[i] = (child, keyed)
        targets: list[Target] = []
        for i, spec in enumerate(specs):
            if spec.url is not None:
                client = TargetClient(spec.url, creds)
                with ui.step(f"target {spec.url}"):
                    model = client.first_model(timeout_s=MODELS_TIMEOUT_S)
                targets.append(Target(client, model=model))
                continue
            child, keyed = starting[i]
            with ui.step("starting harness serve"):
                server = child.wait(server_timeout_s)
            stack.callback(_stop, server, ui)
            ui.say(f"[green]✓[/] serving {escape(server.model)} at {server.url}")
            targets.append(Target(TargetClient(server.url, keyed), model=server.model, server=server))
        yield targets


def _stop(server: ServerProcess, ui: Ui) -> None:
    server.stop()
    ui.say("[green]✓[/] server stopped")


class Ui:
    """Progress on stderr: one bar per load phase (requests recorded so far), spinners for the rest."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.progress = Progress(
            SpinnerColumn(), TextColumn("{task.description:<26}"), BarColumn(), MofNCompleteColumn(),
            TimeElapsedColumn(), console=console, transient=False,
        )  # fmt: skip

    def say(self, text: str) -> None:
        self.console.print(text, highlight=False)

    @contextmanager
    def step(self, description: str) -> Iterator[None]:
        task = self.progress.add_task(description, total=None)
        try:
            yield
        finally:
            self.progress.update(task, total=1, completed=1)

    @contextmanager
    def phase(self, description: str, records: Path, total: int | None) -> Iterator[None]:
        """A bar counting the lines of ``records`` (the load stage flushes them at least once a second)."""
        task = self.progress.add_task(description, total=total)
        counter = LineCounter(records)
        stop = threading.Event()

        def poll() -> None:
            while not stop.wait(0.5):
                self.progress.update(task, completed=counter.count())

        poller = threading.Thread(target=poll, name="harness-run-progress", daemon=True)
        poller.start()
        try:
            yield
        finally:
            stop.set()
            poller.join()
            n = counter.count()
            self.progress.update(task, completed=n, total=max(n, total or 0) or None)


class LineCounter:
    """Counts the lines of a growing file, reading only what was appended since the last call."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.lines = 0

    def count(self) -> int:
        try:
            with self.path.open("rb") as fh:
                fh.seek(self.offset)
                chunk = fh.read()
        except FileNotFoundError:
            return self.lines
        self.offset += len(chunk)
        self.lines += chunk.count(b"\n")
        return self.lines


@contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """SIGTERM (a CI job cancelled) behaves like Ctrl-C: the running phase finalizes, the server stops."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def log_tail(path: Path, lines: int = 3) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return " | ".join(line.strip() for line in text.splitlines()[-lines:] if line.strip())
