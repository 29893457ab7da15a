"""The public reading API of the traces stage: format detection, streaming readers, document loaders.

Other stages call these (re-exported from :mod:`harness.traces`); the CLI is a thin layer over them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from harness.common.errors import InputError
from harness.common.formats import Reader, sniff, unrecognised
from harness.common.io import check_input_file, iter_jsonl, read_json
from harness.common.registry import Registry
from harness.traces import readers as _readers  # noqa: F401  (registers the formats)
from harness.traces._base import (
    REQUEST_READERS,
    TRACE_READERS,
    E,
    Family,
    OnSkip,
    all_readers,
    default_on_skip,
    family_of,
    read_head,
    utf8_error,
)
from harness.traces.model import RequestEvent, ScenarioSet, ScheduleEntry, Trace

URL_PREFIXES = ("http://", "https://")


def formats(family: str | None = None) -> list[str]:
    """Registered format names, optionally only those of one family (``requests`` / ``traces``)."""
    return [r.name for fam, r in all_readers() if family is None or fam == family]


def detect_format(path: str | Path) -> str:
    """The format name of ``path`` from its content (and URL scheme for a live Jaeger query service).

    Raises :class:`InputError` for a missing, empty, binary or unrecognised file.
    """
    text = str(path)
    if text.startswith(URL_PREFIXES):
        return "jaeger-query"
    p = check_input_file(path)
    head = read_head(p)
    readers = [r for _, r in all_readers()]
    found = sniff(readers, p, head)
    if found is not None:
        return found.name
    bad_utf8 = utf8_error(p, head)
    if bad_utf8 is not None:
        raise bad_utf8
    raise unrecognised(readers, p, what="format", hint="pass --trace-format to name it", line=1)


_WRONG_FAMILY: dict[Family, tuple[str, str]] = {
    "traces": (
        "{name} is an LLM request trace, not a distributed trace (no spans)",
        "replay it with `harness traces schedule --from` (API: read_requests)",
    ),
    "requests": (
        "{name} is a distributed trace, not an LLM request trace",
        "extract cold paths first with `harness traces coldpaths` (API: read_traces)",
    ),
}
"""Per family asked for: what to say when the file is of the other family."""


def _reader(
    path: str | Path, format: str | None, family: Family, registry: Registry[Reader[..., Iterator[E]]]
) -> tuple[Reader[..., Iterator[E]], Path | str]:
    """The reader of ``family`` for ``path`` (detected unless ``format`` names it) and the checked path."""
    name = format or detect_format(path)
    if name not in registry:
        family_of(name)  # an unknown name is a ConfigError listing every format
        message, hint = _WRONG_FAMILY[family]
        raise InputError(message.format(name=name), file=str(path), hint=hint)
    reader = registry.get(name)
    if str(path).startswith(URL_PREFIXES):
        return reader, str(path)
    return reader, check_input_file(path)


def read_requests(
    path: str | Path,
    *,
    format: str | None = None,
    skip_invalid: bool = False,
    on_skip: OnSkip | None = None,
) -> Iterator[RequestEvent]:
    """Stream the LLM requests of a request trace (Mooncake, Azure, BurstGPT, Splitwise, cold paths).

    Memory stays bounded whatever the file size. With ``skip_invalid`` bad rows are passed to
    ``on_skip`` (default: a logged warning) and dropped; otherwise the first one raises
    :class:`InputError` naming file, line/row and field.
    """
    reader, p = _reader(path, format, "requests", REQUEST_READERS)
    yield from reader.read(p, skip_invalid, on_skip or default_on_skip)


def read_traces(
    path: str | Path,
    *,
    format: str | None = None,
    skip_invalid: bool = False,
    on_skip: OnSkip | None = None,
) -> Iterator[Trace]:
    """Stream the traces of a Jaeger or OTLP file (or a Jaeger query URL), each with its span tree."""
    reader, p = _reader(path, format, "traces", TRACE_READERS)
    yield from reader.read(p, skip_invalid, on_skip or default_on_skip)


def load_scenarios(path: str | Path) -> ScenarioSet:
    """Read and validate a ``scenarios.json`` (:class:`ScenarioSet`); errors name file and field."""
    p = Path(path)
    scenarios = read_json(p, ScenarioSet, expected="a scenarios document")
    if scenarios.classes:
        total = sum(c.weight for c in scenarios.classes)
        if abs(total - 1.0) > 1e-3:
            raise InputError(f"class weights sum to {total:.4f}, expected 1", file=p, field="classes.weight")
    else:
        raise InputError("no scenario classes, expected at least one", file=p, field="classes")
    return scenarios


def iter_schedule(path: str | Path) -> Iterator[ScheduleEntry]:
    """Stream a schedule JSONL (one :class:`ScheduleEntry` per line)."""
    for _, entry in iter_jsonl(path, ScheduleEntry, expected="a schedule entry"):
        yield entry


def load_schedule(path: str | Path) -> list[ScheduleEntry]:
    """Read a schedule JSONL written by ``harness traces schedule``; errors name file, line and field."""
    return list(iter_schedule(path))
