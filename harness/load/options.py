"""The load stage's options: Locust command-line arguments, and the validated value object behind them.

They are added to Locust's own parser through ``events.init_command_line_parser``
(:func:`add_arguments`), so they work on the command line (``--corpus …``), in a Locust config file
(``corpus = …`` in ``locust.conf``), as ``LOCUST_CORPUS=…`` environment variables and in the web
UI's start form. :class:`LoadOptions` validates what arrived (``extra="forbid"``: a misspelt field in
code is an error) and :meth:`LoadOptions.to_args` turns options back into arguments for the
launcher (:mod:`harness.load.runner`), so both spell every option the same way.

The harness's own commands that launch load (``harness run``, ``harness capacity``, ``harness load
replay|ladder``) take the same options through :func:`typer_options`: flag, type, help (one table,
``_HELP``) and default come from here, so an option is declared once for Locust and every command.
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin

import typer
from pydantic import (
    BeforeValidator,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
)

from harness.common.auth import API_KEY_ENV, SECRET_OPTIONS, Credentials, parse_header, secrets_from_env
from harness.common.errors import ConfigError
from harness.common.model import StrictModel
from harness.load.arrivals import ApiChoice, ArrivalProcess, SeedPolicy
from harness.load.stream import TOKEN_COUNTINGS, TokenCounting

_R = TypeVar("_R")

DEFAULT_STAGE = "replay"
DEFAULT_PRECISION_ON = "ttft_ms:95,tpot_ms:95"


def _relative(value: Any) -> Any:
    """``"10%"`` → 0.1 (the command line, a config file and the web UI give text); numbers pass."""
    if isinstance(value, str):
        text = value.strip()
        try:
            return float(text[:-1]) / 100.0 if text.endswith("%") else float(text)
        except ValueError:
            raise ValueError(f"{value!r} is not a relative width like 10% or 0.1") from None
    return value


def _in_unit(value: float) -> float:
    if not 0.0 < value <= 1.0:
        raise ValueError(f"a relative half-width must be in (0, 1]: 10% or 0.1, not {value:g}")
    return value


RelativeWidth = Annotated[float, BeforeValidator(_relative), Field(allow_inf_nan=False)]


class LoadOptions(StrictModel):
    """Everything a replay or ladder run is configured with (besides Locust's own ``--host`` etc.)."""

    corpus: Path | None = None
    """``corpus.jsonl`` (or its directory) from ``harness corpus build``."""
    schedule: Path | None = None
    """Arrival schedule JSONL from ``harness traces schedule``; else the corpus's offsets or ``rate``."""
    rate: float | None = Field(default=None, gt=0)
    """Requests per second (all processes together) when there is no schedule."""
    arrival: ArrivalProcess = "constant"
    duration: float | None = Field(default=None, gt=0)
    """Seconds of schedule to send (``None``: all of it; required with ``rate``)."""
    max_requests: int | None = Field(default=None, ge=1)
    speedup: float = Field(default=1.0, gt=0)
    """Schedule time is divided by this (2 = twice as fast)."""
    results_dir: Path = Path("runs/load")
    model: str | None = None
    max_tokens_cap: int | None = Field(default=None, ge=1)
    api: ApiChoice = "auto"
    stage: str = DEFAULT_STAGE
    """``X-Traffic-Stage`` and the records' ``stage`` (ladder runs use their stage names)."""
    concurrency: int = Field(default=64, ge=1)
    """Users per process: the most requests in flight (the pool the pacer's arrivals are taken by)."""
    start_delay: float = Field(default=2.0, ge=0)
    """Seconds from test start to the epoch (users spawn meanwhile; workers all use the master's epoch)."""
    drain_timeout: float = Field(default=60.0, ge=0)
    """After the last arrival, seconds in-flight requests get to finish before the run ends."""
    token_counting: TokenCounting = "auto"
    seed_policy: SeedPolicy = "keep"
    """What to do with a record's sampling ``seed``: ``keep`` sends it (the record's exact request);
    ``drop`` leaves it out (:func:`harness.load.arrivals.prepare_requests`), for targets that cannot
    take one: vLLM's CPU build dies on a seeded request during chunked prefill."""
    tokenizer: Path | None = None
    """``tokenizer.json`` for ``--token-counting tokenizer`` (and ``auto``'s fallback)."""
    plan: Path | None = None
    """Warmup ladder plan (YAML), for ``locustfiles/warmup.py``."""
    preload: Path | None = None
    """JSONL posted to ``POST /cache/preload`` before the first request (default: the plan's ``preload``)."""
    bypass_fraction: float = Field(default=0.0, ge=0.0, le=1.0)
    """Share of arrivals sent with ``Cache-Control: no-cache`` (chosen per arrival from ``seed``)."""
    otlp_endpoint: str | None = None
    """OTLP/HTTP traces endpoint (``http://host:4318/v1/traces``): one client span per request."""
    warmup_id: str | None = None
    """``X-Warmup-ID`` for every request of the run (default: a new random id)."""
    pacer_lead_ms: float = Field(default=3.0, ge=0)
    request_timeout: float = Field(default=600.0, gt=0)
    seed: int = 0
    """Seed of the Poisson process and of which arrivals bypass the cache."""
    until_precision: RelativeWidth | None = None
    """Stop sending once every ``precision_on`` percentile's interval has a relative half-width
    (:func:`harness.common.stats.relative_half_width`) of at most this (``10%`` or ``0.1``)."""
    max_duration: float | None = Field(default=None, gt=0)
    """Seconds of sending at most (no arrival intended later); bounds a ``--rate`` run without
    ``--duration``."""
    precision_on: str = DEFAULT_PRECISION_ON
    """The percentiles ``until_precision`` watches: ``FIELD:Q`` items, comma-separated."""
    precision_confidence: float = Field(default=0.95, gt=0.5, lt=1.0)
    """Confidence of the watched intervals (a gate's baseline ``confidence``)."""
    precision_min_samples: int | None = Field(default=None, ge=1)
    """Also wait for this many samples of each watched field (a gate's ``min_samples``)."""

    @field_validator("until_precision")
    @classmethod
    def _until_precision_in_unit(cls, v: float | None) -> float | None:
        return None if v is None else _in_unit(v)

    @field_validator("precision_on")
    @classmethod
    def _precision_on_known(cls, v: str) -> str:
        from harness.load.precision import parse_precision_on

        parse_precision_on(v)  # raises ValueError naming the bad item
        return v

    history: Literal["live", "log"] = "live"
    """Session corpora: turn k+1's history holds what the target answered (``live``) or the corpus
    log's answers (``log``, the bodies as built)."""
    salt_per_pass: bool = False
    """Repeated passes over the corpus start with a distinct salt (pass ``p ≥ 1``), so no pass reuses
    another's prefixes."""
    capacity: float | None = Field(default=None, gt=0)
    """The target's capacity in requests/s (``harness capacity``): resolves ladder stages given as a
    share of it (``qps: 50%``)."""
    api_key: SecretStr | None = None
    """``Authorization: Bearer KEY`` on every request (default: ``OPENAI_API_KEY``)."""
    admin_token: SecretStr | None = None
    """``Authorization: Bearer TOKEN`` on the admin routes (preload); default: the API key."""
    header: list[SecretStr] = Field(default_factory=list)
    """Extra ``NAME:VALUE`` headers on every request (values may be secrets: never written out)."""
    ca_bundle: Path | None = None
    """PEM CA bundle to verify an ``https://`` target against (default: the system's CAs)."""
    insecure: bool = False
    """Do not verify the target's TLS certificate."""
    server_metrics_interval: float = Field(default=1.0, ge=0)
    """Seconds between scrapes of the target's ``/metrics`` into ``server_metrics.jsonl``
    (:mod:`harness.load.telemetry`); 0 turns scraping off."""

    @field_validator("header")
    @classmethod
    def _headers_well_formed(cls, v: list[SecretStr]) -> list[SecretStr]:
        for item in v:
            try:
                parse_header(item.get_secret_value())
            except ConfigError as exc:
                raise ValueError(exc.message) from None
        return v

    def credentials(self) -> Credentials:
        """The key, token, headers and TLS policy every client of the target uses."""
        return Credentials.of(
            api_key=self.api_key.get_secret_value() if self.api_key else None,
            admin_token=self.admin_token.get_secret_value() if self.admin_token else None,
            headers=[h.get_secret_value() for h in self.header],
            ca_bundle=self.ca_bundle,
            insecure=self.insecure,
        )

    @classmethod
    def validated(cls, raw: Mapping[str, Any]) -> LoadOptions:
        """Validate ``raw`` (field name → value; ``None`` or an empty list is left unset): the one place
        a bad option becomes a :class:`ConfigError` naming its flag (a secret's value never shown)."""
        given = {
            k: v for k, v in raw.items() if v is not None and not (isinstance(v, list | tuple) and not v)
        }
        try:
            return cls.model_validate(given)
        except ValidationError as exc:
            err = exc.errors()[0]
            name = str(err["loc"][0]) if err.get("loc") else "?"
            msg = str(err["msg"]).removeprefix("Value error, ")
            got = "" if name in SECRET_FIELDS or name not in given else f" (got {given[name]!r})"
            raise ConfigError(f"{msg}{got}", field=f"--{name.replace('_', '-')}") from None

    @classmethod
    def from_namespace(cls, ns: object) -> LoadOptions:
        """Validate the matching attributes of Locust's ``parsed_options`` (web UI strings included).

        The same values (Locust's init, then every test start) are validated once per process: the
        last result is kept and handed out again while the values are unchanged (the web UI's start
        form changes them between runs, and then they are validated anew)."""
        # Secrets a launcher handed over through the environment, never argv; then the command line.
        raw: dict[str, Any] = secrets_from_env()
        for name in cls.model_fields:
            value = getattr(ns, name, None)
            if value is None or value in ("", []):
                continue
            raw[name] = value
        if "api_key" not in raw and os.environ.get(API_KEY_ENV):
            raw["api_key"] = os.environ[API_KEY_ENV]
        last = _LAST_NAMESPACE.get("raw")
        if last is not None and last == raw:
            return _LAST_NAMESPACE["options"]  # type: ignore[no-any-return]
        opts = cls.validated(raw)
        _LAST_NAMESPACE.update(raw=raw, options=opts)
        return opts

    def evolve(self, **changes: Any) -> LoadOptions:
        """These options with ``changes`` (a value of ``None`` puts the option back to its default,
        unset), validated: a launcher's per-phase or per-probe variant of the options it was given."""
        now: dict[str, Any] = {name: getattr(self, name) for name in self.model_fields_set}
        raw = {k: v for k, v in {**now, **changes}.items() if v is not None and v != []}
        if raw == now:
            return self  # nothing changes: these options were validated already
        return type(self).validated(raw)

    def is_set(self, name: str) -> bool:
        """Whether ``name`` was given (not left at its default): a launcher picks its own default then."""
        if name not in type(self).model_fields:
            raise KeyError(name)
        return name in self.model_fields_set

    def to_args(self) -> list[str]:
        """Command-line arguments that reproduce these options (defaults omitted). The secrets are
        not among them: they travel as :meth:`Credentials.to_env`."""
        args: list[str] = []
        for name, info in type(self).model_fields.items():
            value = getattr(self, name)
            if name in SECRET_FIELDS or value is None or value == info.get_default(call_default_factory=True):
                continue
            flag = f"--{name.replace('_', '-')}"
            args += [flag] if value is True else [flag, str(value)]
        return args


def credential_options(creds: Credentials) -> dict[str, Any]:
    """The load options that carry ``creds`` (``LoadSpec(host=…, **credential_options(creds))``):
    a command that holds a target's credentials hands them to the Locust runs it launches."""
    out: dict[str, Any] = {"header": [f"{name}: {value}" for name, value in creds.headers]}
    if creds.api_key:
        out["api_key"] = creds.api_key
    if creds.admin_token:
        out["admin_token"] = creds.admin_token
    if creds.ca_bundle is not None:
        out["ca_bundle"] = creds.ca_bundle
    if creds.insecure:
        out["insecure"] = True
    return out


SECRET_FIELDS: frozenset[str] = frozenset(SECRET_OPTIONS)
"""Options never written to a command line, a results file or the web UI (they go by environment)."""
_LAST_NAMESPACE: dict[str, Any] = {}
""":meth:`LoadOptions.from_namespace`'s last raw values and their validated options."""


_HELP: dict[str, str] = {
    "corpus": "corpus.jsonl (or its directory) to replay",
    "schedule": "arrival schedule JSONL (harness traces schedule); default: the corpus's arrival offsets",
    "rate": "constant arrival rate, requests/s for all processes together (instead of a schedule)",
    "arrival": "arrival process for --rate: constant or poisson",
    "duration": "seconds of schedule to send (required with --rate)",
    "max_requests": "send at most this many arrivals (a session corpus: sessions, each with all its turns)",
    "speedup": "divide schedule times by this",
    "results_dir": "directory for records.jsonl and summary.json",
    "model": "model name to send (default: the target's first GET /v1/models id; none if it lists none)",
    "max_tokens_cap": "cap every request's max_tokens",
    "api": "auto (the record's shape), chat or completions",
    "stage": "traffic stage label (X-Traffic-Stage)",
    "concurrency": "users per process = most requests in flight; arrivals beyond wait and count as late",
    "start_delay": "seconds from test start to the first arrival (spawning happens meanwhile)",
    "drain_timeout": "seconds in-flight requests get after the last arrival (sessions: last turn's due time)",
    "token_counting": f"tokens per chunk from: {', '.join(TOKEN_COUNTINGS)}",
    "seed_policy": (
        "keep: send each record's sampling seed; drop: leave it out (vLLM's CPU build dies on seeded "
        "requests during chunked prefill)"
    ),
    "tokenizer": "tokenizer.json for --token-counting tokenizer",
    "plan": "warmup ladder plan (YAML)",
    "preload": "JSONL to POST to /cache/preload before the first request (default: the plan's preload)",
    "bypass_fraction": "share of requests sent with Cache-Control: no-cache (0-1, per arrival from --seed)",
    "otlp_endpoint": "OTLP/HTTP endpoint for one client span per request",
    "warmup_id": "X-Warmup-ID of this run (default: random)",
    "pacer_lead_ms": (
        "arrivals reach a user this long ahead; it prepares the request, then yields until it is due"
    ),
    "request_timeout": "seconds a request may take (network timeout)",
    "seed": "seed of the poisson arrival process and of the bypassed arrivals",
    "until_precision": (
        "stop sending once every --precision-on percentile is known to within this relative "
        "half-width (10%% or 0.1)"
    ),
    "max_duration": "seconds of sending at most (bounds --rate without --duration, and --until-precision)",
    "precision_on": "percentiles --until-precision watches, FIELD:Q,… (default ttft_ms:95,tpot_ms:95)",
    "precision_confidence": "confidence of the watched percentile intervals (default 0.95)",
    "precision_min_samples": "--until-precision also waits for this many samples of each watched field",
    "history": "session corpora: history of the target's answers (live) or the log's (log)",
    "salt_per_pass": "give each repeated pass over the corpus a distinct prefix (a salt at the very start)",
    "capacity": "the target's capacity, requests/s (harness capacity): resolves plan stages like qps: 50%%",
    "api_key": f"Bearer key on every request (default: ${API_KEY_ENV}; never written to results)",
    "admin_token": "Bearer token for the admin routes (preload); default: the API key",
    "header": "extra request header NAME:VALUE (repeatable; values never written to results)",
    "ca_bundle": "PEM CA bundle to verify an https:// target against",
    "insecure": "do not verify the target's TLS certificate",
    "server_metrics_interval": (
        "seconds between scrapes of the target's /metrics into server_metrics.jsonl (0: off)"
    ),
}
_TEXT: frozenset[str] = frozenset({"until_precision"})
"""Options given as text whatever their type (``10%``): the model parses them."""


def add_arguments(parser: Any) -> None:
    """Add the load stage's options to Locust's argument parser (an ``init_command_line_parser`` hook).

    They go on the parser itself, not an argument group: only the parser's ``add_argument`` marks an
    option for the web UI's start form.
    """
    for name, info in LoadOptions.model_fields.items():
        flag = f"--{name.replace('_', '-')}"
        default = info.default
        kwargs: dict[str, Any] = {"help": _HELP[name], "default": default}
        ann = info.annotation
        if name in SECRET_FIELDS and hasattr(parser, "args_included_in_web_ui"):
            kwargs["include_in_web_ui"] = False  # Locust's web form would put them in the page
        if name in _TEXT:
            pass
        elif name == "header":
            kwargs.update(action="append", default=None)
        elif ann is bool:
            kwargs["action"] = "store_true"
        elif ann in (float, float | None):
            kwargs["type"] = float
        elif ann in (int, int | None):
            kwargs["type"] = int
        choices = get_args(ann) if get_origin(ann) is Literal else ()
        if choices:
            kwargs["choices"] = list(choices)
        if isinstance(default, Path):
            kwargs["default"] = str(default)
        parser.add_argument(flag, dest=name, **kwargs)


# ---- the same options on the harness's own commands (typer) ---------------------------------------

LAUNCHER_HELP: dict[str, str] = {"processes": "Locust worker processes (one master)"}
"""Options of the launcher (:class:`harness.load.runner.LoadSpec`), not of the Locust run itself,
that every command launching load offers too."""


def _typer_type(name: str, ann: Any) -> Any:
    """The type a typer option of this field takes (``None``: not given)."""
    if name in _TEXT or get_origin(ann) is Literal:
        return str | None  # LoadOptions parses and checks them, one error message for every command
    if ann is bool:
        return bool
    for base in (Path, float, int, str):
        if ann in (base, base | None):
            return base | None
    raise TypeError(f"no command-line type for LoadOptions.{name}: {ann}")


def _credential_options() -> dict[str, Any]:
    from harness.common import auth

    # Declared once in harness.common.auth for every command that talks to a target (its panel,
    # its environment variables); the load options take them as they are.
    return {
        "api_key": (auth.ApiKeyOption, None),
        "admin_token": (auth.AdminTokenOption, None),
        "header": (auth.HeaderOption, None),
        "ca_bundle": (auth.CaBundleOption, None),
        "insecure": (auth.InsecureOption, False),
    }


def _same(value: Any, default: Any) -> bool:
    """Whether ``value`` is the option's unset value, by type too (an ``--insecure`` left off is
    ``False``; a ``--seed 0`` is the default seed, not a flag left off, though ``0 == False``)."""
    if value in ([], ()):
        value = None  # a repeatable option given no times
    if value is None or default is None or isinstance(default, bool):
        return value is default
    return type(value) is type(default) and bool(value == default)


def typer_options(
    *names: str,
    required: frozenset[str] | set[str] = frozenset(),
    panel: str | None = None,
    help_for: Mapping[str, str] | None = None,
) -> Callable[[Callable[..., _R]], Callable[..., _R]]:
    """Give a typer command the load options ``names`` (fields of :class:`LoadOptions`, or
    :data:`LAUNCHER_HELP`'s): one ``--flag`` each, named, typed and helped as Locust's parser has them
    (:func:`add_arguments`), with the option's default shown. The command takes a ``load`` parameter:
    a dict of the options given (those at their default left out: unset, as a launcher that picks
    its own default wants them), ready for ``LoadSpec(host=…, **load)``, which validates them once.

    ``required``: options the command cannot run without (no default); ``help_for``: a command's own
    help where the option means more there (``harness capacity``'s ``--concurrency``).
    """
    credentials = _credential_options()
    fields = LoadOptions.model_fields

    own_help = help_for or {}
    unset: dict[str, Any] = {}
    """The value of each option when it is not given (the command cannot tell the two apart)."""

    def param(name: str) -> inspect.Parameter:
        kind = inspect.Parameter.KEYWORD_ONLY
        if name in credentials:
            annotation, default = credentials[name]
            unset[name] = default
            return inspect.Parameter(name, kind, annotation=annotation, default=default)
        if name in LAUNCHER_HELP:
            text, typ, default = LAUNCHER_HELP[name], int | None, None
        else:
            info = fields[name]
            text, typ = _HELP[name], _typer_type(name, info.annotation)
            # The option's own default, shown in the help; where the command gives the option a
            # meaning of its own (its help says so) "not given" stays None, for it to decide.
            default = None if name in own_help else info.get_default(call_default_factory=True)
        text = own_help.get(name) or text.replace("%%", "%")
        option = typer.Option(
            f"--{name.replace('_', '-')}",
            help=text + ("" if text.endswith(".") else "."),
            rich_help_panel=panel,
        )
        if name in required:
            base = get_args(typ)[0] if get_origin(typ) in (UnionType, Union) else typ
            return inspect.Parameter(name, kind, annotation=Annotated[base, option])
        unset[name] = default
        return inspect.Parameter(name, kind, annotation=Annotated[typ, option], default=default)

    generated = [param(n) for n in names]

    def decorate(func: Callable[..., _R]) -> Callable[..., _R]:
        sig = inspect.signature(func, eval_str=True)
        own = [p for p in sig.parameters.values() if p.name != "load"]
        assert "load" in sig.parameters, f"{func.__name__} takes the options as `load`"
        clash = {p.name for p in own} & set(names)
        assert not clash, f"{func.__name__} declares load options itself: {clash}"

        @functools.wraps(func)
        def command(**kwargs: Any) -> _R:
            load = {n: kwargs.pop(n) for n in names}
            given = {n: v for n, v in load.items() if n not in unset or not _same(v, unset[n])}
            return func(**kwargs, load=given)

        params = [*own, *generated]
        command.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        del command.__wrapped__  # typer reads the signature above, not the function's own
        return command

    return decorate
