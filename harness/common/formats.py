"""Input formats recognised by their content: the one reader type of the stages that read files in
several formats, and the one sniffing rule.

The traces stage reads request and distributed traces (Mooncake, Azure, Jaeger, OTLP …), the corpus
stage real request and dialogue logs (CLINC150, CrossWOZ, JSONL): each format is a :class:`Reader`
in a :class:`~harness.common.registry.Registry`, and a file whose format is not named is given to the
first reader, lowest :attr:`Reader.priority` first, whose ``sniff`` accepts its first bytes
(:func:`sniff`); a file none accepts is one :func:`unrecognised` error listing the formats. What a
reader yields is its stage's own (streamed trace items, a parsed log's list): ``read``'s parameters
and result are the reader's type parameters.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, ParamSpec, TypeVar

import orjson

from harness.common.errors import InputError

P = ParamSpec("P")
T = TypeVar("T")
R = TypeVar("R", bound="Reader[..., Any]")


@dataclass(frozen=True)  # not slots=True: calling an alias such as LogReader(...) sets __orig_class__
class Reader(Generic[P, T]):
    """One input format: how to recognise it and how to read it.

    ``sniff(path, head)`` answers whether a file is in this format from its path (for a zipped log,
    its member's name) and its first bytes; ``read`` reads it, with the parameters and the result its
    stage gives readers (``Reader[[Path, bytes], list[Utterance]]``: a request log's payload parsed
    whole; ``Reader[..., Iterator[RequestEvent]]``: a trace streamed)."""

    name: str
    description: str
    sniff: Callable[[Path, bytes], bool]
    read: Callable[P, T]
    priority: int = 50
    """Lower sniffs first: specific formats go before generic ones."""


def by_priority(readers: Iterable[R]) -> list[R]:
    """``readers`` in sniffing order: lowest :attr:`Reader.priority` first, registration order on ties."""
    return sorted(readers, key=lambda r: r.priority)


def sniff(readers: Iterable[R], path: Path, head: bytes) -> R | None:
    """The first of ``readers`` in sniffing order whose ``sniff`` accepts ``path`` and ``head``."""
    return next((r for r in by_priority(readers) if r.sniff(path, head)), None)


def first_line(head: bytes) -> bytes:
    """The first line of a file's first bytes that is not blank (a byte-order mark dropped), stripped:
    what a line-per-record format's sniff looks at."""
    return head.lstrip(b"\xef\xbb\xbf \t\r\n").split(b"\n", 1)[0].strip()


def first_object(head: bytes) -> dict[str, Any] | None:
    """:func:`first_line` as a JSON object (a JSONL format's first record), ``None`` when it is not one."""
    try:
        obj = orjson.loads(first_line(head))
    except orjson.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


def unrecognised(
    readers: Iterable[Reader[..., Any]],
    file: str | Path,
    *,
    what: str,
    hint: str,
    line: int | None = None,
) -> InputError:
    """The error for a file no reader accepts: ``unrecognised <what>; expected one of <formats>``."""
    names = ", ".join(r.name for r in by_priority(readers))
    return InputError(f"unrecognised {what}; expected one of {names}", file=file, line=line, hint=hint)
