"""``harness analysis avalanche`` and ``rto*``: the chance that many keys expire together, and the
recovery time after they do (predicted, calibrated, measured)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from harness.analysis.cli_common import JSON_HELP, console, echo_json
from harness.common.auth import ACCESS_PANEL, Credentials, access_from, access_options
from harness.common.console import table
from harness.common.io import write_json
from harness.common.options import old_spellings, with_options

FETCH_TIMEOUT_S = 10.0
"""How long ``--url``'s ``/cache/stats`` and ``/metrics`` may take each."""


@with_options(access_options(), panel=ACCESS_PANEL, param="access")
@old_spellings(target_p="--target")
def avalanche(
    *,
    access: dict[str, Any],
    classes: Annotated[
        Path | None, typer.Option("--classes", help="JSONL of {name, keys, ttl_s, write_span_s, jitter_s}.")
    ] = None,
    cache_state: Annotated[
        Path | None, typer.Option("--cache-state", help="Saved cache state dir: measured expiry.")
    ] = None,
    url: Annotated[
        str | None, typer.Option("--url", help="Live server: TTLs from /cache/stats, writes from /metrics.")
    ] = None,
    write_span_s: Annotated[
        float, typer.Option("--write-span-s", help="With --url: seconds the keys were written over.")
    ] = 0.0,
    window_s: Annotated[float, typer.Option("--window-s", help="Critical window Δ in seconds.")] = 60.0,
    target_p: Annotated[
        float | None,
        typer.Option(
            "--target-p", help="Target avalanche probability: print the TTL jitter that reaches it."
        ),
    ] = None,
    by: Annotated[str, typer.Option("--by", help="With --cache-state: 'tier' or 'tenant-tier'.")] = "tier",
    as_json: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
) -> None:
    """Avalanche probability P = 1 − Π(1 − p_i) over key classes, with the jitter advice.

    With --url the server's /cache/stats needs its admin token (--admin-token), as /metrics may."""
    from harness.analysis.avalanche import (
        assess,
        classes_from_server,
        read_classes,
        risks_from_classes,
        risks_from_state,
    )

    if sum(x is not None for x in (classes, cache_state, url)) != 1:
        raise typer.BadParameter(
            "give exactly one of --classes, --cache-state, --url", param_hint="--classes"
        )
    if by not in ("tier", "tenant-tier"):
        raise typer.BadParameter("expected 'tier' or 'tenant-tier'", param_hint="--by")
    spans: dict[str, float] = {}
    if classes is not None:
        described = read_classes(classes)
        spans = {c.name: c.write_span_s for c in described}
        risks = risks_from_classes(described, window_s)
    elif cache_state is not None:
        risks = risks_from_state(cache_state, window_s, by)
    else:
        assert url is not None
        stats, metrics = _fetch_server(url, access_from(access))
        described = classes_from_server(stats, metrics, write_span_s)
        spans = {c.name: c.write_span_s for c in described}
        risks = risks_from_classes(described, window_s)
    report = assess(risks, window_s, target_p, spans)
    if as_json:
        echo_json(report.model_dump())
        return
    rows = [
        (
            r.name,
            f"{r.keys:,}",
            "—" if r.ttl_s is None else f"{r.ttl_s:,.0f}",
            f"{r.spread_s:,.0f}",
            f"{r.p:.3f}",
            f"{r.together:,.0f}",
            "—" if r.jitter_s is None else f"{r.jitter_s:,.0f}",
            r.source,
        )
        for r in report.classes
    ]
    columns = ("class", "keys", "TTL s", "spread s", "p_i", "together", "jitter s", "source")
    console.print(
        table(f"cache avalanche — window Δ = {window_s:g} s", columns, rows, left={"class", "source"})
    )
    msg = f"P = 1 − Π(1 − p_i) = {report.probability:.4f}"
    if report.target is not None:
        msg += f"; target {report.target:g} needs p_i ≤ {report.per_class_target:.4f} per class"
    console.print(msg, highlight=False)


def _fetch_server(url: str, credentials: Credentials) -> tuple[dict[str, Any], str]:
    """The server's ``/cache/stats`` and ``/metrics`` text, through the target's client (its errors:
    unreachable or refused, exit 5 with a hint; a target without a response cache, exit 5 too)."""
    from harness.load.target import TargetClient

    client = TargetClient(url, credentials, timeout_s=FETCH_TIMEOUT_S)
    return client.cache_stats(), client.metrics()


def rto(
    *,
    expired_keys: Annotated[int, typer.Option("--expired-keys", help="Keys expiring at once (N).")],
    gen_s: Annotated[float, typer.Option("--gen-s", help="Mean generation time of a miss, seconds.")],
    slots: Annotated[int, typer.Option("--slots", help="Requests the engine decodes together.")],
    utilization: Annotated[
        float, typer.Option("--utilization", help="Engine share busy with normal traffic (0–1).")
    ] = 0.0,
    coefficients: Annotated[
        Path | None, typer.Option("--coefficients", help="Calibrated coefficients (rto-calibrate -o).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
) -> None:
    """Predict the recovery time after N keys expire at once: RTO = c0 + c1 · N·g/(s·(1 − ρ))."""
    from pydantic import ValidationError

    from harness.analysis.avalanche import RtoCase, RtoCoefficients, predict_rto, read_coefficients

    try:
        case = RtoCase(expired_keys=expired_keys, gen_s=gen_s, slots=slots, utilization=utilization)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise typer.BadParameter(f"{err['loc'][0]}: {err['msg']}") from None
    coef = read_coefficients(coefficients) if coefficients is not None else RtoCoefficients()
    value = predict_rto(case, coef)
    if as_json:
        echo_json(
            {
                "rto_s": value,
                "work_s": case.work_s,
                "coefficients": coef.model_dump(),
                "case": case.model_dump(),
            }
        )
        return
    rows = [
        ("rebuild work W = N·g/(s·(1 − ρ))", f"{case.work_s:,.1f} s"),
        ("c0 (fixed), c1 (contention)", f"{coef.c0:g} s, {coef.c1:g}"),
        ("calibrated on", f"{coef.calibrated_on} runs"),
        ("RTO = c0 + c1 · W", f"{value:,.1f} s"),
    ]
    console.print(table("RTO prediction", ("quantity", "value"), rows, left={"quantity"}))


def rto_calibrate(
    cases: Annotated[
        Path, typer.Argument(help="JSONL of measured runs: {expired_keys, gen_s, slots, utilization, rto_s}.")
    ],
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Write the coefficients here.")] = None,
) -> None:
    """Fit RTO = c0 + c1·W to measured runs (non-negative least squares)."""
    from harness.analysis.avalanche import calibrate, read_cases

    coef = calibrate(read_cases(cases))
    if out is not None:
        write_json(out, coef.model_dump())
    echo_json(coef.model_dump())


def rto_measure(
    run: Annotated[Path, typer.Argument(help="Load run directory (records with x-cache).")],
    event_s: Annotated[float, typer.Option("--event-s", help="When the keys expired (run seconds).")],
    window_s: Annotated[float, typer.Option("--window-s", help="Trailing window of the hit rate.")] = 10.0,
    recover: Annotated[
        float, typer.Option("--recover", help="Recovered at this share of the baseline.")
    ] = 0.95,
) -> None:
    """Measure a run's RTO: seconds until the windowed hit rate is back to a share of its baseline."""
    from harness.analysis.avalanche import measure_rto_run

    value = measure_rto_run(run, event_s, window_s=window_s, recover=recover)
    echo_json({"rto_s": value, "event_s": event_s, "window_s": window_s, "recover": recover})
