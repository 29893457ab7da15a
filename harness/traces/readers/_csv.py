"""CSV plumbing shared by the request-trace readers (Azure, BurstGPT, Splitwise).

Rows are streamed through :func:`csv.reader` over lines decoded one at a time, so CRLF files, a
missing final newline and invalid UTF-8 are all handled without loading the file. Row numbers count
data rows from 1 (the header is row 0), as :class:`~harness.common.errors.HarnessError` documents.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterator, Sequence
from pathlib import Path

from harness.common.errors import InputError
from harness.traces._base import OnSkip, iter_lines


def header_of(head: bytes) -> list[str]:
    """The header cells of a CSV head (first line), stripped and lower-cased; ``[]`` if not CSV-like."""
    text = head.lstrip(b"\xef\xbb\xbf").split(b"\n", 1)[0].decode("utf-8", "replace").strip()
    if "," not in text or text.startswith(("{", "[")):
        return []
    return [c.strip().strip('"').lower() for c in next(csv.reader([text]))]


def iter_rows(
    path: Path, required: Sequence[str], skip: bool, on_skip: OnSkip
) -> Iterator[tuple[int, dict[str, str]]]:
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
            err = InputError(f"expected {width} columns, found {len(cells)}", file=path, line=row)
            if not skip:
                raise err
            on_skip(err)
            continue
        yield row, dict(zip(header, cells, strict=True))


def int_cell(path: Path, row: int, cells: dict[str, str], column: str, *, minimum: int = 0) -> int:
    text = cells[column].strip()
    try:
        value = int(text) if text.lstrip("-").isdigit() else int(float(text))
    except ValueError:
        raise InputError(f"expected an integer, got {text!r}", file=path, line=row, field=column) from None
    if value < minimum:
        raise InputError(f"expected an integer ≥ {minimum}, got {value}", file=path, line=row, field=column)
    return value


def float_cell(path: Path, row: int, cells: dict[str, str], column: str) -> float:
    text = cells[column].strip()
    try:
        value = float(text)
    except ValueError:
        raise InputError(f"expected a number, got {text!r}", file=path, line=row, field=column) from None
    if math.isnan(value) or value < 0:
        raise InputError(f"expected a number ≥ 0, got {text!r}", file=path, line=row, field=column)
    return value
