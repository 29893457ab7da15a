"""Launch a headless Locust run of the load stage from Python (other stages, CI, tests).

The launcher never runs gevent in the caller's process: it starts ``python -m locust -f FILE
--headless …`` as a child process (its own interpreter, so Locust's monkey-patching cannot touch the
caller), waits for it and returns its exit code (``docs/exit-codes.md``). The results land in
``results_dir`` (``records.jsonl``, ``summary.json``), which :func:`harness.load.results.read_summary`
reads back::

    from harness.load.runner import LoadSpec, run_locust
    code = run_locust(
        LoadSpec(host="http://127.0.0.1:8000", corpus="runs/corpus", rate=20, duration=60,
                 stage="cold", results_dir="runs/cold"),
    )
    summary = read_summary("runs/cold")

Ctrl-C in the caller is passed on as SIGINT, so the child still finalizes its results. A caller
started with SIGINT ignored (``nohup``, ``cmd &`` in a script) passes that on to the child, which
would then never hear it: such a child is stopped with SIGTERM, which Locust always handles the same
way (a graceful shutdown, results finalized as interrupted, exit 130).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from harness.common.errors import ConfigError
from harness.load import locustfiles
from harness.load.options import LoadOptions

_SHIPPED = Path(locustfiles.__file__).parent
LOCUSTFILES: dict[str, Path] = {"replay": _SHIPPED / "replay.py", "warmup": _SHIPPED / "warmup.py"}
"""The locustfiles shipped in the package (:mod:`harness.load.locustfiles`), wherever it is installed."""


@dataclass
class LoadSpec:
    """A load run to launch: the target, what to send and when, and where the results go.

    ``locustfile`` is ``"replay"``, ``"warmup"`` (the ladder; needs ``plan``) or a path. Every other
    field is the load option of the same name (:class:`harness.load.options.LoadOptions`);
    ``processes`` runs Locust's ``--processes N`` (one master, N workers, one results directory);
    ``extra_args`` go to Locust verbatim (``["--csv", "out/locust"]``).
    """

    host: str
    results_dir: str | Path
    corpus: str | Path | None = None
    locustfile: str | Path = "replay"
    schedule: str | Path | None = None
    rate: float | None = None
    duration: float | None = None
    stage: str | None = None
    plan: str | Path | None = None
    preload: str | Path | None = None
    model: str | None = None
    max_tokens_cap: int | None = None
    max_requests: int | None = None
    speedup: float | None = None
    concurrency: int | None = None
    api: str | None = None
    token_counting: str | None = None
    tokenizer: str | Path | None = None
    otlp_endpoint: str | None = None
    warmup_id: str | None = None
    start_delay: float | None = None
    drain_timeout: float | None = None
    bypass_fraction: float | None = None
    seed: int | None = None
    capacity: float | None = None
    """The target's capacity (requests/s): resolves ladder stages given as a share of it."""
    processes: int | None = None
    until_precision: float | str | None = None
    """Stop sending once every ``precision_on`` percentile is this precise (``0.1`` or ``"10%"``)."""
    max_duration: float | None = None
    precision_on: str | None = None
    precision_confidence: float | None = None
    precision_min_samples: int | None = None
    api_key: str | None = field(default=None, repr=False)
    admin_token: str | None = field(default=None, repr=False)
    header: Sequence[str] = field(default=(), repr=False)
    """Extra ``NAME:VALUE`` headers; these three reach the child through its environment, never argv."""
    ca_bundle: str | Path | None = None
    insecure: bool | None = None
    run_time: str | None = None
    """Locust's ``--run-time`` (``"90s"``, ``"5m"``): a cap; the rest of the schedule is not sent."""
    extra_args: Sequence[str] = field(default_factory=tuple)

    def options(self) -> LoadOptions:
        """The load options this spec sets (validated: a bad value is a :class:`ConfigError` now)."""
        raw = {
            name: getattr(self, name)
            for name in LoadOptions.model_fields
            if hasattr(self, name) and getattr(self, name) not in (None, ())
        }
        if "header" in raw:
            raw["header"] = list(raw["header"])
        try:
            return LoadOptions.model_validate(raw)
        except ValidationError as exc:
            err = exc.errors()[0]
            name = str(err["loc"][0]) if err.get("loc") else None
            msg = err.get("msg", "invalid value").removeprefix("Value error, ")
            raise ConfigError(msg, field=f"--{name.replace('_', '-')}" if name else None) from None

    def command(self) -> list[str]:
        """The ``locust`` command line for this spec."""
        lf = LOCUSTFILES.get(str(self.locustfile), Path(self.locustfile))
        if not lf.is_file():
            raise ConfigError(f"no locustfile {lf}", field="locustfile")
        opts = self.options()
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
        cmd += opts.to_args()
        if "--results-dir" not in cmd:
            cmd += ["--results-dir", str(self.results_dir)]
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
    secrets = spec.options().credentials().to_env()  # the key and headers: not in argv, not in ps
    results = Path(spec.results_dir)
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
