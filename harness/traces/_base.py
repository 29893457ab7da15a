"""Shared plumbing for the trace readers: the reader registries, ID and tag normalization, line streaming.

Every reader module registers a :class:`~harness.common.formats.Reader` (the one reader type, shared
with the corpus stage's log readers) under its format name, in :data:`REQUEST_READERS` or
:data:`TRACE_READERS` by what it yields (names are unique across both). Readers
stream: JSONL and CSV are read line by line from a binary handle (so invalid UTF-8 is located to the
line), big JSON documents go through ``ijson``. Row-level problems become :class:`InputError` naming
file, line and field; with ``skip_invalid`` they are passed to an ``on_skip`` callback instead and
the row is dropped.
"""

from __future__ import annotations

import base64
import binascii
import logging
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TypeVar

from harness.common.errors import ConfigError, InputError
from harness.common.formats import Reader, by_priority
from harness.common.registry import Registry
from harness.traces.model import RequestEvent, TagValue, Trace

log = logging.getLogger(__name__)

Family = Literal["requests", "traces"]
OnSkip = Callable[[InputError], None]
R = TypeVar("R")
P = TypeVar("P")


E = TypeVar("E", RequestEvent, Trace)


RequestReader = Reader[..., Iterator[RequestEvent]]
"""A request-trace format: ``read(path, skip_invalid, on_skip)`` streams :class:`RequestEvent` values
(``path`` a :class:`Path`, a URL string for live sources)."""
TraceReader = Reader[..., Iterator[Trace]]
"""A distributed-trace format: ``read(path, skip_invalid, on_skip)`` streams :class:`Trace` values."""

REQUEST_READERS: Registry[RequestReader] = Registry("request-trace format")
"""LLM request traces (Mooncake, Azure, BurstGPT, Splitwise, cold paths) → :class:`RequestEvent`."""
TRACE_READERS: Registry[TraceReader] = Registry("distributed-trace format")
"""Distributed traces (Jaeger, OTLP, a Jaeger query service) → :class:`Trace` with its span tree."""
FAMILIES: dict[Family, Registry[RequestReader] | Registry[TraceReader]] = {
    "requests": REQUEST_READERS,
    "traces": TRACE_READERS,
}


def all_readers() -> list[tuple[Family, RequestReader | TraceReader]]:
    """Every registered format with its family, in sniffing order (:func:`by_priority`)."""
    family: dict[str, Family] = {}
    found: list[RequestReader | TraceReader] = []
    for fam, registry in FAMILIES.items():
        for name, reader in registry.items():
            family[name] = fam
            found.append(reader)
    return [(family[r.name], r) for r in by_priority(found)]


def family_of(name: str) -> Family:
    """The family of format ``name``; a :class:`ConfigError` naming every format if it is unknown."""
    for family, registry in FAMILIES.items():
        if name in registry:
            return family
    known = ", ".join(r.name for _, r in all_readers())
    raise ConfigError(f"unknown trace format {name!r}; known: {known}")


@dataclass(slots=True)
class SkipLog:
    """Counts rows skipped under ``--skip-invalid``, by reason, keeping a few examples."""

    count: int = 0
    reasons: Counter[str] = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)

    def __call__(self, err: InputError) -> None:
        self.count += 1
        self.reasons[err.message] += 1
        if len(self.examples) < 5:
            self.examples.append(str(err))

    def summary(self) -> str:
        top = "; ".join(f"{n}× {r}" for r, n in self.reasons.most_common(3))
        return f"skipped {self.count} invalid row(s): {top}"


def default_on_skip(err: InputError) -> None:
    log.warning("skipped: %s", err)


# --------------------------------------------------------------------------- IDs

_HEX = re.compile(r"^[0-9a-fA-F]+$")


def normalize_id(raw: object, width: int) -> str:
    """Lowercase hex left-padded to ``width`` (16 span / 32 trace); non-hex IDs stay opaque strings.

    Integers (some exporters write numeric IDs) are formatted as hex. A hex ID longer than ``width``
    is kept whole rather than truncated, so distinct IDs never collide.
    """
    if isinstance(raw, bool):
        raise ValueError("an ID cannot be a boolean")
    if isinstance(raw, int):
        return format(raw & ((1 << (4 * width)) - 1), f"0{width}x")
    text = str(raw).strip()
    if not text:
        raise ValueError("empty ID")
    if _HEX.match(text):
        return text.lower().rjust(width, "0")
    return text


def normalize_otlp_id(raw: object, width: int) -> str:
    """OTLP IDs: hex (any case) per the OTLP/JSON spec, or base64 as protobuf JSON mapping writes bytes."""
    text = str(raw).strip()
    if _HEX.match(text):
        return text.lower().rjust(width, "0")
    nbytes = width // 2
    try:
        decoded = base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError):
        decoded = b""
    if len(decoded) == nbytes:
        return decoded.hex()
    return normalize_id(text, width)


# --------------------------------------------------------------------------- tags

_TRUE = {"true", "1", "yes", "t"}
_FALSE = {"false", "0", "no", "f"}


