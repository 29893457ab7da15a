"""``harness serve``: the OpenAI-compatible server in front of the local engine (and the cache).

Options override ``HARNESS__ENGINE__*`` / ``HARNESS__SERVER__*`` / ``HARNESS__CACHE__*`` settings.
Everything that can be checked is checked before the model loads or Redis starts (:func:`prepare`):
every setting (exit 4), the model directory's files (exit 4), and the listening socket is bound,
so a busy port fails fast (exit 5); with ``--port 0`` the OS picks a free port. Either way one line
``serving MODEL at http://HOST:PORT`` is printed on stdout once the port is known, for people.
Programs pass ``--ready-file PATH`` instead: once the server accepts requests (startup complete),
:class:`ReadyInfo` is written there atomically as JSON (``url``, ``model``, ``pid``, ``cache``), so
a caller waits for the file, never parses logs. SIGINT/SIGTERM stop accepting connections, give
in-flight requests ``graceful_shutdown_s`` to finish, stop the engine thread and close the cache.
``--tiers FILE`` hands the cache a tier policy file (``HARNESS__CACHE__TIER_FILE``, checked up front):
value tiers and TTLs from it. ``--inject-slowdown``, ``--inject-kv-overalloc``, ``--inject-error-rate``
and ``--inject-cache-miss-rate`` (with ``--inject-seed``) make regressions on purpose
(:mod:`harness.target.server.faults`); each active one prints a warning line on stderr at start-up.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import math
import os
import signal
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from harness.common import console as cons
from harness.common.errors import ConfigError, TargetDied, UnavailableError
from harness.common.io import write_json
from harness.common.model import StrictModel
from harness.common.options import flag_names, flagged, with_options
from harness.common.settings import load_settings
from harness.target.engine.placement import enter_front
from harness.target.engine.settings import EngineSettings
from harness.target.server.auth import AuthPolicy, check_protected_mode
from harness.target.server.settings import PANEL, ServerSettings

if TYPE_CHECKING:
    from fastapi import FastAPI
    from prometheus_client import CollectorRegistry

    from harness.target.cache.api import ResponseCache
    from harness.target.cache.settings import CacheSettings
    from harness.target.engine.api import AsyncEngine

log = logging.getLogger("harness.target.server")
COMMAND_SETTINGS = {
    "serve": {
        "epilog": "Example: harness serve --preset tiny --cache --port 8000 --ready-file runs/ready.json"
    }
}
"""How ``harness/cli.py`` registers the command."""


class ReadyInfo(StrictModel):
    """The ``--ready-file`` document: where a started server listens and what it serves."""

    url: str
    """Base URL without ``/v1`` (``http://127.0.0.1:PORT``)."""
    model: str
    pid: int
    cache: bool


def read_ready_file(path: str | Path) -> ReadyInfo | None:
    """The ready file's contents, or ``None`` while it does not exist yet (it appears atomically)."""
    p = Path(path)
    if not p.is_file():
        return None
    return ReadyInfo.model_validate_json(p.read_bytes())


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket, or :class:`UnavailableError` naming the address."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise UnavailableError(
            f"cannot listen on {host}:{port}: {exc.strerror}",
            field="HARNESS__SERVER__PORT",
            hint="pick another --port, or --port 0 for a free one",
        ) from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def model_revision(settings: EngineSettings) -> str:
    """What identifies the weights for cache keys: preset + seed, or the checkpoint files' sizes/mtimes."""
    if settings.model_dir is None:
        return f"preset:{settings.preset}:seed{settings.seed}"
    parts = []
    for p in sorted(Path(settings.model_dir).glob("*.safetensors")):
        st = p.stat()
        parts.append(f"{p.name}:{st.st_size}:{int(st.st_mtime)}")
    return "dir:" + ";".join(parts)


