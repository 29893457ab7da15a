"""The one reader type and sniffing rule (harness.common.formats), used by the traces and corpus stages."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.common.errors import InputError
from harness.common.formats import Reader, by_priority, sniff, unrecognised


def _reader(name: str, prefix: bytes, priority: int) -> Reader[[Path, bytes], list[str]]:
    def read(path: Path, data: bytes) -> list[str]:
        return [name]

    return Reader(name, f"starts with {prefix!r}", lambda _p, head: head.startswith(prefix), read, priority)


GENERIC = _reader("json", b"{", 40)
SPECIFIC = _reader("otlp", b'{"resourceSpans"', 10)
ALSO_JSON = _reader("json-too", b"{", 40)


def test_the_lowest_priority_that_accepts_wins_registration_order_on_ties() -> None:
    readers = [GENERIC, ALSO_JSON, SPECIFIC]
    assert by_priority(readers) == [SPECIFIC, GENERIC, ALSO_JSON]
    assert sniff(readers, Path("a.json"), b'{"resourceSpans": []}') is SPECIFIC
    assert sniff(readers, Path("a.json"), b'{"data": []}') is GENERIC  # registered before json-too
    assert sniff(readers, Path("a.csv"), b"a,b\n") is None
    assert sniff([], Path("a.json"), b"{") is None


def test_a_file_no_reader_accepts_names_the_formats_in_sniffing_order(tmp_path: Path) -> None:
    err = unrecognised([GENERIC, SPECIFIC], tmp_path / "x.bin", what="log", hint="see the docs", line=1)
    assert isinstance(err, InputError)
    assert err.message == "unrecognised log; expected one of otlp, json"
    assert (err.file, err.line, err.hint) == (str(tmp_path / "x.bin"), 1, "see the docs")
    with pytest.raises(InputError, match="expected one of otlp, json"):
        raise err


def test_both_stages_register_the_one_reader_type() -> None:
    from harness.corpus.dialogues import SESSION_READERS
    from harness.corpus.logs import LOG_READERS
    from harness.traces._base import REQUEST_READERS, TRACE_READERS
    from harness.traces.api import formats

    assert formats()  # importing the API registers the trace formats
    for registry in (LOG_READERS, SESSION_READERS, REQUEST_READERS, TRACE_READERS):
        assert all(isinstance(r, Reader) for _, r in registry.items()), registry.kind


def test_the_first_line_and_object_a_jsonl_sniff_looks_at() -> None:
    from harness.common.formats import first_line, first_object

    head = b'\xef\xbb\xbf\n  {"id": "a", "text": "x"}  \r\n{"id": "b"'  # a read boundary cuts line 2
    assert first_line(head) == b'{"id": "a", "text": "x"}'
    assert first_object(head) == {"id": "a", "text": "x"}
    assert first_object(b"[1, 2]\n") is None and first_object(b"id,text\n") is None
    assert first_object(b"") is None
