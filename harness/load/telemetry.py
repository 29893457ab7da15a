"""The target's own telemetry during a run: its Prometheus ``/metrics``, and the local GPUs, scraped.

A client sees latencies; only the server sees why: how many requests it runs and queues, how full
its KV cache is, and how many prompt tokens its prefix cache served. The load stage's local or
master process scrapes ``GET /metrics`` once a second (``--server-metrics-interval``) for the whole
run, beside ``records.jsonl``; :class:`Scraper` is the one scraper of the harness (``harness analysis
scrape`` writes the same lines with it, outside a run). Each scrape becomes a line of
``server_metrics.jsonl``, normalised by :mod:`harness.load.server_metrics` (the file's format, the
server kinds, the per-phase deltas of ``summary.json``); with NVML (:class:`Nvml`: :mod:`pynvml`,
optional, ``pip install nvidia-ml-py``) the local GPUs' memory, utilisation and power go in the same
line.

**Failures** never fail the run: a target without ``/metrics`` (404), one that refuses the
credentials, or one whose names are none of the known kinds is recorded once (an ``error`` line in
the file, a warning in ``summary.json``) and no longer scraped; a scrape that fails otherwise
(timeout, refused) is recorded once and retried each interval.

This module imports neither gevent nor Locust at module level: the warm check
(:mod:`harness.experiments.warmcheck`) takes its :data:`SCRAPE_TIMEOUT_S`; :class:`Scraper` imports
``geventhttpclient`` when it starts, inside a Locust process.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from harness.common.auth import Credentials
from harness.load.run_summary import ServerTelemetry
from harness.load.server_metrics import (
    METRICS_PATH,
    SERVER_KINDS,
    GpuSample,
    SampleWriter,
    ServerKind,
    ServerSample,
    UnknownServer,
    normalise,
    summarize_samples,
)

log = logging.getLogger("harness.load")

NO_METRICS = (404, 405, 501)
"""Answers that mean the target has no ``/metrics`` at all: not asked again."""
SCRAPE_TIMEOUT_S = 5.0
"""How long one scrape may take; a slower one counts as failed (the next goes on schedule)."""


# ------------------------------------------------------------------------------------------- NVML


class Nvml:
    """The local GPUs through NVML, when ``pynvml`` (``nvidia-ml-py``) is installed and a driver
    answers; otherwise :attr:`available` is ``False`` and :attr:`why` says why. It measures the machine
    the load runs on: the target's GPUs only when the target runs here too."""

    def __init__(self) -> None:
        self.available = False
        self.why = ""
        self._handles: list[Any] = []
        try:
            import pynvml
        except ImportError:
            self.why = "pynvml not installed (pip install nvidia-ml-py)"
            return
        self._nv: Any = pynvml
        try:
            pynvml.nvmlInit()
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        except pynvml.NVMLError as exc:
            self.why = f"NVML: {exc}"
            return
        if not self._handles:
            self.why = "NVML sees no GPU"
            return
        self.available = True

    def sample(self) -> list[GpuSample]:
        """Every GPU now; a value NVML refuses (power on some boards) is left ``None``."""
        nv = self._nv
        out: list[GpuSample] = []
        for i, h in enumerate(self._handles):
            mem = nv.nvmlDeviceGetMemoryInfo(h)
            util = _nvml_or_none(nv.nvmlDeviceGetUtilizationRates, h, nv)
            milliwatts = _nvml_or_none(nv.nvmlDeviceGetPowerUsage, h, nv)
            name = _nvml_or_none(nv.nvmlDeviceGetName, h, nv)
            out.append(
                GpuSample(
                    index=i,
                    name=name.decode() if isinstance(name, bytes) else name,
                    memory_used_bytes=int(mem.used),
                    memory_total_bytes=int(mem.total),
                    utilization_pct=float(util.gpu) if util is not None else None,
                    power_w=milliwatts / 1000.0 if milliwatts is not None else None,
                )
            )
        return out

    def close(self) -> None:
        if self.available:
            self._nv.nvmlShutdown()
            self.available = False


def _nvml_or_none(call: Callable[[Any], Any], handle: Any, nv: Any) -> Any:
    try:
        return call(handle)
    except nv.NVMLError:
        return None


# ------------------------------------------------------------------------------------- the scraper


