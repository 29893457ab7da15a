"""An "LLM load" tab on Locust's web UI, fed from the run's own records.

Locust's UI shows its own statistics (rounded, and closed-loop by nature); this tab shows what the
harness measures, computed with the project's one percentile definition over the most recent
records (:data:`harness.load.live.LIVE_WINDOW`): TTFT, TPOT, ITL, E2E and lateness percentiles, the
current ladder stage, rollbacks, the hit rate by cache tier, requests in flight and queued.

It uses Locust's extension points: a Flask blueprint on ``environment.web_ui.app`` serving
``/harness/load`` (the same data as JSON, for scripts) and ``/harness/load/summary`` (the final
``summary.json``), ``extended_tabs`` / ``extended_tables`` template arguments for the tab, and the
``extended_stats`` field that the UI reads from each ``/stats/requests`` poll.

The lifecycle (:mod:`harness.load.plugin`) mounts the tab and hands :func:`mount` a way to get the
current run; this module reads the run only through :class:`RunView`, so it does not import the
module that owns the run (which imports this one).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import orjson
from flask import Blueprint, Response, request

from harness.load.control import Control
from harness.load.inputs import Inputs
from harness.load.live import LIVE_FIELDS, Live
from harness.load.messages import Workers
from harness.load.options import LoadOptions
from harness.load.pacer import Pacer
from harness.load.run_summary import SUMMARY_FILE

TAB = "harness-load"
COLUMNS: tuple[tuple[str, str], ...] = (
    ("metric", "Metric"),
    ("value", "n / value"),
    ("p50", "p50"),
    ("p90", "p90"),
    ("p99", "p99"),
    ("max", "max"),
)


class RunView(Protocol):
    """What the tab reads of the current run (:class:`harness.load.loadrun.LoadRun`)."""

    @property
    def opts(self) -> LoadOptions: ...
    @property
    def inputs(self) -> Inputs: ...
    @property
    def live(self) -> Live: ...
    @property
    def control(self) -> Control: ...
    @property
    def pacer(self) -> Pacer | None: ...
    @property
    def workers(self) -> Workers: ...
    @property
    def results_dir(self) -> Path: ...
    @property
    def warmup_id(self) -> str: ...
    @property
    def finalized(self) -> bool: ...


CurrentRun = Callable[[], RunView | None]
"""The run of this process, once its test started (``None`` before)."""


def _ms(v: float | None) -> str:
    return "" if v is None else f"{v:.1f}"


def live_rows(run: RunView | None) -> list[dict[str, str]]:
    """The tab's rows: percentiles of the recent records, then the run's state."""
    if run is None:
        return [{"metric": "no run yet", "value": ""}]
    rows: list[dict[str, str]] = []
    for name, d in run.live.distributions().items():
        if name in LIVE_FIELDS:
            rows.append({"metric": name, "value": str(d.n), "p50": _ms(d.p50), "p90": _ms(d.p90),
                         "p99": _ms(d.p99), "max": _ms(d.max)})  # fmt: skip
    state = status(run)
    for key in (
        "stage",
        "target_rate",
        "rollbacks",
        "requests",
        "errors",
        "in_flight",
        "queued",
        "workers_lost",
    ):
        rows.append({"metric": key, "value": str(state.get(key, ""))})
    for tier, share in state["hit_rate"].items():
        rows.append({"metric": f"hit rate {tier}", "value": f"{share:.1%}"})
    for key, p in (state.get("precision") or {}).items():
        width = p["rel_half_width"]
        now = f"±{width:.1%}" if width is not None else f"{p['n']} of ≥ {p['min_n']} samples"
        rows.append({"metric": f"precision {key}", "value": f"{now} (target ±{p['target']:.1%})"})
    if state.get("stop_reason"):
        rows.append({"metric": "stopped", "value": str(state["stop_reason"])})
    return rows


def status(run: RunView | None) -> dict[str, Any]:
    """The run's live state as JSON-ready data (``GET /harness/load``)."""
    if run is None:
        return {"running": False}
    stage = run.opts.stage
    target_rate: float | None = run.inputs.rate
    rollbacks = 0
    stages: list[dict[str, Any]] = []
    ladder = run.control.ladder
    if ladder is not None:
        cur = ladder.current
        if cur is not None:
            stage = ladder.label(cur)
            target_rate = ladder.plan.stages[cur.stage].qps
        stages = [o.model_dump(mode="json") for o in ladder.outcomes()]
        rollbacks = sum(o["verdict"] == "rolled_back" for o in stages)
    pacer = run.pacer
    return {
        "running": not run.finalized,
        "results_dir": str(run.results_dir),
        "warmup_id": run.warmup_id,
        "stage": stage,
        "target_rate": target_rate,
        "rollbacks": rollbacks,
        "stages": stages,
        "requests": run.live.requests,
        "errors": run.live.errors,
        "in_flight": pacer.in_flight if pacer is not None else None,
        "queued": pacer.queued if pacer is not None else None,
        "workers_lost": run.workers.lost(),
        "hit_rate": run.live.hit_rate(),
        "metrics": {k: v.model_dump() for k, v in run.live.distributions().items()},
        "precision": {k: v.model_dump() for k, v in precision.states().items()}
        if (precision := run.control.precision) is not None
        else None,
        "stop_reason": run.control.stop_reason,
    }


def mount(env: Any, current: CurrentRun) -> None:
    """Register the blueprint, the tab and the ``extended_stats`` hook on ``env.web_ui``; ``current``
    gives the run each request reads (a web UI session may start several)."""
    web_ui = env.web_ui
    bp = Blueprint("harness_load", __name__)

    @bp.route("/harness/load")
    def load_status() -> Response:
        return Response(orjson.dumps(status(current())), mimetype="application/json")

    @bp.route("/harness/load/summary")
    def load_summary() -> Response:
        run = current()
        path = run.results_dir if run is not None else None
        if path is None or not (path / SUMMARY_FILE).exists():
            return Response(b'{"error": "no summary yet"}', status=404, mimetype="application/json")
        return Response((path / SUMMARY_FILE).read_bytes(), mimetype="application/json")

    web_ui.app.register_blueprint(bp)
    web_ui.template_args["extended_tabs"] = [{"title": "LLM load", "key": TAB}]
    web_ui.template_args["extended_tables"] = [
        {"key": TAB, "structure": [{"key": k, "title": t} for k, t in COLUMNS]}
    ]

    def extend_stats(response: Response) -> Response:
        if request.path != "/stats/requests" or response.status_code != 200:
            return response
        data = orjson.loads(response.get_data())
        data["extended_stats"] = [{"key": TAB, "data": live_rows(current())}]
        response.set_data(orjson.dumps(data))
        return response

    web_ui.app.after_request(extend_stats)