def model_identity(settings: EngineSettings) -> dict[str, Any]:
    """What ``GET /v1/models`` says about the weights (its ``harness`` block, with the device and
    whether the response cache is on): the preset or checkpoint, and ``weights``, a short hash of
    :func:`model_revision` (preset + seed for random-init presets, whose weights that fixes; the
    safetensors files' names, sizes and mtimes for checkpoints: cheap, and it changes when a file is
    replaced)."""
    import hashlib

    return {
        "preset": settings.preset if settings.model_dir is None else None,
        "checkpoint": Path(settings.model_dir).name if settings.model_dir is not None else None,
        "seed": settings.seed,
        "dtype": settings.dtype,
        "weights": hashlib.sha256(model_revision(settings).encode()).hexdigest()[:16],
    }


def check_model_dir(path: Path) -> None:
    """The files a checkpoint directory needs, checked in milliseconds before torch is imported or
    a weight is read: the directory, ``config.json``, ``tokenizer.json`` and safetensors weights.
    The engine's loader still checks their contents (model type, tensor names and shapes)."""
    field = "--model / HARNESS__ENGINE__MODEL_DIR"
    if not path.is_dir():
        raise ConfigError("model directory does not exist", file=path, field=field)
    for name in ("config.json", "tokenizer.json"):
        if not (path / name).is_file():
            raise ConfigError(f"not a Hugging Face checkpoint: no {name}", file=path / name, field=field)
    if not any((path / name).is_file() for name in ("model.safetensors", "model.safetensors.index.json")):
        raise ConfigError(
            "no model.safetensors (or model.safetensors.index.json); only safetensors checkpoints are read",
            file=path,
            field=field,
        )


def load_cache_settings(
    engine_settings: EngineSettings, overrides: dict[str, Any] | None = None
) -> CacheSettings:
    """The cache settings ``--cache`` will use (validated; ``model_revision`` from the engine's
    settings), imported lazily: a server without ``--cache`` never imports the cache stack.
    ``overrides`` are cache settings given on the command line (``--tiers`` → ``tier_file``)."""
    try:
        importlib.import_module("harness.target.cache.factory")
        cache_settings_mod = importlib.import_module("harness.target.cache.settings")
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.startswith("harness.target.cache"):
            raise ConfigError(
                "--cache needs the response cache stack (harness.target.cache.factory), which is not "
                "installed",
                field="HARNESS__SERVER__CACHE",
            ) from None
        raise
    given: dict[str, Any] = dict(overrides or {})
    if not os.environ.get("HARNESS__CACHE__MODEL_REVISION"):
        given["model_revision"] = model_revision(engine_settings)
    cache_settings: CacheSettings = load_settings(cache_settings_mod.CacheSettings, **given)
    return cache_settings


def open_cache(cache_settings: CacheSettings, registry: CollectorRegistry) -> ResponseCache:
    """The response cache stack (starts the embedded Redis, loads MiniLM when L3 is on)."""
    factory = importlib.import_module("harness.target.cache.factory")
    cache: ResponseCache = factory.create_cache(cache_settings, registry=registry)
    return cache


@dataclass
class ServePlan:
    """Everything :func:`prepare` checked and reserved, before anything slow happened."""

    engine: EngineSettings
    server: ServerSettings
    cache: CacheSettings | None
    """``None`` without ``--cache``."""
    sock: socket.socket
    auth: AuthPolicy
    """The credentials read and checked (key file, admin token, protected mode)."""


def prepare(
    engine_overrides: dict[str, Any],
    server_overrides: dict[str, Any],
    cache_overrides: dict[str, Any] | None = None,
) -> ServePlan:
    """Validate every setting and file and bind the port, before a model is loaded or Redis is
    started: a mistake (a bad setting, a model directory that is not a checkpoint, bad cache
    settings, a busy port) costs milliseconds and names what is wrong. Credentials too: a bad key
    file, and protected mode (a non-loopback ``--bind`` address without keys and an admin token) are
    :class:`ConfigError` (exit 4) before the port is bound."""
    engine_settings = load_settings(EngineSettings, **engine_overrides)
    settings = load_settings(ServerSettings, **server_overrides)
    auth = AuthPolicy.from_settings(settings)
    warning = check_protected_mode(settings, auth)
    if warning is not None:
        log.warning("%s", warning)
        print(f"WARNING: {warning}", file=sys.stderr, flush=True)
    if engine_settings.model_dir is not None:
        check_model_dir(Path(engine_settings.model_dir))
    cache_settings = load_cache_settings(engine_settings, cache_overrides) if settings.cache else None
    sock = bind_socket(settings.host, settings.port)
    return ServePlan(engine_settings, settings, cache_settings, sock, auth)


