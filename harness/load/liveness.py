"""Whether the target is still there: a target that dies mid-run is named as such, not as N errors.

A server whose process died (vLLM's engine raising on a seeded request and taking the API server
down with it, an OOM kill, a crash) makes every later request fail, and a run that only counted
them would report "20 errors" — the same words as a server that answered 20 bad requests. The
process that sees every record (the local one, or the master) keeps a :class:`TargetWatch`:

* a request that failed **on the target's side** extends the streak of such failures: no answer at
  all (status 0: refused, reset, timed out), a 5xx, or a 200 whose stream then carried the server's
  error or broke off (vLLM answers every request in flight when its engine dies with ``200`` and
  ``data: {"error": {"message": "EngineCore encountered an issue…"}}``). Any successful request ends
  the streak. A 4xx never counts: the target answered, it refused the request;
* after :data:`DEAD_AFTER_FAILURES` of them in a row (and once more when the run ends with such a
  streak), the target's health is asked directly (:func:`probe_health`: ``GET /health``, else
  ``GET /v1/models`` where ``/health`` is 404). A refused connection or a 5xx there is the evidence
  that the target died; a health check that times out proves nothing (an overloaded server is slow,
  not dead), and the run goes on;
* the target must have been alive during the run (it answered a request, or the health check at the
  start): one that was never reachable did not die, it was never there.

When the target is found dead the run stops sending (what it would send can only fail), the records
so far are finalized, ``summary.json`` carries :class:`~harness.load.run_summary.TargetDeath`, and the
process exits with :attr:`~harness.common.errors.ExitCode.TARGET_DIED` (7).

Runs in a Locust process: the health checks use the gevent client (:mod:`harness.load.client`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from harness.common.auth import Credentials
from harness.load.results import RequestRecord
from harness.load.run_summary import TargetDeath
from harness.load.stream import NOT_DONE

log = logging.getLogger("harness.load")

DEAD_AFTER_FAILURES = 3
"""Unanswered requests in a row (none succeeding between them) before the target's health is asked."""
HEALTH_TIMEOUT_S = 5.0
HEALTH_PATHS = ("/health", "/v1/models")
"""Asked in order; a 404 moves on to the next (not every OpenAI-compatible server has ``/health``)."""


STREAM_FAILURES = ("in-stream error: ", NOT_DONE)
"""How the replay records a 200 whose stream failed on the server's side (:mod:`harness.load.client`)."""


def unanswered(rec: RequestRecord) -> bool:
    """A failure on the target's side, not the request's: no HTTP answer at all, a 5xx, or a stream
    that carried the server's error or broke off after a 200 (a 4xx is an answer: never)."""
    if rec.ok or rec.blocked_by is not None:  # a call never sent (its predecessor failed) proves nothing
        return False
    if rec.status == 0 or rec.status >= 500:
        return True
    return 200 <= rec.status < 300 and rec.error is not None and rec.error.startswith(STREAM_FAILURES)


@dataclass(frozen=True)
class Health:
    """One health check: ``alive`` is ``True`` / ``False`` when the answer proves it, ``None`` when not."""

    alive: bool | None
    evidence: str


def probe_health(host: str, creds: Credentials) -> Health:
    """Ask the target whether it is alive (Locust processes only: the gevent client).

    ``GET /health`` (ours, vLLM, TGI, llama.cpp, SGLang have it); where it is 404, ``GET /v1/models``.
    A 2xx proves it alive; a refused or reset connection, or a 5xx (vLLM answers 503 once its engine
    is dead), proves it dead; a timeout or any other answer proves nothing."""
    from harness.load.client import base_path, gevent_client

    last = Health(None, "no health endpoint answered")
    for path in HEALTH_PATHS:
        what = f"GET {path}"
        try:
            client = gevent_client(
                host, creds, network_timeout=HEALTH_TIMEOUT_S, connection_timeout=HEALTH_TIMEOUT_S
            )
            try:
                resp = client.get(base_path(host) + path, headers=creds.request_headers())
                resp.read()
            finally:
                client.close()
        except OSError as exc:  # refused, reset, unreachable (a timeout is one too, and proves nothing)
            if isinstance(exc, TimeoutError) or "timed out" in str(exc).lower():
                return Health(None, f"{what}: no answer within {HEALTH_TIMEOUT_S:g} s")
            return Health(False, creds.redact(f"{what}: {type(exc).__name__}: {exc}"))
        except Exception as exc:  # a malformed answer: the target is there, saying something odd
            return Health(None, creds.redact(f"{what}: {type(exc).__name__}: {exc}"))
        status = int(resp.status_code)
        if 200 <= status < 300:
            return Health(True, f"{what} answered {status}")
        if status >= 500:
            return Health(False, f"{what} answered {status}")
        last = Health(None, f"{what} answered {status}")
        if status != 404:
            break
    return last


@dataclass
class TargetWatch:
    """Local / master: the streak of requests that failed on the target's side, and the verdict once it
    is dead.

    ``probe`` is :func:`probe_health` bound to the run's host and credentials (a test may pass another
    callable); ``on_death`` is called once, with the verdict, when the target is found dead."""

    probe: Callable[[], Health]
    on_death: Callable[[TargetDeath], None]
    threshold: int = DEAD_AFTER_FAILURES
    alive_seen: bool = False
    """The target answered during the run (a successful request, or a health check)."""
    streak: int = 0
    """Unanswered requests since the last successful one."""
    failing_since_s: float | None = None
    """``sent_s`` of the streak's first request."""
    last_ok_s: float | None = None
    """``sent_s`` of the last successful request."""
    last_error: str | None = None
    checked_at_streak: int = 0
    """The streak length the last health check was made at (one check per new failure at most)."""
    death: TargetDeath | None = None

    def add(self, records: Iterable[RequestRecord]) -> None:
        """Requests as they complete (in completion order)."""
        for rec in records:
            if rec.ok:
                self.alive_seen = True
                self.streak = 0
                self.failing_since_s = None
                self.checked_at_streak = 0
                self.last_ok_s = rec.sent_s if self.last_ok_s is None else max(self.last_ok_s, rec.sent_s)
            elif unanswered(rec):
                if self.streak == 0:
                    self.failing_since_s = rec.sent_s
                self.streak += 1
                self.last_error = rec.error

    def note_start(self, health: Health) -> None:
        """The health check made at the start of the run."""
        if health.alive:
            self.alive_seen = True

    def due(self, *, final: bool = False) -> bool:
        """Whether the target's health should be asked now (at the end of the run: any streak)."""
        if self.death is not None or self.streak in (0, self.checked_at_streak):
            return False
        return final or self.streak >= self.threshold

    def check(self, now_s: float, *, final: bool = False) -> TargetDeath | None:
        """Ask the target's health if :meth:`due`; the verdict when this check found it dead."""
        if not self.due(final=final):
            return None
        self.checked_at_streak = self.streak
        health = self.probe()
        if health.alive:
            self.alive_seen = True
            return None
        if health.alive is None or not self.alive_seen:
            if health.alive is False:
                log.warning("harness load: the target is not reachable and never was: %s", health.evidence)
            return None
        self.death = TargetDeath(
            detected_s=round(now_s, 3),
            failing_since_s=self.failing_since_s,
            last_ok_s=self.last_ok_s,
            failed_in_a_row=self.streak,
            last_error=self.last_error,
            evidence=health.evidence,
        )
        log.error("harness load: %s", self.death.describe())
        self.on_death(self.death)
        return self.death
