"""The target of a paired run or a capacity search: a ``harness serve`` we start, or any
OpenAI-compatible server at a URL, and the cache levels a run empties.

:class:`Target` pairs the target's one client (:class:`harness.load.target.TargetClient`: every
call to it, with its credentials) with what only a command that drives it knows: the model its
requests name when no ``--model`` was given, and the ``harness serve`` child it started, if any
(:func:`harness.experiments.driver.open_target` makes both).

What ``harness run`` needs from a target beyond the load itself is its cache levels: flushing them
before the cold phase (here), and asking whether they are warm before the warm phase
(:mod:`harness.experiments.warmcheck`). Those are admin endpoints only some servers have, so every
one is optional: an endpoint that answers 404 is *not exposed* by this target
(:class:`~harness.load.target.NotExposed`: a server without ``--cache``, vLLM outside its dev mode,
TGI, llama.cpp), and the run says which levels it skipped rather than failing.

* :data:`FLUSH_LEVELS` (a :class:`~harness.common.registry.Registry`): the response cache with its
  Bloom guard (``POST /cache/flush?tier=all``) and the engine's KV prefix cache
  (``POST /reset_prefix_cache``, vLLM's endpoint).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from harness.common.auth import Credentials
from harness.common.registry import Registry
from harness.load.target import NotExposed, TargetClient
from harness.target.server.launch import ServerProcess


@dataclass
class Target:
    """Where the load goes: its client, the model it serves, the ``harness serve`` child we started."""

    client: TargetClient
    model: str | None = None
    """The first model id of the target's ``GET /v1/models`` (``None``: it lists none): what
    requests name when no ``--model`` was given."""
    server: ServerProcess | None = None
    """The ``harness serve`` child this run started (``None`` for ``--url``)."""

    @property
    def url(self) -> str:
        return self.client.url

    @property
    def credentials(self) -> Credentials:
        """Key, admin token, extra headers and TLS policy for every call to the target."""
        return self.client.credentials


# ------------------------------------------------------------------------------------- flushing

FlushStatus = Literal["flushed", "not exposed"]


@dataclass(frozen=True)
class FlushOutcome:
    """One cache level before the cold phase: flushed (with the target's answer) or not exposed."""

    level: str
    status: FlushStatus
    detail: str
    answer: dict[str, Any] | None = None


@dataclass(frozen=True)
class FlushLevel:
    """A cache level a paired run empties before its cold phase."""

    what: str
    """What the level is, for messages."""
    call: Callable[[TargetClient], dict[str, Any]]


FLUSH_LEVELS: Registry[FlushLevel] = Registry("cache level")
"""The levels emptied before the cold phase, in order."""

FLUSH_LEVELS.register("response")(
    FlushLevel(
        "response cache (L1, L2, L3) and its Bloom guard",
        lambda t: t.cache_flush("all"),
    )
)
FLUSH_LEVELS.register("kv")(FlushLevel("engine KV prefix cache", lambda t: t.reset_prefix_cache()))


def flush_all(target: TargetClient) -> list[FlushOutcome]:
    """Empty every cache level the target exposes; a level that answers 404 is reported, not fatal.

    Write-backs of requests that already finished are waited for first (``POST /cache/drain``), so
    none lands in a tier after it was flushed.
    """
    with contextlib.suppress(NotExposed):
        target.cache_drain(60.0)
    out: list[FlushOutcome] = []
    for name, level in FLUSH_LEVELS.items():
        try:
            answer = level.call(target)
        except NotExposed as exc:
            out.append(FlushOutcome(name, "not exposed", f"{level.what}: not exposed by the target ({exc})"))
            continue
        out.append(FlushOutcome(name, "flushed", level.what, answer))
    return out
