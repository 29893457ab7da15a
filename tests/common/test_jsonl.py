"""JSONL reading shared by every stage: ``iter_jsonl`` for files, ``parse_jsonl_line`` for bodies.

Expected values come from the raw text written in each test (line numbers counted by hand from the
lines we wrote, values from ``json.loads``), never from a run of the code under test.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from harness.common.errors import InputError
from harness.common.io import iter_jsonl, jsonl_lines, parse_jsonl_line, read_json, validation_input_error


class Msg(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "user", "assistant"]
    content: str


class Req(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str
    messages: list[Msg] = Field(min_length=1)
    n: int = Field(default=1, ge=1)


def _write(tmp_path: Path, lines: list[str], name: str = "in.jsonl") -> Path:
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return p


def test_iter_jsonl_yields_validated_models_with_file_line_numbers(tmp_path: Path) -> None:
    rows = [
        {"id": "a", "messages": [{"role": "user", "content": "hi"}]},
        {"id": "b", "messages": [{"role": "system", "content": "be brief"}], "n": 3},
    ]
    lines = [json.dumps(rows[0]), "", "   ", json.dumps(rows[1])]
    p = _write(tmp_path, lines)
    got = list(iter_jsonl(p, Req))
    # Blank lines are skipped but still counted: the second record is on file line 4.
    assert [n for n, _ in got] == [1, 4]
    assert [r.model_dump(exclude_defaults=True) for _, r in got] == rows


def test_iter_jsonl_without_model_yields_objects(tmp_path: Path) -> None:
    lines = ['{"prompt": "x", "max_tokens": 2}', '{"messages": []}']
    p = _write(tmp_path, lines)
    assert list(iter_jsonl(p)) == [(1, json.loads(lines[0])), (2, json.loads(lines[1]))]


def test_iter_jsonl_ignores_a_byte_order_mark_and_crlf(tmp_path: Path) -> None:
    p = tmp_path / "bom.jsonl"
    p.write_bytes(b'\xef\xbb\xbf{"id": "a", "messages": [{"role": "user", "content": "x"}]}\r\n')
    [(n, rec)] = list(iter_jsonl(p, Req))
    assert n == 1 and rec.id == "a"


def test_validation_error_names_file_line_and_dotted_field(tmp_path: Path) -> None:
    good = '{"id": "a", "messages": [{"role": "user", "content": "hi"}]}'
    bad = '{"id": "b", "messages": [{"role": "user", "content": "ok"}, {"role": "robot", "content": "x"}]}'
    p = _write(tmp_path, [good, good.replace('"a"', '"c"'), bad])
    with pytest.raises(InputError) as info:
        list(iter_jsonl(p, Req, expected="a request"))
    err = info.value
    assert (err.file, err.line, err.field) == (str(p), 3, "messages.1.role")
    assert err.message.endswith(", expected a request")
    assert str(err).startswith(f"{p}:3: field 'messages.1.role': ")


def test_extra_field_is_named(tmp_path: Path) -> None:
    p = _write(tmp_path, ['{"id": "a", "messages": [{"role": "user", "content": "x"}], "max_tokns": 2}'])
    with pytest.raises(InputError) as info:
        list(iter_jsonl(p, Req))
    assert info.value.line == 1 and info.value.field == "max_tokns"


def test_invalid_json_names_line_without_field(tmp_path: Path) -> None:
    p = _write(tmp_path, ['{"prompt": "x"}', '{"prompt": "unterminated'])
    with pytest.raises(InputError) as info:
        list(iter_jsonl(p))
    err = info.value
    assert (err.file, err.line, err.field) == (str(p), 2, None)
    assert err.message.startswith("invalid JSON (")


def test_non_object_line_is_rejected_without_model(tmp_path: Path) -> None:
    p = _write(tmp_path, ['{"prompt": "x"}', "[1, 2]"])
    with pytest.raises(InputError) as info:
        list(iter_jsonl(p, expected="an OpenAI request body"))
    assert info.value.line == 2
    assert info.value.message == "not a JSON object, expected an OpenAI request body"


def test_invalid_utf8_is_located_to_its_line(tmp_path: Path) -> None:
    p = tmp_path / "latin1.jsonl"
    p.write_bytes(b'{"prompt": "ok"}\n{"prompt": "caf\xe9"}\n')
    with pytest.raises(InputError) as info:
        list(iter_jsonl(p))
    assert info.value.line == 2 and info.value.message.startswith("invalid JSON (")


def test_missing_and_empty_files_are_input_errors(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file"):
        list(iter_jsonl(tmp_path / "absent.jsonl"))
    (tmp_path / "empty.jsonl").write_bytes(b"")
    with pytest.raises(InputError, match="file is empty"):
        list(iter_jsonl(tmp_path / "empty.jsonl"))


def test_iter_jsonl_streams_and_stops_at_first_bad_line(tmp_path: Path) -> None:
    p = _write(tmp_path, ['{"a": 1}', '{"a": 2}', "not json", '{"a": 4}'])
    it = iter_jsonl(p)
    assert next(it) == (1, {"a": 1})  # the bad line has not been read yet
    assert next(it) == (2, {"a": 2})
    with pytest.raises(InputError) as info:
        next(it)
    assert info.value.line == 3


def test_parse_jsonl_line_for_in_memory_bodies() -> None:
    body = b'{"id": "x", "messages": [{"role": "assistant", "content": "y"}]}'
    rec = parse_jsonl_line(body, 7, Req)
    assert rec.messages[0].role == "assistant"
    assert parse_jsonl_line(body.decode(), 7) == json.loads(body)
    with pytest.raises(InputError) as info:
        parse_jsonl_line(b'{"id": "x", "messages": []}', 7, Req)
    # No file: the location is the line and field only.
    assert (info.value.file, info.value.line, info.value.field) == (None, 7, "messages")
    assert str(info.value).startswith("line 7: field 'messages': ")


def test_validation_input_error_for_whole_documents() -> None:
    with pytest.raises(ValidationError) as info:
        Req.model_validate({"id": 1, "messages": [{"role": "user", "content": "x"}]})
    err = validation_input_error(info.value, file="doc.json", expected="a request")
    assert (err.file, err.line, err.field) == ("doc.json", None, "id")
    assert err.message.endswith(", expected a request")


def test_read_json_a_whole_document(tmp_path: Path) -> None:
    """A JSON document file: valid, a syntax error on line 3, a bad field, not there at all."""
    good = tmp_path / "good.json"
    good.write_text('{"id": "a", "messages": [{"role": "user", "content": "hi"}]}', encoding="utf-8")
    assert read_json(good, Req, expected="a request").messages[0].content == "hi"
    broken = tmp_path / "broken.json"
    broken.write_text('{\n  "id": "a",\n  "messages": [,]\n}\n', encoding="utf-8")
    with pytest.raises(InputError) as exc:
        read_json(broken, Req, expected="a request")
    assert exc.value.file == str(broken) and exc.value.line == 3
    assert "invalid JSON" in str(exc.value) and "expected a request" in str(exc.value)
    bad = tmp_path / "bad.json"
    bad.write_text('{"id": "a", "messages": [{"role": "robot", "content": "hi"}]}', encoding="utf-8")
    with pytest.raises(InputError) as exc:
        read_json(bad, Req, expected="a request")
    assert exc.value.field == "messages.0.role" and exc.value.file == str(bad)
    with pytest.raises(InputError):
        read_json(tmp_path / "missing.json", Req, expected="a request")


def test_an_empty_file_is_no_rows_only_when_allowed(tmp_path: Path) -> None:
    """``records.jsonl`` of a run that sent nothing, ``server_metrics.jsonl`` of a run whose target
    never answered: empty, and readable as no rows; other inputs must hold something."""
    p = tmp_path / "empty.jsonl"
    p.write_bytes(b"")
    assert list(iter_jsonl(p, allow_empty=True)) == []
    with pytest.raises(InputError, match="file is empty"):
        list(iter_jsonl(p))


def test_nonfinite_literals_are_read_only_when_asked(tmp_path: Path) -> None:
    """The NaN rule of ``records.jsonl``: Python's json writes ``NaN``; strict JSON refuses it."""
    p = _write(tmp_path, ['{"a": NaN, "b": -Infinity}'])
    [(n, row)] = list(iter_jsonl(p, nonfinite=True))
    assert n == 1 and math.isnan(row["a"]) and row["b"] == -math.inf
    with pytest.raises(InputError) as info:
        list(iter_jsonl(p))
    assert info.value.line == 1 and info.value.message.startswith("invalid JSON (")
    with pytest.raises(InputError, match="invalid JSON"):  # not JSON either way
        parse_jsonl_line(b"{nope", 4, nonfinite=True)


@dataclass
class Point:
    x: float
    label: str = ""


def test_a_type_adapter_validates_a_dataclass_row(tmp_path: Path) -> None:
    p = _write(tmp_path, ['{"x": 1.5}', '{"x": "far"}'])
    rows = iter_jsonl(p, TypeAdapter(Point), expected="a point")
    assert next(rows) == (1, Point(1.5))
    with pytest.raises(InputError) as info:
        next(rows)
    assert (info.value.line, info.value.field) == (2, "x")
    assert info.value.message.endswith(", expected a point")


def test_a_line_that_is_not_an_object_is_named_so_with_a_model_too(tmp_path: Path) -> None:
    p = _write(tmp_path, ["[1, 2]"])
    with pytest.raises(InputError) as info:
        list(iter_jsonl(p, Req, expected="a request"))
    assert info.value.line == 1 and info.value.message == "not a JSON object, expected a request"


def test_jsonl_lines_of_a_payload_in_memory_keep_the_file_numbers() -> None:
    data = b'\xef\xbb\xbf{"a": 1}\r\n\n  \n{"a": 2}'
    assert list(jsonl_lines(data.splitlines())) == [(1, b'{"a": 1}'), (4, b'{"a": 2}')]
    assert list(jsonl_lines([])) == []
