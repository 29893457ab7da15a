"""Readers for real request logs, the few-shot pool's and the queries' source (``--fewshot FILE``).

Three formats are registered, detected from content like the trace formats (a reader's ``sniff``
sees the file name and the first bytes, after unzipping a ``.zip``):

* ``jsonl`` — the harness's own log: one :class:`~harness.corpus.model.FewShotLogEntry` per line
  (``id``, ``text``, ``confidence``, optional ``domain``, ``intent``, ``lang``, ``response``, ``ts``);
* ``clinc150`` — CLINC150's ``data_full.json`` (or any file of that shape): splits of
  ``[text, intent]`` rows, out-of-scope rows (intent ``oos``) left out. Domains come from a
  ``domains.json`` beside the file when there is one, else from the copy bundled in
  ``harness/corpus/data`` (CC-BY-3.0);
* ``crosswoz`` — CrossWOZ dialogues (``train.json`` … or ``val.json.zip`` as shipped): every user
  turn that asks or tells something (turns with only greetings and thanks are left out), with its
  domain and intent from the turn's dialog acts, the constraints the user has given so far in that
  domain, and the venue the conversation is about (the last one either side named).

Each yields :class:`Utterance` values. Bad files are one :class:`InputError` naming the file, the
line (JSONL) or the JSON path (``"10312".messages[4].dialog_act``), and the field.
"""

from __future__ import annotations

import io
import re
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import orjson

from harness.common.errors import InputError
from harness.common.formats import Reader, first_object, sniff, unrecognised
from harness.common.io import iter_jsonl, jsonl_lines, parse_jsonl_line
from harness.common.registry import Registry
from harness.corpus.model import FewShotLogEntry

DATA_DIR = Path(__file__).resolve().parent / "data"
_CJK = re.compile(r"[\u3400-\u9fff]")
SNIFF_BYTES = 4096


@dataclass(frozen=True, slots=True)
class Utterance:
    """One real user request from a log: what the few-shot pool and the queries are drawn from."""

    id: str
    text: str
    lang: str
    domain: str | None
    intent: str | None
    source: str
    """``format:file`` it was read from."""
    confidence: float | None = None
    """From the log when it has one; otherwise filled by :func:`harness.corpus.fewshot.fill_confidence`."""
    response: str | None = None
    slots: tuple[tuple[str, str], ...] = ()
    """Constraints the user has stated (CrossWOZ: this turn's and earlier turns' ``Inform`` acts)."""
    focus: str | None = None
    """The venue the request is about when the dialogue names one (CrossWOZ)."""
    where: str | None = None
    """Where in the file: ``line 12`` or a JSON path."""
    history: tuple[tuple[str, str], ...] = ()
    """The dialogue's earlier turns, oldest first, as (``user`` | ``assistant``, text) (CrossWOZ):
    the real conversation a request continues, used to reach a target prompt length."""


def detect_lang(text: str) -> str:
    """``zh`` when at least a fifth of the characters are CJK ideographs, else ``en``."""
    letters = [c for c in text if not c.isspace()]
    if not letters:
        return "en"
    return "zh" if sum(1 for c in letters if _CJK.match(c)) * 5 >= len(letters) else "en"


T = TypeVar("T")

CorpusReader = Reader[[Path, bytes], list[T]]
"""A log format of the corpus stage yielding ``T`` items (request logs: :class:`Utterance`; dialogue
logs: :class:`harness.corpus.dialogues.Dialogue`), the one reader type
(:class:`harness.common.formats.Reader`): ``sniff(name, head)`` sees the file's or its zip member's
name and the first :data:`SNIFF_BYTES`, ``read(path, data)`` parses the whole payload."""
LogReader = CorpusReader[Utterance]
"""A request log format (:data:`LOG_READERS`)."""

LOG_READERS: Registry[LogReader] = Registry("request log format")


def _payload(path: Path) -> tuple[str, bytes]:
    """(member name, bytes) of a log: the file itself, or the one JSON/JSONL file inside a zip."""
    if not path.exists():
        raise InputError("no such file", file=path)
    if path.is_dir():
        raise InputError("is a directory, expected a request log file", file=path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror}", file=path) from None
    if not raw:
        raise InputError("file is empty", file=path)
    if raw[:4] != b"PK\x03\x04":
        return path.name, raw
    try:
        with zipfile.ZipFile(io.BytesIO(raw)) as z:
            members = [m for m in z.namelist() if m.endswith((".json", ".jsonl")) and not m.startswith("__")]
            if len(members) != 1:
                raise InputError(
                    f"a zipped log must hold exactly one .json or .jsonl file, found {len(members)}",
                    file=path,
                )
            return members[0], z.read(members[0])
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError) as exc:
        raise InputError(f"not a readable zip archive ({exc})", file=path) from None


