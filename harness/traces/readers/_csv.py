"""CSV plumbing shared by the request-trace readers (Azure, BurstGPT, Splitwise).

A reader states its format as a :class:`CsvRequests` (which columns hold the arrival time and the
token counts, how to read the time, what else of a row becomes part of the event) and registers it
with :func:`register_csv`; header sniffing, row streaming, cell errors, ``--skip-invalid`` and the
arrival-order check are done here once.

Rows are streamed through :func:`csv.reader` over lines decoded one at a time, so CRLF files, a
missing final newline and invalid UTF-8 are all handled without loading the file. Row numbers count
data rows from 1 (the header is row 0), as :class:`~harness.common.errors.HarnessError` documents.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.common.errors import InputError
from harness.common.formats import Reader
from harness.traces._base import (
    REQUEST_READERS,
    ArrivalClock,
    OnSkip,
    convert_rows,
    iter_lines,
    reject,
)
from harness.traces.model import RequestEvent

Cells = dict[str, str]


def header_of(head: bytes) -> list[str]:
    """The header cells of a CSV head (first line), stripped and lower-cased; ``[]`` if not CSV-like."""
    text = head.lstrip(b"\xef\xbb\xbf").split(b"\n", 1)[0].decode("utf-8", "replace").strip()
    if "," not in text or text.startswith(("{", "[")):
        return []
    return [c.strip().strip('"').lower() for c in next(csv.reader([text]))]


def iter_rows(
    path: Path, required: Sequence[str], skip: bool, on_skip: OnSkip
) -> Iterator[tuple[int, Cells]]:
    """(row number, {lower-cased column: cell}) per data row; checks that ``required`` columns exist."""
    header_at = 0

    def as_row(err: InputError) -> InputError:
        # iter_lines counts file lines; CSV errors count data rows (header excluded).
        if err.line is not None:
            err.line -= header_at
        return err

    raw = iter_lines(path, skip, lambda err: on_skip(as_row(err)))

    def numbered() -> Iterator[tuple[int, str]]:
        while True:
            try:
                item = next(raw)
            except StopIteration:
                return
            except InputError as err:
                raise as_row(err) from None
            yield item

    lines = numbered()
    header: list[str] | None = None
    for n, text in lines:
        if text.strip():
            header = [c.strip().lower() for c in next(csv.reader([text]))]
            header_at = n
            break
    if header is None:
        raise InputError("no header row, expected a CSV file with a header", file=path, line=1)
    missing = [c for c in required if c not in header]
    if missing:
        raise InputError(
            f"missing column(s) {', '.join(missing)}; found {', '.join(header)}",
            file=path,
            line=0,
            field=missing[0],
        )
    width = len(header)
    # One csv.reader over the remaining lines; the row number is the file line minus the header's,
    # so it agrees with the numbers in errors raised while decoding lines.
    numbers: list[int] = [header_at]

    def texts() -> Iterator[str]:
        for n, text in lines:
            numbers[0] = n
            yield text

    for cells in csv.reader(texts()):
        if not cells or (len(cells) == 1 and not cells[0].strip()):
            continue
        row = numbers[0] - header_at
        if len(cells) != width:
            reject(
                InputError(f"expected {width} columns, found {len(cells)}", file=path, line=row),
                skip,
                on_skip,
            )
            continue
        yield row, dict(zip(header, cells, strict=True))


def int_cell(path: Path, row: int, cells: Cells, column: str, *, minimum: int = 0) -> int:
    text = cells[column].strip()
    try:
        value = int(text) if text.lstrip("-").isdigit() else int(float(text))
    except ValueError:
        raise InputError(f"expected an integer, got {text!r}", file=path, line=row, field=column) from None
    if value < minimum:
        raise InputError(f"expected an integer ≥ {minimum}, got {value}", file=path, line=row, field=column)
    return value


def float_cell(path: Path, row: int, cells: Cells, column: str) -> float:
    text = cells[column].strip()
    try:
        value = float(text)
    except ValueError:
        raise InputError(f"expected a number, got {text!r}", file=path, line=row, field=column) from None
    if math.isnan(value) or value < 0:
        raise InputError(f"expected a number ≥ 0, got {text!r}", file=path, line=row, field=column)
    return value


@dataclass(frozen=True, slots=True)
class CsvRequests:
    """A CSV request-trace format, stated as its columns and conversions.

    Column names are the lower-cased header cells. ``time`` is read with ``parse_time`` (default: a
    number ≥ 0, :func:`float_cell`) in units of ``per_second`` per second; rows must come in arrival
    order, and a row before the first is reported against ``time_field`` (the column as the format's
    documentation spells it). ``extras(cells, output_tokens)`` returns further
    :class:`RequestEvent` fields (tags, tenant, operation, failed).
    """

    name: str
    description: str
    time: str
    input: str
    output: str
    time_field: str
    what: str = "timestamp"
    per_second: float = 1.0
    parse_time: Callable[[Path, int, Cells], float] | None = None
    extras: Callable[[Cells, int], dict[str, Any]] | None = None
    priority: int = 20

    @property
    def columns(self) -> tuple[str, str, str]:
        return (self.time, self.input, self.output)

    def sniff(self, path: Path, head: bytes) -> bool:
        cols = header_of(head)
        return all(c in cols for c in self.columns)

    def read(self, path: Path, skip: bool, on_skip: OnSkip) -> Iterator[RequestEvent]:
        clock = ArrivalClock(path, self.time_field, what=self.what, per_second=self.per_second)
        source = f"{self.name}:{path}"

        def convert(row: int, cells: Cells) -> tuple[Cells, float, int, int]:
            if self.parse_time is None:
                ts = float_cell(path, row, cells, self.time)
            else:
                ts = self.parse_time(path, row, cells)
            inp = int_cell(path, row, cells, self.input)
            out = int_cell(path, row, cells, self.output)
            return cells, clock.offset(row, ts), inp, out

        rows = iter_rows(path, self.columns, skip, on_skip)
        for row, (cells, arrival_s, inp, out) in convert_rows(rows, convert, skip, on_skip):
            yield RequestEvent(
                arrival_s=arrival_s,
                input_tokens=inp,
                output_tokens=out,
                source=source,
                line=row,
                **(self.extras(cells, out) if self.extras else {}),
            )


def register_csv(fmt: CsvRequests) -> CsvRequests:
    """Register ``fmt`` in :data:`REQUEST_READERS` under its name."""
    REQUEST_READERS.register(fmt.name)(Reader(fmt.name, fmt.description, fmt.sniff, fmt.read, fmt.priority))
    return fmt
