"""``harness cache``: thin HTTP clients of a running server's cache admin endpoints.

* ``harness cache stats --url URL`` — ``GET /cache/stats`` as a table (``--json`` for the raw JSON);
* ``harness cache preload FILE.jsonl --url URL`` — ``POST /cache/preload`` with the file as body
  (one OpenAI request body per line, optional ``completion`` and ``tenant`` fields);
* ``harness cache flush --tier l2 --url URL`` — ``POST /cache/flush?tier=…`` (l1, l2, l3, bloom);
  ``--tier kv`` empties the engine's KV prefix cache (``POST /reset_prefix_cache``, vLLM's endpoint
  too), and ``--tier all`` (the default) does both: every cache level the server exposes;
* ``harness cache drain --url URL`` — ``POST /cache/drain``: returns once the write-backs of finished
  requests are in L2/L3 (before a snapshot, a restart or a warm pass that must hit L2).

An unreachable server is an :class:`UnavailableError` (exit 5); a rejected request (HTTP 4xx) is an
:class:`InputError` (exit 3) carrying the server's message.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import orjson
import typer

from harness.cache.api import FLUSH_ALL, FLUSH_TIERS
from harness.common import console as cons
from harness.common.auth import (
    AdminTokenOption,
    ApiKeyOption,
    CaBundleOption,
    Credentials,
    HeaderOption,
    InsecureOption,
)
from harness.common.errors import ConfigError, InputError, UnavailableError
from harness.common.headers import TENANT
from harness.common.io import iter_jsonl
from harness.common.openai import RESET_PREFIX_CACHE_PATH

app = typer.Typer(help="Inspect, preload and flush a running server's response cache.", no_args_is_help=True)

URL = Annotated[str, typer.Option("--url", help="Base URL of a running `harness serve --cache`.")]
TIMEOUT = Annotated[float, typer.Option("--timeout", min=0.1, help="HTTP timeout in seconds.")]
KV_TIER = "kv"
"""The engine's KV prefix cache, flushed through ``POST /reset_prefix_cache``."""
FLUSH_CHOICES = (*FLUSH_TIERS, KV_TIER, FLUSH_ALL)


class NotExposed(UnavailableError):
    """The server answered 404: it does not expose this endpoint (no ``--cache``, another server)."""


def _access(
    api_key: str | None,
    admin_token: str | None,
    header: list[str] | None,
    ca_bundle: Path | None,
    insecure: bool,
) -> Credentials:
    return Credentials.of(
        api_key=api_key, admin_token=admin_token, headers=header or (), ca_bundle=ca_bundle, insecure=insecure
    )


def _request(
    method: str,
    url: str,
    path: str,
    timeout: float,
    *,
    creds: Credentials,
    content: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> Any:
    """One admin call (``creds.admin_headers()``); its JSON. Errors never show a secret."""
    import httpx

    full = url.rstrip("/") + path
    sent = {**creds.admin_headers(), **(headers or {})}
    try:
        resp = httpx.request(
            method, full, content=content, headers=sent, timeout=timeout, verify=creds.httpx_verify()
        )
    except httpx.HTTPError as exc:
        raise UnavailableError(
            creds.redact(f"cannot reach {full}: {exc}"), hint="is `harness serve --cache` running there?"
        ) from None
    try:
        data = orjson.loads(resp.content) if resp.content else {}
    except orjson.JSONDecodeError:
        data = {"raw": resp.text[:500]}
    if resp.status_code >= 400:
        err = data.get("error") if isinstance(data, dict) else None
        message = err.get("message") if isinstance(err, dict) else str(data)[:500]
        message = creds.redact(str(message))
        if resp.status_code == 404:
            raise NotExposed(f"{method} {full} answered 404: {message}")
        if resp.status_code in (401, 403):
            raise ConfigError(
                f"{method} {full} answered {resp.status_code}: {message}",
                hint="the admin routes need --admin-token (or $HARNESS_ADMIN_TOKEN)",
            )
        cls = InputError if resp.status_code < 500 else UnavailableError
        raise cls(f"{method} {full} answered {resp.status_code}: {message}")
    return data


@app.command("stats")
def stats_cmd(  # noqa: PLR0917 - typer maps parameters to options
    url: URL = "http://127.0.0.1:8000",
    as_json: Annotated[bool, typer.Option("--json", help="Print the raw JSON.")] = False,
    timeout: TIMEOUT = 10.0,
    api_key: ApiKeyOption = None,
    admin_token: AdminTokenOption = None,
    header: HeaderOption = None,
    ca_bundle: CaBundleOption = None,
    insecure: InsecureOption = False,
) -> None:
    """Per-tier hits, misses, errors, hit rate, fill rate, entries, evictions and latency."""
    data = _request(
        "GET", url, "/cache/stats", timeout, creds=_access(api_key, admin_token, header, ca_bundle, insecure)
    )
    if as_json:
        typer.echo(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode())
        return
    cols = ["hits", "misses", "errors", "hit_rate", "entries", "fill_rate", "evictions",
            "lookup_ms_p50", "lookup_ms_p99", "thermal_drift"]  # fmt: skip
    rows = [
        (tier, *(_fmt(row.get(c)) for c in cols))
        for tier, row in (data.get("tiers") or {}).items()
        if row.get("enabled", True)
    ]
    title = f"cache at {url} — overall hit rate {data.get('hit_rate', 0.0):.1%}"
    console = cons.out()
    console.print(cons.table(title, ["tier", *cols], rows, left={"tier"}))
    bloom = data.get("bloom")
    if bloom:
        console.print(
            f"bloom: {bloom['items']} items, intercepted {bloom['intercepted']}, passed {bloom['passed']}, "
            f"measured FP rate {bloom['fp_rate_measured']:.4%} (target {bloom['fp_rate_target']:.2%})"
        )
    sf = data.get("singleflight") or {}
    console.print(f"single-flight merges: {sf.get('merges', 0)}; requests: {data.get('requests', {})}")


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3f}"
    return "" if v is None else str(v)


