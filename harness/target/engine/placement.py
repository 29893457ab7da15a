"""Where the engine computes: its torch threads, the CPUs they may run on, and the CPUs left to the
server's front end (event loop, HTTP, tokenizer, response cache).

Why: on a small CPU machine the engine's compute threads and the server's event loop share the
cores. Every few microseconds of front-end work (an SSE chunk, a request's JSON) lands on a core a
compute thread was using, and the step stalls until both are done. vLLM's CPU build avoids it by
binding its compute threads to all cores but one and leaving that one to its API server
(``VLLM_CPU_OMP_THREADS_BIND=auto``). ``bind_cores="auto"`` does the same here:

* the engine binds itself to the compute CPUs before its first torch call, so the OpenMP team it
  starts (its intra-op threads) is created there and inherits the binding: the engine process's
  main thread before it loads the model, or (``--step-loop thread``) the step-loop thread when it
  starts;
* the server's main thread (its event loop, and every thread it starts later: the response cache's
  pools, a step-loop thread before it re-binds) binds itself to the rest.

Linux binds threads (``sched_setaffinity`` on the calling thread); elsewhere binding is refused
with a clear error, and ``off`` (the default) changes nothing anywhere.
"""

from __future__ import annotations

import logging
import os
from collections.abc import MutableMapping
from dataclasses import dataclass

from harness.common.errors import ConfigError

log = logging.getLogger(__name__)

BIND_FIELD = "HARNESS__ENGINE__BIND_CORES"

SPIN_ENV = "GOMP_SPINCOUNT"
SPIN_COUNT = 10_000
"""How long a compute thread that reached a barrier first spins before it sleeps (libgomp's own
``GOMP_SPINCOUNT``; its default is 300,000). Why: a spinning thread keeps its core busy, so when
another process (a CI job, a busy loop) preempts one thread of the team, the kernel never moves that
thread to the core its teammate spins on, and every parallel region waits for the preempted one's
next turn. Beside one busy loop on 2 cores (measured 2026-12-07, ``harness serve --preset
smollm2``): 1 stream 20.7 → 0.8 tok/s with the default, → 9.2 with 10,000; 8 streams 114.7 → 4.5,
→ 52.5; quiet, the same within noise (22.3–22.8 against 21.1–22.4 tok/s at 1 stream, 116 at 8).
Never spinning (``OMP_WAIT_POLICY=PASSIVE``) cost the tiny preset 1.6× in TPOT on a quiet machine."""


def spin_briefly(environ: MutableMapping[str, str] = os.environ) -> bool:
    """Set :data:`SPIN_ENV` to :data:`SPIN_COUNT` unless a wait policy was chosen (``OMP_WAIT_POLICY``
    or ``GOMP_SPINCOUNT`` already set: the user's choice stands); whether it was set. libgomp reads
    it when torch loads it: the engine process gets it in the environment it starts with; a step
    loop on a thread sets it in this process before torch is imported here."""
    if SPIN_ENV in environ or "OMP_WAIT_POLICY" in environ:
        return False
    environ[SPIN_ENV] = str(SPIN_COUNT)
    return True


@dataclass(frozen=True)
class Placement:
    """The engine's CPUs and threads, and the front end's CPUs (``None``: not bound)."""

    compute: frozenset[int] | None = None
    """CPUs of the engine's step-loop thread and its OpenMP team."""
    front: frozenset[int] | None = None
    """CPUs of the server's event loop (and anything else the main thread runs or starts)."""
    threads: int | None = None
    """torch intra-op threads (``torch.set_num_threads``); ``None``: torch's default."""

    def describe(self) -> str:
        """One line for the server's start-up log and ``/v1/models``."""
        if self.compute is None:
            return f"compute threads {self.threads or 'torch default'}, not bound"
        return (
            f"compute threads {self.threads} on CPUs {cpu_list(self.compute)}, "
            f"front end on CPUs {cpu_list(self.front or frozenset())}"
        )


def cpu_list(cpus: frozenset[int]) -> str:
    """``{0, 1, 2, 5}`` → ``"0-2,5"`` (the kernel's own spelling, as in ``taskset -c``)."""
    out: list[str] = []
    run: list[int] = []
    for c in sorted(cpus):
        if run and c != run[-1] + 1:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
            run = []
        run.append(c)
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def parse_cpu_list(text: str, field: str = BIND_FIELD) -> frozenset[int]:
    """``"0-2,5"`` → ``{0, 1, 2, 5}``; a malformed list is a :class:`ConfigError` naming ``field``."""
    cpus: set[int] = set()
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ConfigError(f"'{text}' is not a CPU list (like '1-3' or '0,2'): '{part}'", field=field)
        a, b = int(lo), int(hi) if sep else int(lo)
        if b < a:
            raise ConfigError(f"'{part}' in '{text}' runs backwards", field=field)
        cpus.update(range(a, b + 1))
    return frozenset(cpus)


def available_cpus() -> frozenset[int] | None:
    """The CPUs this process may run on; ``None`` where the platform cannot bind threads."""
    getter = getattr(os, "sched_getaffinity", None)
    return frozenset(getter(0)) if getter is not None else None


def plan(bind_cores: str, cpu_threads: int | None, available: frozenset[int] | None = None) -> Placement:
    """The placement ``bind_cores`` (``off``, ``auto`` or a CPU list) and ``cpu_threads`` ask for.

    ``auto`` keeps one CPU for the front end and computes on the others, one thread each (on a
    one-CPU machine there is nothing to split: not bound). A CPU list is the compute CPUs; the front
    end gets the rest, or shares them when the list takes every CPU. ``cpu_threads`` defaults to
    the compute CPUs' count when bound, torch's own default when not.
    """
    mode = bind_cores.strip().lower()
    if mode == "off":
        return Placement(threads=cpu_threads)
    avail = available if available is not None else available_cpus()
    if avail is None:
        raise ConfigError(
            f"bind_cores={bind_cores!r} needs thread CPU affinity (Linux); use 'off' here", field=BIND_FIELD
        )
    if mode == "auto":
        if len(avail) < 2:
            log.info("bind_cores=auto: one CPU only, nothing to keep for the front end; not bound")
            return Placement(threads=cpu_threads)
        ordered = sorted(avail)
        compute = frozenset(ordered[:-1])
    else:
        compute = parse_cpu_list(mode)
        missing = compute - avail
        if missing:
            raise ConfigError(
                f"CPUs {cpu_list(frozenset(missing))} of '{bind_cores}' are not available to this process "
                f"(it may run on {cpu_list(avail)})",
                field=BIND_FIELD,
            )
    front = (avail - compute) or avail
    return Placement(compute=compute, front=frozenset(front), threads=cpu_threads or len(compute))


def enter_compute(placement: Placement) -> None:
    """On the engine's step-loop thread, before its first torch call: bind it (its OpenMP team is
    created by it, and inherits the binding) and set torch's intra-op threads."""
    if placement.compute is not None:
        _bind(placement.compute, "the engine")
    if placement.threads is not None:
        import torch

        torch.set_num_threads(placement.threads)


def enter_front(placement: Placement) -> None:
    """On the server's main thread, after the model has loaded: keep it (and every thread it
    starts from now on) off the compute CPUs."""
    if placement.front is not None:
        _bind(placement.front, "the front end")


def _bind(cpus: frozenset[int], who: str) -> None:
    try:
        os.sched_setaffinity(0, cpus)  # Linux: the calling thread only
    except OSError as exc:  # CPUs taken away since the plan (a cgroup change): serve unbound, say so
        log.warning("could not bind %s to CPUs %s (%s); it runs unbound", who, cpu_list(cpus), exc)
