"""Fault injection of ``harness serve``: each kind of regression on purpose, so that a CI gate can be
shown to catch it.

Four injections, never on by default and loud when on: one warning line each on stderr at
start-up, ``GET /health``'s ``fault_injection`` object, and the gauge
``harness_server_fault_injection_active{kind}`` (1 for each active kind, 0 for the others).

* ``slowdown`` (``--inject-slowdown F``, an engine setting): every engine step takes F times as long
  (:class:`harness.target.engine.core.EngineCore` waits out the extra after the step).
* ``kv_overalloc`` (``--inject-kv-overalloc F``, an engine setting): every prefill takes
  ``ceil((1 + F) × n)`` KV blocks where it needs ``n`` (:class:`harness.target.engine.kv_cache.BlockManager`
  holds the extra ones, unwritten and never cached, until the request ends), so each request's
  ``prefill_kv_bytes`` and the gate ``prefill_kv_bytes_per_token_p95`` rise by about F; the tokens
  are the same.
* ``error_rate`` (``--inject-error-rate P``): a fraction P of generation requests answers HTTP 500
  with an OpenAI error body (``code: injected_fault``) before any cache lookup or generation.
* ``cache_miss_rate`` (``--inject-cache-miss-rate P``): a fraction P of generation requests misses
  both the response cache (the stack answers ``MISS`` without looking, and stores nothing at the
  end) and the engine's prefix cache (``use_prefix_cache=False``: the whole prompt is computed and
  none of its blocks registered). The answer is the engine's, as correct as any miss's, and the
  next identical request finds the caches as this one left them untouched.

The per-request injections draw from one ``random.Random(--inject-seed)`` stream, in the order
requests pass validation: an error draw when ``error_rate`` is on, then, for a request not failed,
a miss draw when ``cache_miss_rate`` is on. Draws are independent uniforms, so over n requests the
number failed is Binomial(n, P_error) and, of the rest, the number made to miss is
Binomial(n_rest, P_miss); the same seed and request order inject the same requests. A response an
injection hit carries ``x-harness-fault: error | cache-miss`` and counts in
``harness_server_injected_faults_total{kind}``, so a client can verify what was injected.

None of it is in ``GET /v1/models``: its card is the identity a baseline compares, and an injected
target is the same target with a regression, to be judged, not excused as another target.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Literal

from prometheus_client import Counter

from harness.target.server.errors import APIError
from harness.target.server.settings import ServerSettings

FaultKind = Literal["error", "cache-miss"]
"""What an injection did to one request (the ``x-harness-fault`` header's values)."""
FAULT_KINDS: tuple[FaultKind, ...] = ("error", "cache-miss")
INJECTIONS: tuple[str, ...] = ("slowdown", "error_rate", "cache_miss_rate", "kv_overalloc")
"""The injections a server can run with (the ``kind`` of the active gauge, the names in ``/health``)."""


@dataclass(frozen=True, slots=True)
class FaultPlan:
    """Which injections a server runs with (all off by default)."""

    error_rate: float = 0.0
    cache_miss_rate: float = 0.0
    slowdown: float = 1.0
    seed: int = 0
    kv_overalloc: float = 0.0

    @classmethod
    def from_settings(
        cls, settings: ServerSettings, slowdown: float = 1.0, kv_overalloc: float = 0.0
    ) -> FaultPlan:
        """The server's injections; ``slowdown`` and ``kv_overalloc`` are the engine's
        (``EngineSettings.inject_slowdown``, ``EngineSettings.inject_kv_overalloc``)."""
        s = settings
        return cls(s.inject_error_rate, s.inject_cache_miss_rate, slowdown, s.inject_seed, kv_overalloc)

    @property
    def active(self) -> tuple[str, ...]:
        """The names (of :data:`INJECTIONS`) of the injections that are on."""
        on = {
            "slowdown": self.slowdown > 1.0,
            "error_rate": self.error_rate > 0.0,
            "cache_miss_rate": self.cache_miss_rate > 0.0,
            "kv_overalloc": self.kv_overalloc > 0.0,
        }
        return tuple(name for name in INJECTIONS if on[name])

    @property
    def per_request(self) -> bool:
        """Whether requests are drawn for (an injection the route applies is on)."""
        return self.error_rate > 0.0 or self.cache_miss_rate > 0.0

    def describe(self) -> dict[str, Any]:
        """``/health``'s ``fault_injection``: what is on, and every setting (off ones included)."""
        return {
            "active": list(self.active),
            "slowdown": self.slowdown,
            "error_rate": self.error_rate,
            "cache_miss_rate": self.cache_miss_rate,
            "kv_overalloc": self.kv_overalloc,
            "seed": self.seed,
        }

    def warnings(self) -> list[str]:
        """One start-up line per active injection (printed after ``fault injection:``)."""
        lines = []
        if self.slowdown > 1.0:
            lines.append(f"every engine step {self.slowdown:g}× as long (--inject-slowdown)")
        if self.error_rate > 0.0:
            lines.append(
                f"{self.error_rate * 100:.4g} % of generation requests answer HTTP 500 "
                f"(--inject-error-rate, seed {self.seed})"
            )
        if self.cache_miss_rate > 0.0:
            lines.append(
                f"{self.cache_miss_rate * 100:.4g} % of generation requests miss the response and "
                f"prefix caches (--inject-cache-miss-rate, seed {self.seed})"
            )
        if self.kv_overalloc > 0.0:
            lines.append(
                f"every prefill takes {self.kv_overalloc * 100:.4g} % more KV blocks than it needs "
                "(--inject-kv-overalloc)"
            )
        return [f"{line}: a regression on purpose" for line in lines]


class FaultInjector:
    """Draws, per generation request, which injection (if any) hits it.

    Only a server with a per-request injection has one (:attr:`FaultPlan.per_request`): without,
    the route's one check is that it is ``None``. Draws happen on the event loop, one request at a
    time, so the stream's order is the order requests pass validation.
    """

    def __init__(self, plan: FaultPlan, injected: Counter) -> None:
        self.plan = plan
        self._rng = random.Random(plan.seed)
        self._errors = injected.labels("error")
        self._misses = injected.labels("cache-miss")

    def draw(self) -> FaultKind | None:
        """This request's fault: ``error``, ``cache-miss`` or ``None``, counted when drawn."""
        plan = self.plan
        # ``random()`` is uniform on [0, 1): ``< P`` has probability exactly P (1.0: always).
        if plan.error_rate > 0.0 and self._rng.random() < plan.error_rate:
            self._errors.inc()
            return "error"
        if plan.cache_miss_rate > 0.0 and self._rng.random() < plan.cache_miss_rate:
            self._misses.inc()
            return "cache-miss"
        return None

    def error(self) -> APIError:
        """The injected failure: a 500 shaped like any server error of ours, saying it was on purpose."""
        return APIError(
            500,
            f"injected fault: this server fails {self.plan.error_rate * 100:.4g} % of requests on purpose "
            "(harness serve --inject-error-rate)",
            type="server_error",
            code="injected_fault",
            reason="injected_error",
        )