@app.command("preload")
def preload_cmd(  # noqa: PLR0917 - typer maps parameters to options
    file: Annotated[
        Path, typer.Argument(help="JSONL: one OpenAI request body per line (+completion, tenant).")
    ],
    url: URL = "http://127.0.0.1:8000",
    tenant: Annotated[
        str | None, typer.Option("--tenant", help="Default tenant for lines without one.")
    ] = None,
    timeout: TIMEOUT = 600.0,
    api_key: ApiKeyOption = None,
    admin_token: AdminTokenOption = None,
    header: HeaderOption = None,
    ca_bundle: CaBundleOption = None,
    insecure: InsecureOption = False,
) -> None:
    """Store completions (given, or generated by the server) for every request in FILE."""
    # Checked here so a bad line is reported against the local file, before anything is sent.
    for number, obj in iter_jsonl(file, expected="an OpenAI request body"):
        if not ({"prompt", "messages"} & obj.keys()):
            raise InputError("expected an object with 'prompt' or 'messages'", file=file, line=number)
    headers = {"Content-Type": "application/x-ndjson"}
    if tenant:
        headers[TENANT] = tenant
    creds = _access(api_key, admin_token, header, ca_bundle, insecure)
    data = _request(
        "POST", url, "/cache/preload", timeout, creds=creds, content=file.read_bytes(), headers=headers
    )
    typer.echo(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode())


@app.command("flush")
def flush_cmd(  # noqa: PLR0917 - typer maps parameters to options
    tier: Annotated[str, typer.Option("--tier", help=f"{', '.join(FLUSH_CHOICES)}.")] = "all",
    url: URL = "http://127.0.0.1:8000",
    timeout: TIMEOUT = 30.0,
    api_key: ApiKeyOption = None,
    admin_token: AdminTokenOption = None,
    header: HeaderOption = None,
    ca_bundle: CaBundleOption = None,
    insecure: InsecureOption = False,
) -> None:
    """Drop the entries of one tier, the KV prefix cache (kv), or every level (all)."""
    creds = _access(api_key, admin_token, header, ca_bundle, insecure)
    tier = tier.lower()
    if tier not in FLUSH_CHOICES:
        raise InputError(f"unknown tier {tier!r}; expected one of {', '.join(FLUSH_CHOICES)}", field="--tier")
    if tier == KV_TIER:
        data = _request("POST", url, RESET_PREFIX_CACHE_PATH, timeout, creds=creds)
    elif tier != FLUSH_ALL:
        data = _request("POST", url, f"/cache/flush?tier={tier}", timeout, creds=creds)
    else:
        # Every level the server exposes: a server without --cache (or vLLM outside its dev mode)
        # answers 404 for one of them, which is reported, not fatal; none at all is.
        data = {"tier": FLUSH_ALL}
        skipped: dict[str, str] = {}
        levels = (("response", f"/cache/flush?tier={FLUSH_ALL}"), (KV_TIER, RESET_PREFIX_CACHE_PATH))
        for name, path in levels:
            try:
                answer = _request("POST", url, path, timeout, creds=creds)
            except NotExposed as exc:
                skipped[name] = exc.message
                continue
            if name == KV_TIER:
                data[KV_TIER] = answer
            else:
                data["dropped"] = answer.get("dropped", answer)
        if len(skipped) == 2:
            raise UnavailableError(
                f"{url} exposes no cache to flush: " + "; ".join(skipped.values()),
                hint="is it `harness serve`, or vLLM with VLLM_SERVER_DEV_MODE=1?",
            )
        if skipped:
            data["skipped"] = skipped
    typer.echo(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode())


@app.command("drain")
def drain_cmd(  # noqa: PLR0917 - typer maps parameters to options
    url: URL = "http://127.0.0.1:8000",
    wait: Annotated[
        float, typer.Option("--wait", min=0.0, max=3600.0, help="Seconds to wait for write-backs.")
    ] = 60.0,
    api_key: ApiKeyOption = None,
    admin_token: AdminTokenOption = None,
    header: HeaderOption = None,
    ca_bundle: CaBundleOption = None,
    insecure: InsecureOption = False,
) -> None:
    """Wait until the write-backs of finished requests have landed in L2 and L3."""
    data = _request(
        "POST",
        url,
        f"/cache/drain?timeout_s={wait:g}",
        wait + 10.0,
        creds=_access(api_key, admin_token, header, ca_bundle, insecure),
    )
    pending = int(data.get("pending", 0))
    if pending:
        raise UnavailableError(
            f"{pending} write-back(s) still pending after {wait:g} s", hint="is Redis slow or down?"
        )
    typer.echo(orjson.dumps(data).decode())