def _sniffed(
    readers: Registry[CorpusReader[T]], p: Path, name: str, data: bytes, *, what: str, hint: str
) -> str:
    """The first reader by priority whose sniff accepts this payload; :class:`InputError` if none does."""
    every = [r for _, r in readers.items()]
    found = sniff(every, Path(name), data[:SNIFF_BYTES])
    if found is None:
        raise unrecognised(every, p, what=what, hint=hint)
    return found.name


def detect_format(readers: Registry[CorpusReader[T]], path: str | Path, *, what: str, hint: str) -> str:
    """The format in ``readers`` of the file at ``path``, from its content (the first reader by
    priority whose sniff accepts it); :class:`InputError` ``unrecognised <what>`` if none does."""
    p = Path(path)
    name, data = _payload(p)
    return _sniffed(readers, p, name, data, what=what, hint=hint)


def read_with(
    readers: Registry[CorpusReader[T]],
    path: str | Path,
    format: str | None,
    *,
    what: str,
    hint: str,
    empty: str,
) -> list[T]:
    """Every item of the file at ``path`` by the reader of ``format`` (detected unless given, see
    :func:`detect_format`; the file is read once either way); an :class:`InputError` ``<empty>``
    (``{fmt}`` filled in) when it has none."""
    p = Path(path)
    member, data = _payload(p)
    name = format or _sniffed(readers, p, member, data, what=what, hint=hint)
    out = readers.get(name).read(p, data)
    if not out:
        raise InputError(empty.format(fmt=name), file=p)
    return out


def detect_log_format(path: str | Path) -> str:
    """The registered format of a request log, from its content; :class:`InputError` if none fits."""
    return detect_format(LOG_READERS, path, what="request log", hint="see docs/corpus.md (request logs)")


def read_log(path: str | Path, format: str | None = None) -> list[Utterance]:
    """All requests of one log file (format detected unless given); at least one, or an InputError."""
    return read_with(
        LOG_READERS,
        path,
        format,
        what="request log",
        hint="see docs/corpus.md (request logs)",
        empty="no user requests in this {fmt} log",
    )


def read_logs(paths: list[Path]) -> list[Utterance]:
    """Every request of every log, in the order given; ids are prefixed by the file's position."""
    out: list[Utterance] = []
    for k, p in enumerate(paths):
        for u in read_log(p):
            out.append(_with_id(u, f"{k}:{u.id}") if len(paths) > 1 else u)
    return out


def _with_id(u: Utterance, new_id: str) -> Utterance:
    return replace(u, id=new_id)


def _json_doc(path: Path, data: bytes, expected: str) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise InputError(
            f"invalid JSON ({exc.msg}), expected {expected}", file=path, line=exc.lineno
        ) from None


# --------------------------------------------------------------------------- jsonl


def _sniff_jsonl(name: Path, head: bytes) -> bool:
    obj = first_object(head)
    return obj is not None and "text" in obj and "id" in obj


def _read_jsonl(path: Path, data: bytes) -> list[Utterance]:
    out: list[Utterance] = []
    seen: set[str] = set()
    src = f"jsonl:{path.name}"
    if path.suffix == ".zip":  # iter_jsonl reads files; a zipped JSONL's lines are already in memory
        rows = [
            (n, parse_jsonl_line(line, n, FewShotLogEntry, file=path, expected="a request log line"))
            for n, line in jsonl_lines(data.splitlines())
        ]
    else:
        rows = list(iter_jsonl(path, FewShotLogEntry, expected="a request log line"))
    for lineno, e in rows:
        if e.id in seen:
            raise InputError(f"duplicate id {e.id!r}", file=path, line=lineno, field="id")
        seen.add(e.id)
        lang = e.lang or detect_lang(e.text)
        if lang not in ("en", "zh"):
            raise InputError(
                f"language {lang!r} is not supported; use en or zh", file=path, line=lineno, field="lang"
            )
        out.append(
            Utterance(
                id=e.id,
                text=e.text,
                lang=lang,
                domain=e.domain,
                intent=e.intent,
                source=src,
                confidence=e.confidence,
                response=e.response,
                where=f"line {lineno}",
            )
        )
    return out


# --------------------------------------------------------------------------- CLINC150

CLINC_SPLITS = ("train", "val", "test")


def _sniff_clinc(name: Path, head: bytes) -> bool:
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    return (
        text.startswith(b"{") and re.search(rb'"(oos_)?(train|val|test)"\s*:\s*\[\s*\[\s*"', text) is not None
    )


