"""The load stage's options: one model, each option declared once (type, default, validation, help).

:class:`LoadOptions` is every option of a replay or ladder run, as a pydantic model whose fields carry
their help (``description``) and command-line spelling (:class:`harness.common.options.Flag`). From it:

- Locust's arguments (:func:`add_arguments`, an ``init_command_line_parser`` hook), so the options work
  on ``locust -f`` (``--corpus …``), in a Locust config file (``corpus = …``), as ``LOCUST_CORPUS=…``
  and in the web UI's start form;
- the typer options of the harness's commands that launch load (:func:`typer_options`, and the
  recipe of :mod:`harness.experiments.recipe`);
- what a launcher hands its Locust processes (:meth:`LoadOptions.to_json`: the validated object as one
  ``--options-json`` argument, :mod:`harness.load.runner`), and the command line that reproduces a run
  for a reader (:meth:`LoadOptions.to_args`).

:class:`LoadOptions` validates what arrived (``extra="forbid"``: a misspelt field in code is an error);
:meth:`LoadOptions.validated` is the one place a bad value becomes a :class:`ConfigError` naming its
flag.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, get_args, get_origin

from pydantic import (
    BeforeValidator,
    Field,
    PlainSerializer,
    ValidationError,
    field_validator,
)

from harness.common.auth import API_KEY_ENV, SECRET_OPTIONS, AccessOptions, secrets_from_env
from harness.common.errors import ConfigError
from harness.common.io import json_object
from harness.common.model import StrictModel
from harness.common.options import (
    Flag,
    description,
    flag_names,
    flag_of,
    long_flag,
    options_of,
    with_options,
)
from harness.common.units import fraction
from harness.load.arrivals import ApiChoice, ArrivalProcess, SeedPolicy
from harness.load.stream import TOKEN_COUNTINGS, TokenCounting

_R = TypeVar("_R")

DEFAULT_STAGE = "replay"
DEFAULT_PRECISION_ON = "ttft_ms:95,tpot_ms:95"
LOAD_PANEL = "Load"


def _in_unit(value: float) -> float:
    if not 0.0 < value <= 1.0:
        raise ValueError(f"a relative half-width must be in (0, 1]: 10% or 0.1, not {value:g}")
    return value


# "10%" or 0.1: the command line, a config file and the web UI give text.
RelativeWidth = Annotated[float, BeforeValidator(fraction), Field(allow_inf_nan=False)]


@dataclass(frozen=True)
class Share:
    """A rate given as a share of the target's capacity (``--rate 50%``): requests/s once the
    capacity is known (``--capacity``, or measured by ``harness run``)."""

    fraction: float

    def __str__(self) -> str:
        return f"{self.fraction * 100:g}%"

    def of(self, capacity: float) -> float:
        """Requests/s at ``capacity`` (4 significant digits: a rate a person can type again)."""
        return float(f"{self.fraction * capacity:.4g}")


def _rate(value: Any) -> Any:
    """``"4"`` → 4.0 requests/s; ``"50%"`` → :class:`Share` (0.5 of capacity); numbers pass."""
    if isinstance(value, str):
        from harness.load.plan import parse_share

        text = value.strip()
        share = parse_share(text)  # raises ValueError for a bad percentage
        if share is not None:
            return Share(share)
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"{value!r} is neither requests/s (4) nor a share of capacity (50%)") from None
    if isinstance(value, int | float) and not (math.isfinite(value) and value > 0):
        raise ValueError(f"a rate must be a positive number of requests/s, not {value!r}")
    return value


Rate = Annotated[
    float | Share,
    BeforeValidator(_rate),
    PlainSerializer(lambda v: str(v) if isinstance(v, Share) else v),
]
"""Requests/s, or a :class:`Share` of capacity."""

_ACCESS = frozenset(AccessOptions.model_fields)


class LoadOptions(AccessOptions):
    """Everything a replay or ladder run is configured with (besides Locust's own ``--host`` etc.);
    the credentials options come from :class:`~harness.common.auth.AccessOptions`."""

    corpus: Annotated[Path | None, Flag(uses=("send",))] = Field(
        None, description="corpus.jsonl (or its directory) to replay"
    )
    schedule: Annotated[Path | None, Flag(uses=("run", "arrivals"))] = Field(
        None,
        description="Arrival schedule JSONL (harness traces schedule); default: the corpus's arrival "
        "offsets, or --rate",
    )
    rate: Annotated[Rate | None, Flag(text=True, metavar="RATE", uses=("rate", "arrivals"))] = Field(
        None,
        description="Constant arrival rate instead of a schedule: requests/s for all processes together "
        "(4), or a share of the target's capacity (50%: needs --capacity, which harness run measures "
        "when not given)",
    )
    arrival: Annotated[ArrivalProcess, Flag(uses=("rate", "arrivals"))] = Field(
        "constant", description="Arrival process of --rate: constant or poisson"
    )
    duration: Annotated[float | None, Flag(uses=("length", "arrivals"))] = Field(
        None, gt=0, description="Seconds of schedule to send (default: all of it; with --rate, --duration "
        "or --max-requests bounds the run)",
    )  # fmt: skip
    max_requests: Annotated[int | None, Flag(uses=("run", "arrivals"))] = Field(
        None, ge=1, description="Send at most this many arrivals (a session corpus: sessions, each with "
        "all its turns)",
    )  # fmt: skip
    speedup: Annotated[float, Flag(uses=("speed", "arrivals"))] = Field(
        1.0, gt=0, description="Divide schedule times by this (2 = twice as fast)"
    )
    results_dir: Annotated[Path, Flag(names=("--out", "-o"), deprecated=("--results-dir",))] = Field(
        Path("runs/load"), description="Directory for records.jsonl and summary.json"
    )
    model: Annotated[str | None, Flag(uses=("send", "key"))] = Field(
        None, description="Model name to send (default: the target's first GET /v1/models id; none if it "
        "lists none)",
    )  # fmt: skip
    max_tokens_cap: Annotated[int | None, Flag(uses=("send", "key"))] = Field(
        None, ge=1, description="Cap every request's max_tokens at this"
    )
    api: Annotated[ApiChoice, Flag(uses=("send", "key"))] = Field(
        "auto", description="Request shape: auto (the record's), chat or completions"
    )
    stage: Annotated[str, Flag(uses=("arrivals",))] = Field(
        DEFAULT_STAGE, description="Traffic stage label: X-Traffic-Stage and the records' stage (ladder runs "
        "use their stage names)",
    )  # fmt: skip
    concurrency: Annotated[int, Flag(uses=("send",))] = Field(
        64, ge=1, description="Users per process: the most requests in flight (arrivals beyond wait and "
        "count as late; harness capacity: default a probe's requests, at most 512)",
    )  # fmt: skip
    start_delay: Annotated[float, Flag(uses=("start",))] = Field(
        2.0, ge=0, description="Seconds from test start to the first arrival (users spawn meanwhile; "
        "workers use the master's epoch)",
    )  # fmt: skip
    drain_timeout: float = Field(
        60.0, ge=0, description="Seconds in-flight requests get after the last arrival (sessions: after "
        "the last turn's due time)",
    )  # fmt: skip
    token_counting: Annotated[TokenCounting, Flag(uses=("send",))] = Field(
        "auto", description=f"Where tokens per chunk come from: {', '.join(TOKEN_COUNTINGS)}"
    )
    seed_policy: Annotated[SeedPolicy, Flag(uses=("send",))] = Field(
        "keep", description="keep: send each record's sampling seed; drop: leave it out (for targets "
        "that cannot take one: vLLM's CPU build dies on a seeded request during chunked prefill)",
    )  # fmt: skip
    tokenizer: Annotated[Path | None, Flag(uses=("send",))] = Field(
        None, description="tokenizer.json for --token-counting tokenizer (and auto's fallback)"
    )
    plan: Annotated[Path | None, Flag(uses=("run", "ladder"))] = Field(
        None, description="Warmup ladder plan (YAML): locustfiles/warmup.py's stages; harness run's warm-up "
        "after --preload",
    )  # fmt: skip
    preload: Annotated[Path | None, Flag(uses=("run",))] = Field(
        None, description="JSONL posted to POST /cache/preload before the first request (the ladder: "
        "default the plan's preload)",
    )  # fmt: skip
    bypass_fraction: float = Field(
        0.0, ge=0.0, le=1.0, description="Share of arrivals sent with Cache-Control: no-cache (0-1, "
        "chosen per arrival from --seed)",
    )  # fmt: skip
    otlp_endpoint: str | None = Field(
        None, description="OTLP/HTTP traces endpoint (http://host:4318/v1/traces): one client span per "
        "request",
    )  # fmt: skip
    warmup_id: str | None = Field(None, description="X-Warmup-ID of every request of the run "
                                  "(default: a new random id)")  # fmt: skip
    pacer_lead_ms: float = Field(
        3.0, ge=0, description="Arrivals reach a user this long ahead; it prepares the request, then "
        "yields until it is due",
    )  # fmt: skip
    request_timeout: float = Field(600.0, gt=0, description="Seconds a request may take (network timeout)")
    seed: Annotated[int, Flag(uses=("start",))] = Field(
        0, description="Seed of the poisson arrival process and of the bypassed arrivals"
    )
    until_precision: Annotated[RelativeWidth | None, Flag(text=True, uses=("precision", "arrivals"))] = Field(
        None,
        description="Stop sending once every --precision-on percentile is known to within this relative "
        "half-width (10% or 0.1); harness run: each phase, watching its gates' percentiles with --gate; "
        "harness capacity: each probe, watching the SLO's",
    )
    max_duration: Annotated[float | None, Flag(uses=("budget", "arrivals"))] = Field(
        None, gt=0, description="Seconds of sending at most (bounds --rate without --duration, and "
        "--until-precision; harness run: each phase; harness ab: its blocks, no look starts that would "
        "end past it)",
    )  # fmt: skip
    precision_on: Annotated[str, Flag(uses=("run", "arrivals"))] = Field(
        DEFAULT_PRECISION_ON,
        description="The percentiles --until-precision watches, FIELD:Q items, comma-separated "
        "(harness run --gate: default the baseline's)",
    )
    precision_confidence: Annotated[float, Flag(uses=("arrivals",))] = Field(
        0.95, gt=0.5, lt=1.0, description="Confidence of the watched intervals (a gate's baseline "
        "confidence)",
    )  # fmt: skip
    precision_min_samples: Annotated[int | None, Flag(uses=("arrivals",))] = Field(
        None, ge=1, description="--until-precision also waits for this many samples of each watched "
        "field (a gate's min_samples)",
    )  # fmt: skip
    history: Annotated[Literal["live", "log"], Flag(uses=("run", "arrivals"))] = Field(
        "live", description="Session corpora: turn k+1's history holds what the target answered (live) "
        "or the log's answers (log)",
    )  # fmt: skip
    salt_per_pass: Annotated[bool, Flag(uses=("run",))] = Field(
        False, description="Give each repeated pass over the corpus a distinct salt at the very start, "
        "so no pass reuses another's prefixes",
    )  # fmt: skip
    capacity: Annotated[float | None, Flag(uses=("share",))] = Field(
        None, gt=0, description="The target's capacity, requests/s (harness capacity): resolves --rate "
        "50% and plan stages like qps: 50% (harness run: default measured first)",
    )  # fmt: skip
    server_metrics_interval: float = Field(
        1.0, ge=0, description="Seconds between scrapes of the target's /metrics into "
        "server_metrics.jsonl (0: off)",
    )  # fmt: skip

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

    def rate_rps(self) -> float | None:
        """``rate`` in requests/s (``None``: no rate, a schedule). A share needs ``capacity``: a
        :class:`ConfigError` without it."""
        if isinstance(self.rate, Share):
            if self.capacity is None:
                raise ConfigError(
                    f"{self.rate} is a share of the target's capacity: give --capacity (requests/s)",
                    field="--rate",
                    hint="harness capacity measures it; harness run measures it first by itself",
                )
            return self.rate.of(self.capacity)
        return self.rate

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
            info = cls.model_fields.get(name)
            flag = long_flag(name, info) if info is not None else f"--{name.replace('_', '-')}"
            raise ConfigError(f"{msg}{got}", field=flag) from None

    @classmethod
    def from_namespace(cls, ns: object) -> LoadOptions:
        """Validate the matching attributes of Locust's ``parsed_options`` (web UI strings included).

        The same values (Locust's init, then every test start) are validated once per process: the
        last result is kept and handed out again while the values are unchanged (the web UI's start
        form changes them between runs, and then they are validated anew)."""
        # Secrets a launcher handed over through the environment, never argv; then the options: the
        # launcher's one object (``--options-json``) or the command line's flags, not both.
        raw: dict[str, Any] = secrets_from_env()
        handed = _handed_over(ns)
        for name, info in cls.model_fields.items():
            value = getattr(ns, name, None)
            if value is None or value in ("", []):
                continue
            if handed is not None:
                default = info.get_default(call_default_factory=True)
                if name not in SECRET_FIELDS and str(value) != str(default):
                    raise ConfigError(
                        "is given beside --options-json: give each load option in one of them",
                        field=long_flag(name, info),
                    )
                continue
            raw[name] = value
        raw.update(handed or {})
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

    def to_json(self) -> str:
        """These options as one JSON object (defaults and secrets omitted): what a launcher hands
        its Locust processes as ``--options-json``, validated there as the same model
        (:meth:`from_namespace`). The secrets travel as :meth:`Credentials.to_env`."""
        given = {name for name in type(self).model_fields if self._differs(name)}
        return self.model_dump_json(include=given)

    def _differs(self, name: str) -> bool:
        """Whether option ``name`` is set to something other than its default (never a secret)."""
        value = getattr(self, name)
        default = type(self).model_fields[name].get_default(call_default_factory=True)
        return name not in SECRET_FIELDS and value is not None and value != default

    def to_args(self) -> list[str]:
        """Command-line arguments that reproduce these options (defaults omitted): for a reader
        (a record, a printed command), not the launch (:meth:`to_json`). The secrets are not among
        them: they travel as :meth:`Credentials.to_env`."""
        args: list[str] = []
        for name, info in type(self).model_fields.items():
            value = getattr(self, name)
            if not self._differs(name):
                continue
            flag = long_flag(name, info)
            args += [flag] if value is True else [flag, str(value)]
        return args


SECRET_FIELDS: frozenset[str] = frozenset(SECRET_OPTIONS)
"""Options never written to a command line, a results file or the web UI (they go by environment)."""
_LAST_NAMESPACE: dict[str, Any] = {}
""":meth:`LoadOptions.from_namespace`'s last raw values and their validated options."""


OPTIONS_JSON = "--options-json"
"""Locust's argument for the whole options as one JSON object (:meth:`LoadOptions.to_json`)."""


def _handed_over(ns: object) -> dict[str, Any] | None:
    """The options a launcher handed over as one object (``--options-json``), or ``None``. Locust's
    master sends its parsed options to every worker with each spawn message, so a worker on another
    machine gets the same object."""
    text = getattr(ns, "options_json", None)
    return json_object(text, OPTIONS_JSON) if text else None


def add_arguments(parser: Any) -> None:
    """Add the load stage's options to Locust's argument parser (an ``init_command_line_parser`` hook).

    Each field's flags, help and type come from :class:`LoadOptions` (long forms only: Locust owns the
    short ones). They go on the parser itself, not an argument group: only the parser's
    ``add_argument`` marks an option for the web UI's start form. An old spelling (``--results-dir``)
    is a hidden argument of its own that stores the same value and warns once per process.
    """
    web_ui = hasattr(parser, "args_included_in_web_ui")
    parser.add_argument(
        OPTIONS_JSON, dest="options_json", default=None, **({"include_in_web_ui": False} if web_ui else {}),
        help="All the load options as one JSON object, as the harness's launchers pass them (then no "
        "other load option on the command line)",
    )  # fmt: skip
    for name, info in LoadOptions.model_fields.items():
        flag = flag_of(info)
        names = [n for n in flag_names(name, info) if n.startswith("--")]
        old = [n for n in flag.deprecated if n.startswith("--")]
        default = info.get_default(call_default_factory=True)
        help_text = description(info).replace("%", "%%")  # argparse formats help with %
        kwargs: dict[str, Any] = {"help": help_text, "default": default}
        ann = info.annotation
        if name in SECRET_FIELDS and hasattr(parser, "args_included_in_web_ui"):
            kwargs["include_in_web_ui"] = False  # Locust's web form would put them in the page
        if flag.text:
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
        parser.add_argument(*names, dest=name, **kwargs)
        if old:
            assert "action" not in kwargs, f"{name}: an old spelling of a switch or a list is not supported"
            hidden = {"include_in_web_ui": False} if web_ui else {}
            parser.add_argument(
                *old, dest=name, action=_old_spelling(names[0]), help=argparse.SUPPRESS,
                default=argparse.SUPPRESS, type=kwargs.get("type"), **hidden,
            )  # fmt: skip


_WARNED: set[str] = set()
"""Old spellings this process has warned about (Locust parses its command line more than once)."""


def _old_spelling(new: str) -> type[argparse.Action]:
    """An argparse action for an old spelling of ``new``: it stores the value and warns once."""

    class OldSpelling(argparse.Action):
        def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
            from harness.common.options import warn_deprecated

            old = option_string or self.option_strings[0]
            if old not in _WARNED:
                _WARNED.add(old)
                warn_deprecated(old, new)
            setattr(namespace, self.dest, values)

    return OldSpelling


# ---- the same options on the harness's own commands (typer) ---------------------------------------


USES: dict[str, str] = {
    "send": "what each request is and how it is sent, counted and authorised: every command that sends",
    "key": "what the response cache keys a request on: a command that prepares requests as a replay "
    "will send them (the warmup plan)",
    "rate": "an open-loop rate and its arrival process",
    "share": "a rate given as a share of a measured capacity",
    "start": "when the first arrival is due, and the seed of random arrivals",
    "speed": "recorded arrival times sent faster or slower",
    "length": "how many seconds a phase sends",
    "budget": "the most seconds a command sends, over all its phases",
    "precision": "stop once the watched percentiles are known well enough",
    "run": "a whole run's own: its schedule, request count, watched percentiles, session history, pass "
    "salts, warm-up plan and preload",
    "arrivals": "a replay's own arrivals and stop rules, which a ladder's plan sets (a ladder refuses them)",
    "ladder": "a ladder's plan (a replay has none)",
}
"""The kinds of use a load option declares (``Flag(uses=…)`` on its field), and what each means. A
command shows the fields of the uses it has (:func:`load_flags`): ``harness run`` every command use,
``harness capacity`` ``send`` and ``precision``, ``harness ab`` ``send``, ``rate``, ``share``,
``start`` and ``budget`` … ; ``harness load replay`` every field but the ``ladder``'s, ``harness load
ladder`` every field but the ``arrivals``. A field with no use is set in a recipe file, a Locust
config or by the command itself, not as a flag of the harness's experiments."""
RUN_USES = ("send", "key", "rate", "share", "start", "speed", "length", "budget", "precision", "run")
"""What ``harness run`` and ``harness baseline calibrate`` send: every use of a command."""


def load_flags(*uses: str, but: str | None = None) -> tuple[str, ...]:
    """The :class:`LoadOptions` fields, in declaration order, that declare any of ``uses`` (none given:
    every field), less those that declare ``but``."""
    unknown = {*uses, *([but] if but else [])} - USES.keys()
    assert not unknown, f"not a use of the load options: {unknown}"
    chosen = []
    for name, info in LoadOptions.model_fields.items():
        has = set(flag_of(info).uses)
        if (not uses or has & set(uses)) and (but is None or but not in has):
            chosen.append(name)
    return tuple(chosen)


class LaunchOptions(StrictModel):
    """Options of the launcher (:class:`harness.load.runner.LoadSpec`), not of the Locust run itself,
    that every command launching load offers too."""

    processes: Annotated[int | None, Flag(panel=LOAD_PANEL)] = Field(
        None, ge=1, description="Locust worker processes (one master, one results directory)"
    )


def typer_options(
    *names: str,
    required: Iterable[str] = (),
    panel: str | None = LOAD_PANEL,
    defaults: Mapping[str, Any] | None = None,
) -> Callable[[Callable[..., _R]], Callable[..., _R]]:
    """Give a typer command the load options ``names`` (fields of :class:`LoadOptions` or
    :class:`LaunchOptions`), generated by :func:`harness.common.options.with_options`. The command takes
    a ``load`` parameter: a dict of the options given, ready for ``LoadSpec(host=…, **load)``, which
    validates them once. ``defaults``: the command's own defaults, as its help shows them."""
    launch = [n for n in names if n in LaunchOptions.model_fields]
    opts = [
        *options_of(LoadOptions, only=[n for n in names if n not in launch]),
        *options_of(LaunchOptions, only=launch),
    ]
    by_name = {o.name: o for o in opts}
    ordered = [by_name[n] for n in names]
    return with_options(ordered, panel=panel, required=required, defaults=defaults, param="load")
