"""``harness deploy``: ops artifacts for running the target in a cluster (see ``docs/analysis.md``).

* ``harness deploy grafana -o dashboard.json`` — a Grafana dashboard of our metrics;
* ``harness deploy istio --service-host HOST -o DIR`` — VirtualService and DestinationRule YAML that route
  ``x-env: preheat`` traffic to the preheat subset and split the rest across A/B by weight.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import orjson
import typer

from harness.common.io import validation_error, write_json
from harness.common.options import old_spellings

app = typer.Typer(
    help="Ops artifacts: Grafana dashboard JSON, Istio VirtualService and DestinationRule YAML.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


@app.command(epilog="Example: harness deploy grafana -o dashboard.json")
def grafana(
    *,
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Dashboard JSON to write (default: stdout).")
    ] = None,
    title: Annotated[str, typer.Option("--title", help="Dashboard title.")] = "LLM warmup harness",
    uid: Annotated[str, typer.Option("--uid", help="Dashboard uid.")] = "harness-cache",
) -> None:
    """Write a Grafana dashboard for the server, engine and cache metrics (every query checked)."""
    from harness.analysis.deploy import grafana_dashboard

    dash = grafana_dashboard(title=title, uid=uid)
    if out is None:
        typer.echo(orjson.dumps(dash, option=orjson.OPT_INDENT_2).decode())
    else:
        write_json(out, dash)
        typer.echo(f"wrote {out} ({len(dash['panels'])} panels)", err=True)


def _weights(text: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for part in text.split(","):
        name, sep, w = part.strip().partition("=")
        if not sep:
            raise typer.BadParameter(f"{part!r} is not NAME=WEIGHT", param_hint="--ab")
        try:
            weight = int(w)
        except ValueError:
            raise typer.BadParameter(f"weight {w!r} is not an integer", param_hint="--ab") from None
        out.append({"name": name, "labels": {"version": name}, "weight": weight})
    return out


@app.command(
    epilog="Example: harness deploy istio --service-host llm.prod.svc.cluster.local --ab a=90,b=10 -o istio/"
)
@old_spellings(service_host="--host")
def istio(
    *,
    service_host: Annotated[
        str | None,
        typer.Option("--service-host", help="The Kubernetes service's host (svc.ns.svc.cluster.local)."),
    ] = None,
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Directory for the YAML files (default: stdout).")
    ] = None,
    name: Annotated[str | None, typer.Option("--name", help="Resource name.")] = None,
    namespace: Annotated[str | None, typer.Option("--namespace", help="Namespace.")] = None,
    port: Annotated[int | None, typer.Option("--port", help="Service port.")] = None,
    ab: Annotated[
        str | None, typer.Option("--ab", help="A/B subsets as NAME=WEIGHT,… (label version=NAME); sum 100.")
    ] = None,
    values: Annotated[Path | None, typer.Option("--values", help="YAML of template values.")] = None,
    templates: Annotated[
        Path | None, typer.Option("--templates", help="Template directory (default templates/istio).")
    ] = None,
) -> None:
    """Render the Istio VirtualService and DestinationRule (preheat isolation, A/B weights)."""
    from pydantic import ValidationError

    from harness.analysis.deploy import IstioValues, check_istio, load_values, render_istio, write_outputs
    from harness.common.errors import ConfigError

    given: dict[str, Any] = load_values(values) if values is not None else {}
    for key, value in (("host", service_host), ("name", name), ("namespace", namespace), ("port", port)):
        if value is not None:
            given[key] = value
    if ab is not None:
        given["ab"] = _weights(ab)
    if "host" not in given:
        raise typer.BadParameter(
            "the service host is needed (--service-host, or host in --values)", param_hint="--service-host"
        )
    try:
        vals = IstioValues.model_validate(given)
    except ValidationError as exc:
        raise validation_error(exc, ConfigError, file=values, what="invalid Istio value") from None
    docs = render_istio(vals, templates)
    check_istio(docs)
    if out is None:
        typer.echo("---\n".join(docs.values()), nl=False)
        return
    for path in write_outputs(docs, out):
        typer.echo(f"wrote {path}", err=True)