def run_server(
    engine_overrides: dict[str, Any],
    server_overrides: dict[str, Any],
    ready_file: Path | None = None,
    cache_overrides: dict[str, Any] | None = None,
) -> None:
    """Check everything (:func:`prepare`), then build engine, cache and app and serve until a signal."""
    plan = prepare(engine_overrides, server_overrides, cache_overrides)
    import uvicorn
    from prometheus_client import CollectorRegistry

    engine_settings, settings, sock = plan.engine, plan.server, plan.sock
    cache: ResponseCache | None = None
    app: FastAPI | None = None
    try:
        console = cons.err()
        with console.status(f"loading model ({engine_settings.model_dir or engine_settings.preset})…"):
            from harness.target.engine.factory import create_engine
            from harness.target.engine.process import ProcessAsyncEngine

            created = create_engine(engine_settings)
            engine: AsyncEngine = created
        # From here on the main thread (the event loop, and every thread it starts) keeps off the
        # engine's compute CPUs when they are bound (its own torch work, loading, is done).
        enter_front(created.placement)
        log.info("engine placement: %s", created.placement.describe())
        died: list[str] = []
        registry = CollectorRegistry()
        if plan.cache is not None:
            with console.status("starting the response cache…"):
                cache = open_cache(plan.cache, registry)

        from harness.target.server.app import create_app
        from harness.target.server.faults import FaultPlan

        faults = FaultPlan.from_settings(
            settings, engine_settings.inject_slowdown, engine_settings.inject_kv_overalloc
        )
        app = create_app(
            engine,
            settings=settings,
            cache=cache,
            registry=registry,
            identity=model_identity(engine_settings),
            auth=plan.auth,
            faults=faults,
        )
        config = uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            lifespan="on",
            # Rounded up, never to None: uvicorn reads None as "wait for ever" (0 must mean no grace).
            timeout_graceful_shutdown=math.ceil(settings.graceful_shutdown_s),
            server_header=False,
        )
        host, port = sock.getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host
        ready = ReadyInfo(
            url=f"http://{shown}:{port}",
            model=app.state.harness.model_name,
            pid=os.getpid(),
            cache=cache is not None,
        )

        class Server(uvicorn.Server):
            async def startup(self, sockets: list[socket.socket] | None = None) -> None:
                await super().startup(sockets=sockets)
                if self.started and ready_file is not None:  # lifespan done: requests are served
                    write_json(ready_file, ready.model_dump())

        server = Server(config)
        if isinstance(created, ProcessAsyncEngine):

            def on_death(failure: str) -> None:
                """The engine process died: stop serving (uvicorn looks at ``should_exit`` every 0.1 s)."""
                died.append(failure)
                server.should_exit = True

            created.on_death = on_death
        print(f"serving {ready.model} at {ready.url}", flush=True)
        for line in faults.warnings():
            console.print(f"[bold yellow]fault injection:[/] {line}", highlight=False, soft_wrap=True)
        # uvicorn re-raises the signal it shut down on once it is done; SIGTERM then exits cleanly.
        previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        try:
            server.run(sockets=[sock])
        finally:
            signal.signal(signal.SIGTERM, previous)
        if died:
            raise TargetDied(
                f"{died[0]}; the server stopped", hint="its log above says why (an OOM kill, a crash)"
            )
    finally:
        sock.close()
        state = app.state.harness if app is not None else None
        if cache is not None and not (state is not None and state.cache_closed):
            # startup failed before the app's lifespan could close it
            asyncio.run(cache.close())