def coerce_tag(value: object, declared: str | None) -> TagValue:
    """A tag value of the declared Jaeger type; values that disagree with it (``"123"`` for int64,
    ``"true"`` for bool) are converted when that is unambiguous and kept as given otherwise."""
    kind = (declared or "").lower()
    try:
        if kind in ("int64", "int", "long"):
            if isinstance(value, bool):
                return int(value)
            if isinstance(value, int):
                return value
            if isinstance(value, float) and value.is_integer():
                return int(value)
            return int(str(value).strip())
        if kind in ("float64", "float", "double"):
            if isinstance(value, bool):
                return float(value)
            return float(value) if isinstance(value, int | float) else float(str(value).strip())
        if kind in ("bool", "boolean"):
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in _TRUE:
                return True
            if text in _FALSE:
                return False
    except (TypeError, ValueError):
        pass
    if isinstance(value, str | int | float | bool):
        return value
    return str(value)


def truthy(value: TagValue | None) -> bool:
    """A tag read as a flag: ``true``/``"true"``/``"hit"``/non-zero numbers are true."""
    if value is None:
        return False
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float):
        return value != 0
    text = value.strip().lower()
    if text in _TRUE or text == "hit":
        return True
    try:
        return float(text) != 0
    except ValueError:
        return False


def error_from_tags(tags: dict[str, TagValue]) -> bool:
    """``error=true``, OTel status ERROR, HTTP 5xx or a non-OK gRPC status."""
    if truthy(tags.get("error")):
        return True
    if str(tags.get("otel.status_code", "")).upper() == "ERROR":
        return True
    for key in ("http.response.status_code", "http.status_code"):
        code = tags.get(key)
        if code is not None:
            try:
                if int(code) >= 500:
                    return True
            except (TypeError, ValueError):
                pass
    grpc = tags.get("rpc.grpc.status_code")
    if grpc is not None:
        try:
            return int(grpc) != 0
        except (TypeError, ValueError):
            return False
    return False


# --------------------------------------------------------------------------- line streaming

MAX_SNIFF = 64 * 1024


def utf8_error(path: Path, head: bytes) -> InputError | None:
    """An :class:`InputError` locating the first invalid UTF-8 byte of ``head``, if there is one."""
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        # A multi-byte character cut by the read boundary is fine; anything earlier is not UTF-8.
        if exc.start < len(head) - 4:
            line = head[: exc.start].count(b"\n") + 1
            return InputError(
                f"invalid UTF-8 at byte {exc.start}, expected a UTF-8 text file", file=path, line=line
            )
    return None


def iter_lines(
    path: Path, skip: bool = False, on_skip: OnSkip = default_on_skip, *, blank: bool = True
) -> Iterator[tuple[int, str]]:
    """(1-based line number, decoded line without its CR/LF) for each line; blank lines (whitespace
    only) are included unless ``blank`` is false.

    Decoding per line keeps memory bounded and locates invalid UTF-8 to its line.
    """
    with path.open("rb") as fh:
        for n, raw in enumerate(fh, start=1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                err = InputError("invalid UTF-8, expected a UTF-8 text file", file=path, line=n)
                if not skip:
                    raise err from None
                on_skip(err)
                continue
            if n == 1 and text.startswith("\ufeff"):
                text = text[1:]
            if blank or text.strip():
                yield n, text.rstrip("\r\n")


def read_head(path: Path, size: int = MAX_SNIFF) -> bytes:
    with path.open("rb") as fh:
        return fh.read(size)


# --------------------------------------------------------------------------- rows → events


def reject(err: InputError, skip: bool, on_skip: OnSkip) -> None:
    """Raise ``err``; under ``--skip-invalid`` pass it to ``on_skip`` instead (the caller drops the row)."""
    if not skip:
        raise err
    on_skip(err)


def span_error(msg: str, path: Path | str, line: int | None, where: str, expected: str) -> InputError:
    """A span converter's ``"field: detail"`` message as an :class:`InputError` located at ``where.field``."""
    field, sep, detail = msg.partition(": ")
    return InputError(
        f"{detail if sep else msg}, expected {expected}",
        file=path,
        line=line,
        field=f"{where}.{field}" if sep and field else where,
    )


def convert_rows(
    rows: Iterable[tuple[int, R]], convert: Callable[[int, R], P], skip: bool, on_skip: OnSkip
) -> Iterator[tuple[int, P]]:
    """``(line, convert(line, row))`` per row; a row whose conversion raises :class:`InputError` is
    :func:`reject`-ed, so one bad row either stops the read or is skipped, never both."""
    for n, row in rows:
        try:
            value = convert(n, row)
        except InputError as err:
            reject(err, skip, on_skip)
            continue
        yield n, value


class ArrivalClock:
    """Arrival offsets from the first row's time, for sources that must list requests in time order.

    ``per_second`` is the source's time unit per second (1 for seconds, 1e3 for ms, 1e9 for ns). The
    origin is the first row whose time was read; a later row before it is an :class:`InputError`
    naming ``field`` (as the file spells it) rather than a negative arrival. Integer times (Azure's
    nanoseconds) are subtracted as integers, so the offset keeps their full resolution.
    """

    def __init__(
        self,
        path: Path,
        field: str,
        *,
        what: str = "timestamp",
        order: str = "arrival",
        per_second: float = 1.0,
    ) -> None:
        self.path = path
        self.field = field
        self.what = what
        self.order = order
        self.per_second = per_second
        self.origin: float | None = None

    def offset(self, line: int, time: float) -> float:
        """Seconds since the first row's time; raises if ``time`` is before it."""
        if self.origin is None:
            self.origin = time
        if time < self.origin:
            early = (self.origin - time) / self.per_second
            raise InputError(
                f"{self.what} is {early:g} s before the first row's (expected rows in {self.order} order)",
                file=self.path,
                line=line,
                field=self.field,
            )
        return (time - self.origin) / self.per_second
