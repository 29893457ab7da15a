"""``harness analysis scrape`` and ``anomaly``: metric scrapes and the attribution tree of their
deviations."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from harness.analysis.cli_common import JSON_HELP, console, echo_json, say
from harness.common.auth import ACCESS_PANEL, access_from, access_options
from harness.common.errors import InputError
from harness.common.io import write_json
from harness.common.options import old_spellings, with_options


@with_options(access_options(), panel=ACCESS_PANEL, param="access")
def scrape(
    *,
    access: dict[str, Any],
    url: Annotated[
        str, typer.Option("--url", help="The server's base URL, or its /metrics URL (harness serve).")
    ],
    out: Annotated[
        Path, typer.Option("--out", "-o", help="server_metrics.jsonl to write (t_s in unix seconds).")
    ],
    every_s: Annotated[float, typer.Option("--every-s", min=0.0, help="Seconds between scrapes.")] = 5.0,
    count: Annotated[int, typer.Option("--count", min=1, help="Number of scrapes.")] = 60,
) -> None:
    """Scrape /metrics periodically into a server_metrics.jsonl for `harness analysis anomaly`."""
    from harness.analysis.anomaly import scrape_metrics

    n = scrape_metrics(url, access_from(access), out, every_s=every_s, count=count, warn=say)
    say(f"wrote {n} scrapes to {out}")


def _span(text: str | None, t0: float, t1: float, name: str) -> Any:
    """``A:B`` seconds from the first sample (either end may be empty) → a Window."""
    from harness.analysis.anomaly import Window

    if text is None:
        return None
    a, sep, b = text.partition(":")
    try:
        start = t0 + float(a) if a else t0
        end = t0 + float(b) if b else t1
    except ValueError:
        raise typer.BadParameter(f"{text!r} is not START:END in seconds", param_hint=name) from None
    if not sep:
        raise typer.BadParameter(f"{text!r} is not START:END in seconds", param_hint=name)
    return Window(start=start, end=end)


@with_options(access_options(), panel=ACCESS_PANEL, param="access")
@old_spellings(baseline="--baseline", window="--window")
def anomaly(
    *,
    access: dict[str, Any],
    scrapes: Annotated[
        Path | None,
        typer.Option(
            "--scrapes",
            help="A server_metrics.jsonl (harness analysis scrape, or a load run's against harness serve) "
            "or the run directory holding it.",
        ),
    ] = None,
    prometheus: Annotated[str | None, typer.Option("--prometheus", help="Prometheus base URL.")] = None,
    start: Annotated[float | None, typer.Option("--start", help="With --prometheus: unix start.")] = None,
    end: Annotated[float | None, typer.Option("--end", help="With --prometheus: unix end.")] = None,
    step_s: Annotated[float, typer.Option("--step-s", help="With --prometheus: resolution.")] = 15.0,
    baseline: Annotated[
        str | None,
        typer.Option(
            "--baseline-window",
            help="The normal period: START:END seconds from the first sample (default: the first quarter).",
        ),
    ] = None,
    window: Annotated[
        str | None,
        typer.Option(
            "--test-window",
            help="The period to explain: START:END seconds (default: the normal period's end to the last "
            "sample).",
        ),
    ] = None,
    z_min: Annotated[
        float, typer.Option("--z-min", help="Deviation (in baseline scales) that counts.")
    ] = 3.0,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Write the tree JSON here.")] = None,
    schema: Annotated[bool, typer.Option("--schema", help="Print the JSON schema and exit.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
) -> None:
    """Attribute HitRate/FillRate/ThermalDrift deviations to tier/tenant/scenario and leaf causes."""
    from harness.analysis.anomaly import (
        AnomalyReport,
        attribute,
        read_series,
        render_tree,
        series_from_prometheus,
    )

    if schema:
        echo_json(AnomalyReport.model_json_schema())
        return
    if (scrapes is None) == (prometheus is None):
        raise typer.BadParameter("give exactly one of --scrapes and --prometheus", param_hint="--scrapes")
    if prometheus is not None:
        if start is None or end is None:
            raise typer.BadParameter("--prometheus needs --start and --end", param_hint="--start")
        series = series_from_prometheus(prometheus, start, end, step_s, creds=access_from(access))
        source = prometheus
    else:
        assert scrapes is not None
        series = read_series(scrapes)
        source = str(scrapes)
    times = [t for s in series.values() for t, _ in s]
    if not times:
        raise InputError("no samples of the cache or server metrics", file=source)
    t0, t1 = min(times), max(times)
    report = attribute(
        series,
        source=source,
        baseline=_span(baseline, t0, t1, "--baseline-window"),
        window=_span(window, t0, t1, "--test-window"),
        z_min=z_min,
    )
    if out is not None:
        write_json(out, report.model_dump(mode="json"))
    if as_json:
        echo_json(report.model_dump(mode="json"))
        return
    console.print("\n".join(render_tree(report.root)), highlight=False, markup=False)
    console.print(f"{report.anomalies} anomalous series of {report.series}", highlight=False)