def clinc_domains(path: Path) -> dict[str, str]:
    """Intent → domain: ``domains.json`` beside the data file, else the bundled copy."""
    beside = path.parent / "domains.json"
    src = beside if beside.is_file() else DATA_DIR / "clinc150_domains.json"
    doc = _json_doc(src, src.read_bytes(), "CLINC150's domains.json (domain → intents)")
    if not isinstance(doc, dict):
        raise InputError("expected an object of domain → list of intents", file=src)
    return {str(i): str(d) for d, intents in doc.items() for i in intents}


def _read_clinc(path: Path, data: bytes) -> list[Utterance]:
    doc = _json_doc(path, data, "CLINC150 data (split → [text, intent] rows)")
    if not isinstance(doc, dict):
        raise InputError("expected an object of split → [text, intent] rows", file=path)
    domains = clinc_domains(path)
    out: list[Utterance] = []
    src = f"clinc150:{path.name}"
    for split in CLINC_SPLITS:
        rows = doc.get(split, [])
        if not isinstance(rows, list):
            raise InputError("expected a list of [text, intent] rows", file=path, field=split)
        for k, row in enumerate(rows):
            where = f"{split}[{k}]"
            if not (isinstance(row, list) and len(row) == 2 and all(isinstance(x, str) for x in row)):
                raise InputError("expected a [text, intent] pair of strings", file=path, field=where)
            text, intent = row[0].strip(), row[1]
            if not text or intent == "oos":
                continue
            out.append(
                Utterance(
                    id=f"{split}-{k}",
                    text=text,
                    lang=detect_lang(text),
                    domain=domains.get(intent),
                    intent=intent,
                    source=src,
                    where=where,
                )
            )
    return out


# --------------------------------------------------------------------------- CrossWOZ

CROSSWOZ_DOMAINS = {
    "酒店": "hotel",
    "餐馆": "restaurant",
    "景点": "attraction",
    "地铁": "metro",
    "出租": "taxi",
}
CROSSWOZ_SLOTS = {
    "名称": "name",
    "地址": "address",
    "电话": "phone",
    "评分": "rating",
    "价格": "price",
    "人均消费": "price_per_person",
    "推荐菜": "dish",
    "周边景点": "nearby_attractions",
    "周边餐馆": "nearby_restaurants",
    "周边酒店": "nearby_hotels",
    "门票": "ticket",
    "游玩时间": "visit_duration",
    "营业时间": "opening_hours",
    "酒店类型": "hotel_type",
    "酒店设施": "facilities",
    "出发地": "origin",
    "目的地": "destination",
    "车型": "car_type",
    "车牌": "plate",
    "出发地附近地铁站": "origin_station",
    "目的地附近地铁站": "destination_station",
    "源领域": "near",
    "地铁": "subway",
}


def _sniff_crosswoz(name: Path, head: bytes) -> bool:
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    return text.startswith(b"{") and (
        b'"sys-usr"' in head or (b'"messages"' in head and b'"dialog_act"' in head)
    )


def crosswoz_intent(acts: list[tuple[str, str, str, str]]) -> str:
    """The turn's intent from its dialog acts: ``find`` (asks for a venue by constraints, or only
    states constraints), ``find_nearby`` (a venue near another), or ``ask_<slot>`` (asks about one)."""
    requested = [
        CROSSWOZ_SLOTS.get(slot.split("-")[0], "other") for kind, _, slot, _ in acts if kind == "Request"
    ]
    if any(kind == "Select" for kind, *_ in acts):
        return "find_nearby"
    if not requested or "name" in requested:
        return "find"
    return "ask_" + requested[0]


Act = tuple[str, str, str, str]
"""A CrossWOZ dialog act: ``[intent, domain, slot, value]``."""


@dataclass(frozen=True, slots=True)
class CrossWozMessage:
    """One message of a CrossWOZ dialogue, validated (:func:`iter_crosswoz`)."""

    index: int
    where: str
    """``"<dialogue id>".messages[<index>]``: where it is in the file, for errors and provenance."""
    role: str
    """``usr``, ``sys`` (others are passed on and ignored by both readers)."""
    text: str
    """The content, stripped."""
    real: tuple[Act, ...]
    """Its acts in the known domains (``General`` greetings and thanks left out)."""


