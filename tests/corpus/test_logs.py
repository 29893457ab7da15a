"""Request-log readers: formats detected from content, real files read as shipped, bad files named."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import pytest

from harness.common.errors import InputError
from harness.corpus.logs import LOG_READERS, detect_log_format, read_log, read_logs

from .conftest import FIXTURES

CLINC = FIXTURES / "clinc150_sample.json"
CROSSWOZ = FIXTURES / "crosswoz_sample.json.zip"
JSONL = FIXTURES / "fewshot_log.jsonl"


def _crosswoz_raw() -> dict:
    with zipfile.ZipFile(CROSSWOZ) as z:
        (name,) = z.namelist()
        return json.loads(z.read(name))


@pytest.mark.parametrize(("path", "fmt"), [(CLINC, "clinc150"), (CROSSWOZ, "crosswoz"), (JSONL, "jsonl")])
def test_formats_are_detected(path: Path, fmt: str) -> None:
    assert detect_log_format(path) == fmt
    assert fmt in LOG_READERS


def test_clinc_rows_match_the_raw_file() -> None:
    raw = json.loads(CLINC.read_text())
    domains = json.loads(
        (Path(__file__).resolve().parents[2] / "harness/corpus/data/clinc150_domains.json").read_text()
    )
    of = {i: d for d, intents in domains.items() for i in intents}
    expected = [(t, i, of[i]) for split in ("train", "val", "test") for t, i in raw[split] if i != "oos"]
    got = read_log(CLINC)
    assert [(u.text, u.intent, u.domain) for u in got] == expected
    assert {u.lang for u in got} == {"en"} and len(got) == 750


def test_crosswoz_user_turns_with_acts() -> None:
    raw = _crosswoz_raw()
    got = read_log(CROSSWOZ)
    asking = [
        m["content"]
        for d in raw.values()
        for m in d["messages"]
        if m["role"] == "usr" and any(a[0] != "General" for a in m["dialog_act"])
    ]
    assert [u.text for u in got] == asking  # every request turn, greetings and thanks left out
    assert {u.lang for u in got} == {"zh"}
    assert {u.domain for u in got} <= {"hotel", "restaurant", "attraction", "metro", "taxi"}
    # Intent from the acts: a turn that requests only a venue's phone number asks for the phone.
    for d in raw.values():
        for t, m in enumerate(d["messages"]):
            acts = [a for a in m["dialog_act"] if a[0] != "General"]
            if m["role"] == "usr" and acts and all(a[0] == "Request" and a[2] == "电话" for a in acts):
                u = next(x for x in got if x.where.endswith(f"messages[{t}]") and x.text == m["content"])
                assert u.intent == "ask_phone"


def test_several_logs_keep_ids_apart() -> None:
    both = read_logs([CLINC, CROSSWOZ])
    assert len(both) == len(read_log(CLINC)) + len(read_log(CROSSWOZ))
    assert len({u.id for u in both}) == len(both)


def _zip(tmp: Path, members: dict[str, bytes]) -> Path:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    p = tmp / "log.json.zip"
    p.write_bytes(buf.getvalue())
    return p


def test_bad_files_are_one_clear_error(tmp_path: Path) -> None:
    garbage = tmp_path / "g.json"
    garbage.write_text("hello")
    with pytest.raises(InputError, match="unrecognised request log"):
        read_log(garbage)
    two = _zip(tmp_path, {"a.json": b"{}", "b.json": b"{}"})
    with pytest.raises(InputError, match="exactly one"):
        read_log(two)
    bad_acts = tmp_path / "x.json"
    bad_acts.write_text(
        json.dumps(
            {
                "7": {
                    "sys-usr": [1, 2],
                    "messages": [{"role": "usr", "content": "你好", "dialog_act": [["Inform"]]}],
                }
            }
        )
    )
    with pytest.raises(InputError) as info:
        read_log(bad_acts)
    assert info.value.field == '"7".messages[0].dialog_act'
    bad_row = tmp_path / "c.json"
    bad_row.write_text(json.dumps({"train": [["ok", "balance"], ["no intent"]]}))
    with pytest.raises(InputError) as info2:
        read_log(bad_row, format="clinc150")
    assert info2.value.field == "train[1]"
    bad_line = tmp_path / "log.jsonl"
    bad_line.write_text(
        '{"id": "a", "text": "hi", "confidence": 0.5}\n{"id": "b", "text": "x", "confidence": 7}\n'
    )
    with pytest.raises(InputError) as info3:
        read_log(bad_line)
    assert info3.value.line == 2 and info3.value.field == "confidence"
    missing = tmp_path / "none.json"
    with pytest.raises(InputError, match="no such file"):
        read_log(missing)


def test_request_and_dialogue_logs_share_one_reader_type(tmp_path: Path) -> None:
    from harness.common.registry import Registry
    from harness.corpus.dialogues import SESSION_READERS, detect_session_format, read_dialogues
    from harness.corpus.logs import Reader, detect_format, read_with

    assert all(isinstance(r, Reader) for _, r in LOG_READERS.items())
    assert all(isinstance(r, Reader) for _, r in SESSION_READERS.items())
    # The same CrossWOZ file: utterances by one registry, dialogues by the other.
    assert detect_session_format(CROSSWOZ) == "crosswoz"
    assert read_dialogues([CROSSWOZ])[0].turns
    # A registry of any item type: the lowest priority whose sniff accepts wins; none is an error.
    texts: Registry[Reader[str]] = Registry("test format")
    texts.register("any")(Reader("any", "", lambda name, head: True, lambda p, d: ["any"], 90))
    texts.register("hash")(Reader("hash", "", lambda name, head: head.startswith(b"#"), lambda p, d: [], 10))
    f = tmp_path / "x.txt"
    f.write_bytes(b"# a comment")
    assert detect_format(texts, f, what="text", hint="") == "hash"
    with pytest.raises(InputError, match="nothing in this hash file"):
        read_with(texts, f, None, what="text", hint="", empty="nothing in this {fmt} file")
    assert read_with(texts, f, "any", what="text", hint="", empty="") == ["any"]
    only_hash: Registry[Reader[str]] = Registry("test format")
    only_hash.register("hash")(texts.get("hash"))
    f.write_bytes(b"plain")
    with pytest.raises(InputError, match="unrecognised text; expected one of hash"):
        detect_format(only_hash, f, what="text", hint="")