SERVE_OPTIONS = [*flagged(EngineSettings, at=("engine",)), *flagged(ServerSettings, at=("server",))]
"""``harness serve``'s options: the settings fields that carry a :class:`~harness.common.options.Flag`
(flag, help, panel and old spellings declared on the field once); each overrides its
``HARNESS__ENGINE__*`` / ``HARNESS__SERVER__*`` variable."""


@with_options(SERVE_OPTIONS)
def serve(
    *,
    given: dict[str, Any],
    ready_file: Annotated[
        Path | None,
        typer.Option("--ready-file", help="Write url/model/pid as JSON here once requests are served."),
    ] = None,
    tiers: Annotated[
        Path | None,
        typer.Option(
            "--tiers",
            help="Tier policy file (harness analysis tiers): value tiers and TTLs for the cache.",
            rich_help_panel=PANEL,
        ),
    ] = None,
) -> None:
    """Serve the OpenAI-compatible API (/v1/completions, /v1/chat/completions, /metrics …)."""
    engine_overrides: dict[str, Any] = given.get("engine", {})
    server_overrides: dict[str, Any] = given.get("server", {})
    cache = server_overrides.get("cache")
    cache_overrides: dict[str, Any] = {}
    if tiers is not None:
        if cache is False:
            raise ConfigError("--tiers configures the response cache; drop --no-cache", field="--tiers")
        # Checked now, not after the model has loaded; --tiers implies --cache.
        importlib.import_module("harness.target.cache.policy").load_tier_file(tiers)
        server_overrides["cache"] = True
        cache_overrides["tier_file"] = tiers.resolve()
    if ready_file is not None:
        ready_file.unlink(missing_ok=True)  # a stale file from an earlier run must not look ready
    try:
        run_server(engine_overrides, server_overrides, ready_file, cache_overrides)
    except ConfigError as exc:
        raise named_by_flag(exc, given) from None


def check_settings(given: dict[str, Any]) -> None:
    """The engine's and the server's settings with the options ``given`` (``{"engine": {...},
    "server": {...}}``, as :func:`serve` receives them) validate: what the server checks before it
    loads a model, for a caller that will start one (its serve arguments)."""
    try:
        load_settings(EngineSettings, **given.get("engine", {}))
        load_settings(ServerSettings, **given.get("server", {}))
    except ConfigError as exc:
        raise named_by_flag(exc, given) from None


def named_by_flag(exc: ConfigError, given: dict[str, Any]) -> ConfigError:
    """A setting given as a flag is named by the flag, not by the variable it overrode."""
    for opt in SERVE_OPTIONS:
        section, name = opt.path
        variable = f"HARNESS__{section.upper()}__{name.upper()}"
        if exc.field == variable and name in given.get(section, {}):
            exc.field = opt.long
    return exc


def serve_argv(options: dict[str, Any]) -> list[str]:
    """``harness serve`` arguments from options by name, each its flag with underscores
    (``{"preset": "tiny", "cache": True, "max_num_seqs": 8}`` → ``["--preset", "tiny", "--cache",
    "--max-num-seqs", "8"]``): a recipe's serve arguments written as a mapping. An unknown name is a
    ``ValueError`` listing the known ones."""
    by_key = {o.long.removeprefix("--").replace("-", "_"): o for o in SERVE_OPTIONS}
    unknown = sorted(set(options) - by_key.keys())
    if unknown:
        known = ", ".join(by_key)
        raise ValueError(f"not an option of harness serve: {', '.join(unknown)} (known: {known})")
    argv: list[str] = []
    for key, value in options.items():
        opt = by_key[key]
        on, _, off = flag_names(opt.name, opt.info)[0].partition("/")
        if isinstance(value, bool):
            if value or off:
                argv.append(on if value else off)
        elif value is not None:
            argv += [on, str(value)]
    return argv