def iter_crosswoz(path: Path, data: bytes) -> Iterator[tuple[str, list[CrossWozMessage]]]:
    """Each dialogue of a CrossWOZ file: its id and its messages, validated here once for both of
    its readers (the utterances below, the dialogues of :mod:`harness.corpus.dialogues`)."""
    doc = _json_doc(path, data, "CrossWOZ dialogues (id → dialogue)")
    if not isinstance(doc, dict):
        raise InputError("expected an object of dialogue id → dialogue", file=path)
    for did, dialogue in doc.items():
        msgs = dialogue.get("messages") if isinstance(dialogue, dict) else None
        if not isinstance(msgs, list):
            raise InputError(
                "expected a dialogue with a 'messages' list", file=path, field=f'"{did}".messages'
            )
        out: list[CrossWozMessage] = []
        for t, m in enumerate(msgs):
            where = f'"{did}".messages[{t}]'
            if not isinstance(m, dict) or not isinstance(m.get("content"), str):
                raise InputError("expected a turn with 'content' and 'role'", file=path, field=where)
            acts_raw = m.get("dialog_act", [])
            if not isinstance(acts_raw, list) or not all(
                isinstance(a, list) and len(a) == 4 and all(isinstance(x, str) for x in a) for a in acts_raw
            ):
                raise InputError(
                    "expected dialog acts as [intent, domain, slot, value] strings",
                    file=path,
                    field=f"{where}.dialog_act",
                )
            real = tuple(
                (a[0], a[1], a[2], a[3]) for a in acts_raw if a[0] != "General" and a[1] in CROSSWOZ_DOMAINS
            )
            out.append(CrossWozMessage(t, where, str(m.get("role")), m["content"].strip(), real))
        yield str(did), out


def _read_crosswoz(path: Path, data: bytes) -> list[Utterance]:
    out: list[Utterance] = []
    src = f"crosswoz:{path.name}"
    for did, msgs in iter_crosswoz(path, data):
        stated: dict[str, dict[str, str]] = {}  # domain → slot → value the user has given so far
        turns: list[tuple[str, str]] = []  # the dialogue so far, greetings included
        focus: dict[str, str] = {}  # domain → the venue last named by either side
        for m in msgs:
            real = list(m.real)
            before = tuple(turns)
            if m.text and m.role in ("usr", "sys"):
                turns.append(("user" if m.role == "usr" else "assistant", m.text))
            if m.role == "sys":
                for kind, dom, slot, value in real:
                    if kind == "Inform" and slot == "名称" and value not in ("", "none", "无"):
                        focus[CROSSWOZ_DOMAINS[dom]] = value
                        # The venue now talked about replaces a name the user gave earlier.
                        stated.get(CROSSWOZ_DOMAINS[dom], {}).pop("name", None)
                continue
            if m.role != "usr" or not real:
                continue  # greetings, thanks, goodbyes: not requests
            domain = CROSSWOZ_DOMAINS[_most_common_first([a[1] for a in real])]
            for kind, dom, slot, value in real:
                if kind == "Inform" and value:
                    key = CROSSWOZ_SLOTS.get(slot.split("-")[0], slot)
                    # A facility is asked for as slot "酒店设施-<facility>" with value "是".
                    shown = slot.split("-", 1)[1] if slot.startswith("酒店设施-") else value
                    stated.setdefault(CROSSWOZ_DOMAINS[dom], {})[key] = shown
                    if slot == "名称":
                        focus[CROSSWOZ_DOMAINS[dom]] = value
            if not m.text:
                continue
            out.append(
                Utterance(
                    id=f"{did}-{m.index}",
                    text=m.text,
                    lang=detect_lang(m.text),
                    domain=domain,
                    intent=crosswoz_intent(real),
                    source=src,
                    slots=tuple(sorted(stated.get(domain, {}).items())),
                    focus=focus.get(domain),
                    where=m.where,
                    history=before,
                )
            )
    return out


def _most_common_first(items: list[str]) -> str:
    """The most common item, the earliest on ties."""
    counts: dict[str, int] = {}
    for x in items:
        counts[x] = counts.get(x, 0) + 1
    best = max(counts.values())
    return next(x for x in items if counts[x] == best)


LOG_READERS.register("crosswoz")(
    LogReader(
        "crosswoz",
        "CrossWOZ dialogues (.json, .json.zip): user turns with dialog acts",
        _sniff_crosswoz,
        _read_crosswoz,
        20,
    )
)
LOG_READERS.register("clinc150")(
    LogReader(
        "clinc150", "CLINC150 data_full.json: [text, intent] rows by split", _sniff_clinc, _read_clinc, 30
    )
)
LOG_READERS.register("jsonl")(
    LogReader(
        "jsonl",
        "the harness's JSONL request log (id, text, confidence, domain …)",
        _sniff_jsonl,
        _read_jsonl,
        40,
    )
)
