"""``harness cache``: thin HTTP clients of a running server's cache admin endpoints.

* ``harness cache stats --url URL`` — ``GET /cache/stats`` as a table (``--json`` for the raw JSON);
* ``harness cache preload FILE.jsonl --url URL`` — ``POST /cache/preload`` with the file as body
  (one OpenAI request body per line, optional ``completion`` and ``tenant`` fields);
* ``harness cache flush --tier l2 --url URL`` — ``POST /cache/flush?tier=…`` (l1, l2, l3, bloom);
  ``--tier kv`` empties the engine's KV prefix cache (``POST /reset_prefix_cache``, vLLM's endpoint
  too), and ``--tier all`` (the default) does both: every cache level the server exposes;
* ``harness cache drain --url URL`` — ``POST /cache/drain``: returns once the write-backs of finished
  requests are in L2/L3 (before a snapshot, a restart or a warm pass that must hit L2).

Every call goes through the target's one client (:class:`harness.load.target.TargetClient`), with
the credentials options of :mod:`harness.common.auth`: an unreachable server, or one that refuses the
admin token (401/403: the hint names ``--admin-token``), is an :class:`UnavailableError` (exit 5); a
rejected request (another HTTP 4xx) is an :class:`InputError` (exit 3) carrying the server's message.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import orjson
import typer

from harness.common import console as cons
from harness.common.auth import ACCESS_PANEL, access_from, access_options
from harness.common.errors import InputError, UnavailableError
from harness.common.io import iter_jsonl
from harness.common.options import old_spellings, with_options
from harness.target.cache.api import FLUSH_ALL, FLUSH_TIERS

if TYPE_CHECKING:  # imported when a command runs: every `harness` command imports this module
    from harness.load.target import TargetClient

app = typer.Typer(help="Inspect, preload and flush a running server's response cache.", no_args_is_help=True)

URL = Annotated[str, typer.Option("--url", help="Base URL of a running `harness serve --cache`.")]
TIMEOUT = Annotated[
    float, typer.Option("--request-timeout", min=0.1, help="Seconds a request may take (network timeout).")
]
RENAMED = old_spellings(timeout="--timeout")
"""``--timeout``, the old spelling of ``--request-timeout`` (the load commands' name for it)."""
KV_TIER = "kv"
"""The engine's KV prefix cache, flushed through ``POST /reset_prefix_cache``."""
FLUSH_CHOICES = (*FLUSH_TIERS, KV_TIER, FLUSH_ALL)


ACCESS = with_options(access_options(), panel=ACCESS_PANEL, param="access")
"""The target's credentials options (:class:`harness.common.auth.AccessOptions`), as every command
that talks to a target has them."""


def _client(url: str, timeout: float, access: dict[str, Any]) -> TargetClient:
    from harness.load.target import TargetClient

    return TargetClient(url, access_from(access), timeout_s=timeout)


@app.command("stats", epilog="Example: harness cache stats --url http://127.0.0.1:8000")
@ACCESS
@RENAMED
def stats_cmd(
    *,
    access: dict[str, Any],
    url: URL = "http://127.0.0.1:8000",
    as_json: Annotated[bool, typer.Option("--json", help="Print the raw JSON.")] = False,
    timeout: TIMEOUT = 10.0,
) -> None:
    """Per-tier hits, misses, errors, hit rate, fill rate, entries, evictions and latency."""
    data = _client(url, timeout, access).cache_stats()
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


@app.command(
    "preload", epilog="Example: harness cache preload runs/preload.jsonl --url http://127.0.0.1:8000"
)
@ACCESS
@RENAMED
def preload_cmd(
    *,
    access: dict[str, Any],
    file: Annotated[
        Path, typer.Argument(help="JSONL: one OpenAI request body per line (+completion, tenant).")
    ],
    url: URL = "http://127.0.0.1:8000",
    tenant: Annotated[
        str | None, typer.Option("--tenant", help="Default tenant for lines without one.")
    ] = None,
    timeout: TIMEOUT = 600.0,
) -> None:
    """Store completions (given, or generated by the server) for every request in FILE."""
    # Checked here so a bad line is reported against the local file, before anything is sent.
    for number, obj in iter_jsonl(file, expected="an OpenAI request body"):
        if not ({"prompt", "messages"} & obj.keys()):
            raise InputError("expected an object with 'prompt' or 'messages'", file=file, line=number)
    client = _client(url, timeout, access)
    data = client.cache_preload(file, tenant=tenant, timeout_s=timeout)
    typer.echo(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode())


@app.command("flush", epilog="Example: harness cache flush --tier all --url http://127.0.0.1:8000")
@ACCESS
@RENAMED
def flush_cmd(
    *,
    access: dict[str, Any],
    tier: Annotated[str, typer.Option("--tier", help=f"{', '.join(FLUSH_CHOICES)}.")] = "all",
    url: URL = "http://127.0.0.1:8000",
    timeout: TIMEOUT = 30.0,
) -> None:
    """Drop the entries of one tier, the KV prefix cache (kv), or every level (all)."""
    from harness.load.target import NotExposed

    client = _client(url, timeout, access)
    tier = tier.lower()
    if tier not in FLUSH_CHOICES:
        raise InputError(f"unknown tier {tier!r}; expected one of {', '.join(FLUSH_CHOICES)}", field="--tier")
    if tier == KV_TIER:
        data = client.reset_prefix_cache()
    elif tier != FLUSH_ALL:
        data = client.cache_flush(tier)
    else:
        # Every level the server exposes: a server without --cache (or vLLM outside its dev mode)
        # answers 404 for one of them, which is reported, not fatal; none at all is.
        data = {"tier": FLUSH_ALL}
        skipped: dict[str, str] = {}
        levels: tuple[tuple[str, Callable[[], dict[str, Any]]], ...] = (
            ("response", lambda: client.cache_flush(FLUSH_ALL)),
            (KV_TIER, client.reset_prefix_cache),
        )
        for name, call in levels:
            try:
                answer = call()
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


@app.command("drain", epilog="Example: harness cache drain --url http://127.0.0.1:8000 --wait 30")
@ACCESS
def drain_cmd(
    *,
    access: dict[str, Any],
    url: URL = "http://127.0.0.1:8000",
    wait: Annotated[
        float, typer.Option("--wait", min=0.0, max=3600.0, help="Seconds to wait for write-backs.")
    ] = 60.0,
) -> None:
    """Wait until the write-backs of finished requests have landed in L2 and L3."""
    data = _client(url, wait + 10.0, access).cache_drain(wait)
    pending = int(data.get("pending", 0))
    if pending:
        raise UnavailableError(
            f"{pending} write-back(s) still pending after {wait:g} s", hint="is Redis slow or down?"
        )
    typer.echo(orjson.dumps(data).decode())
