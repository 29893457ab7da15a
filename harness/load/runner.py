"""Launch a headless Locust run of the load stage from Python (other stages, CI, tests).

The launcher never runs gevent in the caller's process: it starts ``python -m locust -f FILE
--headless …`` as a child process (its own interpreter, so Locust's monkey-patching cannot touch the
caller), waits for it and returns its exit code (``docs/exit-codes.md``). The results land in
``results_dir`` (``records.jsonl``, ``summary.json``), which
:func:`harness.load.run_summary.read_summary` reads back::

    from harness.load.runner import LoadSpec, run_locust
    spec = LoadSpec(host="http://127.0.0.1:8000", corpus="runs/corpus", rate=20, duration=60,
                    stage="cold", results_dir="runs/cold")  # the load options, validated once
    code = run_locust(spec)
    summary = read_summary("runs/cold")
    warm = spec.replace(stage="warm", results_dir="runs/warm")  # a variant, validated in its turn

Ctrl-C in the caller is passed on as SIGINT, so the child still finalizes its results. A caller
started with SIGINT ignored (``nohup``, ``cmd &`` in a script) passes that on to the child, which
would then never hear it: such a child is stopped with SIGTERM, which Locust always handles the same
way (a graceful shutdown, results finalized as interrupted, exit 130).
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.common.errors import ConfigError
from harness.load import locustfiles
from harness.load.options import OPTIONS_JSON, LoadOptions

_SHIPPED = Path(locustfiles.__file__).parent
LOCUSTFILES: dict[str, Path] = {"replay": _SHIPPED / "replay.py", "warmup": _SHIPPED / "warmup.py"}
"""The locustfiles shipped in the package (:mod:`harness.load.locustfiles`), wherever it is installed."""


@dataclass(frozen=True, init=False)
class LoadSpec:
    """A load run to launch: the target and the launcher's settings, and the run's
    :class:`~harness.load.options.LoadOptions` (what to send and when, where the results go).

    ``LoadSpec(host=URL, corpus=…, rate=…, results_dir=…)``: every keyword besides the launcher's own
    is a load option, validated here, once (a bad value is a :class:`ConfigError` now); or
    ``options=`` an already validated :class:`LoadOptions`. ``locustfile`` is ``"replay"``,
    ``"warmup"`` (the ladder; needs the ``plan`` option) or a path; ``processes`` runs Locust's
    ``--processes N`` (one master, N workers, one results directory); ``run_time`` is Locust's
    ``--run-time`` (``"90s"``: a cap, the rest of the schedule is not sent); ``extra_args`` go to
    Locust verbatim (``["--csv", "out/locust"]``).
    """

    host: str
    options: LoadOptions
    locustfile: str | Path = "replay"
    processes: int | None = None
    run_time: str | None = None
    extra_args: tuple[str, ...] = ()

    def __init__(
        self,
        host: str,
        *,
        options: LoadOptions | None = None,
        locustfile: str | Path = "replay",
        processes: int | None = None,
        run_time: str | None = None,
        extra_args: Sequence[str] = (),
        **option_values: Any,
    ) -> None:
        if options is not None and option_values:
            raise TypeError("give options= or load option keywords, not both")
        set_ = functools.partial(object.__setattr__, self)
        set_("host", host)
        set_("options", options if options is not None else LoadOptions.validated(option_values))
        set_("locustfile", locustfile)
        set_("processes", processes)
        set_("run_time", run_time)
        set_("extra_args", tuple(extra_args))

    def replace(self, **changes: Any) -> LoadSpec:
        """This spec with ``changes``: the launcher's fields as given, load options through
        :meth:`LoadOptions.evolve` (``None``: back to the option's default)."""
        own = {name: changes.pop(name) for name in _SPEC_FIELDS if name in changes}
        options = self.options.evolve(**changes) if changes else self.options
        fields = {name: getattr(self, name) for name in _SPEC_FIELDS} | own
        return LoadSpec(options=options, **fields)

    def command(self) -> list[str]:
        """The ``locust`` command line for this spec."""
        lf = LOCUSTFILES.get(str(self.locustfile), Path(self.locustfile))
        if not lf.is_file():
            raise ConfigError(f"no locustfile {lf}", field="locustfile")
        opts = self.options
        if str(self.locustfile) == "warmup" and opts.plan is None:
            raise ConfigError("the warmup ladder needs a plan", field="plan")
        cmd = [
            sys.executable,
            "-m",
            "locust",
            "-f",
            str(lf),
            "--headless",
            "--host",
            self.host,
            "--only-summary",
        ]
        # The validated options as one object, validated again as the same model in every Locust
        # process (and sent on by the master to its workers): no flag is re-parsed on the way.
        cmd += [OPTIONS_JSON, opts.to_json()]
        if self.processes:
            cmd += ["--processes", str(self.processes)]
            if "--master-bind-port" not in self.extra_args:
                # A free port, so that parallel runs (CI, several engineers) never meet on 5557.
                port = free_port()
                cmd += ["--master-bind-port", str(port), "--master-port", str(port)]
        if self.run_time:
            cmd += ["--run-time", self.run_time]
        cmd += list(self.extra_args)
        return cmd


_SPEC_FIELDS = ("host", "locustfile", "processes", "run_time", "extra_args")
""":class:`LoadSpec`'s own fields (the rest are load options)."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_locust(
    spec: LoadSpec,
    *,
    timeout_s: float | None = None,
    log_file: str | Path | None = None,
    env: Mapping[str, str] | None = None,
) -> int:
    """Run ``spec`` as a headless Locust child process; its exit code (``docs/exit-codes.md``).

    Output goes to ``log_file`` (default: ``results_dir/locust.log``). ``timeout_s`` sends SIGINT
    when exceeded (the run then finalizes as interrupted, exit 130) and kills it if it still runs
    30 s later. The child imports ``harness`` as this interpreter does (installed, or editable from
    a checkout); the locustfile is found in the package itself, not through a checkout's layout.
    """
    cmd = spec.command()
    secrets = spec.options.credentials().to_env()  # the key and headers: not in argv, not in ps
    results = spec.options.results_dir
    results.mkdir(parents=True, exist_ok=True)
    log_path = Path(log_file) if log_file is not None else results / "locust.log"
    child_env = {**os.environ, **(env or {}), **secrets}
    # SIGINT where the child hears it: a terminal's Ctrl-C reaches the child too, and a second SIGINT
    # is what Locust expects then; SIGTERM where the child inherits SIGINT ignored.
    stop = signal.SIGTERM if signal.getsignal(signal.SIGINT) is signal.SIG_IGN else signal.SIGINT
    with log_path.open("ab") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=child_env)
        try:
            return proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.send_signal(stop)
        except KeyboardInterrupt:
            proc.send_signal(stop)
            proc.wait(60)
            raise
        try:
            return proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait()