class Scraper:
    """The one scraper of a target's ``/metrics``: each :meth:`scrape` appends a
    :class:`ServerSample` line to ``path`` (a ``server_metrics.jsonl``).

    In a load run it scrapes every ``interval_s`` (:meth:`start`: a greenlet of the local / master
    process, through ``geventhttpclient``) and :meth:`stop` takes a last scrape, so the final
    counters include the run's last requests, and closes the file; ``now`` gives seconds since the
    run's epoch (:meth:`harness.load.plugin.LoadRun.now_s`). Outside a Locust process
    (``harness analysis scrape``) it is ``blocking``: the caller calls :meth:`scrape` on its own
    schedule, through httpx, and :meth:`close` at the end.

    The scrape uses the credentials' admin headers: ``harness serve --protect-metrics`` takes the
    admin token or an API key, and :meth:`Credentials.admin_headers` sends the token, else the key;
    TLS is verified as the credentials say."""

    def __init__(
        self,
        host: str,
        creds: Credentials,
        path: Path,
        *,
        interval_s: float,
        now: Callable[[], float],
        warn: Callable[[str], None],
        blocking: bool = False,
    ) -> None:
        from harness.load.client import base_path

        self.host = host
        self.creds = creds
        self.interval_s = interval_s
        self.now = now
        self.warn = warn
        self.blocking = blocking
        self.path = path
        self.url_path = base_path(host) + METRICS_PATH
        self.url = host.rstrip("/") + METRICS_PATH
        self.writer = SampleWriter(self.path)
        self.samples: list[ServerSample] = []
        """The scrapes so far (what the file holds), for the summary's per-phase deltas."""
        self.kind: ServerKind | None = None
        self.scrapes = 0
        self.failed = 0
        self.first_error: str | None = None
        self.server_off = False
        """Scraping stopped for good (404, refused credentials, unknown names)."""
        self._errors_seen: set[str] = set()
        self.nvml = Nvml()
        self._client: Any = None
        self._greenlet: Any = None
        self._stopped = False

    def start(self) -> None:
        """Scrape once now (the baseline, before the epoch) and then every interval."""
        import gevent

        self._greenlet = gevent.spawn(self._loop)

    def _loop(self) -> None:
        import gevent

        while not self._stopped:
            due = self.now() + self.interval_s
            try:
                self.scrape()
            except Exception:  # a bug here must never end the run
                log.exception("harness load: server metrics scrape failed")
            gevent.sleep(max(0.0, due - self.now()))

    def scrape(self) -> None:
        """One scrape: a line in the file (a GPU-only line when the server is no longer scraped)."""
        if self.writer is None:
            return
        t = self.now()
        gpu = self.nvml.sample() if self.nvml.available else []
        sample: ServerSample | None = None
        if not self.server_off:
            sample = self._scrape_server(t)
        if sample is None:
            if not gpu:
                return
            sample = ServerSample(t_s=round(t, 4))
        if gpu:
            sample = sample.model_copy(update={"gpu": gpu})
        self.samples.append(sample)
        self.writer.write(sample)

    def _scrape_server(self, t: float) -> ServerSample | None:
        self.scrapes += 1
        try:
            status, body = self._get()
        except Exception as exc:  # refused, timed out, reset: the server may come back
            self._failure(t, self.creds.redact(f"{type(exc).__name__}: {exc}"), final=False)
            return None
        if status in NO_METRICS:
            self._failure(
                t, f"GET {self.url_path} answered {status}: the target has no Prometheus metrics", final=True
            )
            return None
        if status in (401, 403):
            self._failure(
                t,
                f"GET {self.url_path} answered {status}: "
                "give the token /metrics takes (--admin-token or --api-key)",
                final=True,
            )
            return None
        if status != 200:
            self._failure(t, f"GET {self.url_path} answered {status}", final=False)
            return None
        # Stamped when the answer arrived: the server read its counters somewhere between the GET and
        # now, so with this stamp a phase that ends before it never counts what happened after its end
        # (stamped at the GET, a scrape slowed across a stage boundary gave the earlier stage hits of
        # the next one). What it may miss instead lands in the next phase, never outside the run.
        t = self.now()
        try:
            sample = normalise(body.decode("utf-8", "replace"), t, self.kind)
        except UnknownServer as exc:
            self._failure(t, str(exc), final=True)
            return None
        except ValueError as exc:
            self._failure(t, f"GET {self.url_path}: not a Prometheus exposition ({exc})", final=False)
            return None
        if self.kind is None:
            self.kind = SERVER_KINDS.get(sample.kind or "")
            log.info("harness load: scraping %s every %g s (%s)", self.url_path, self.interval_s, sample.kind)
        return sample

    def _get(self) -> tuple[int, bytes]:
        if self._client is None:
            self._client = self._connect()
        try:
            if self.blocking:
                answer = self._client.get(self.url, headers=self.creds.admin_headers())
                return int(answer.status_code), bytes(answer.content)
            resp = self._client.get(self.url_path, headers=self.creds.admin_headers())
            return int(resp.status_code), bytes(resp.read())
        except Exception:
            self._client.close()
            self._client = None  # a fresh connection next time
            raise

    def _connect(self) -> Any:
        if self.blocking:
            import httpx

            return httpx.Client(timeout=SCRAPE_TIMEOUT_S, verify=self.creds.httpx_verify())
        from harness.load.client import gevent_client

        return gevent_client(
            self.host, self.creds, network_timeout=SCRAPE_TIMEOUT_S, connection_timeout=SCRAPE_TIMEOUT_S
        )

    def _failure(self, t: float, error: str, *, final: bool) -> None:
        """Record a failure once per kind of error (a line, a warning); ``final`` stops scraping."""
        self.failed += 1
        self.first_error = self.first_error or error
        self.server_off = self.server_off or final
        key = error.split(":", 1)[0]
        if key in self._errors_seen:
            return
        self._errors_seen.add(key)
        what = "not scraped any more" if final else "retried every interval"
        self.warn(f"server metrics: {error} ({what}; the run goes on)")
        self.writer.write(ServerSample(t_s=round(t, 4), error=error))

    def stop(self) -> None:
        """The last scrape, then close the file. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        if self._greenlet is not None:
            self._greenlet.kill(block=True, timeout=SCRAPE_TIMEOUT_S)
        if self._client is not None:
            # A scrape the kill interrupted may have left its connection checked out: start afresh.
            self._client.close()
            self._client = None
        try:
            self.scrape()
        except Exception:
            log.exception("harness load: the last server metrics scrape failed")
        self.close()

    def close(self) -> None:
        """Close the file, the connection and NVML (no last scrape: :meth:`stop` takes one)."""
        self.writer.close()
        if self._client is not None:
            self._client.close()
            self._client = None
        self.nvml.close()

    def summary(self, phases: Sequence[tuple[str, float, float]]) -> ServerTelemetry:
        """``summary.json``'s ``server_metrics``: per phase ``(name, start_s, end_s)`` deltas."""
        return summarize_samples(
            self.samples,
            phases,
            interval_s=self.interval_s,
            scrapes=self.scrapes,
            failed=self.failed,
            error=self.first_error,
            gpu=self.nvml.available or any(s.gpu for s in self.samples),
        )
