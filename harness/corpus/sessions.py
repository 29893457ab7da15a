"""Session corpora: whole conversations from dialogue logs, one record per user turn (``--sessions``).

A session record is a turn ``k`` of a conversation: the log's user message verbatim, the think time
before it, the session's system prompt and retrieved context, and the history of turns ``1 … k−1``
(the log's answers; a replay with live history swaps in the target's, :mod:`harness.load.sessions`).
The history reaches the template as user/assistant messages (a ``.messages.json`` spec with a
``history`` part) or as a rendered transcript (``{{ transcript }}`` in a ``.j2`` prompt, rendered by
:func:`transcript`, the one transcript format, which the live replay uses too).

Dialogue logs (registry :data:`SESSION_READERS`, detected from content):

* ``crosswoz`` — CrossWOZ dialogues (``.json`` / ``.json.zip``): every non-empty user message is a
  turn, the system message after it its reply; the venues either side named are the session's
  retrieved context (entries of the bundled CrossWOZ venue catalogue), stable for the whole session
  so that each turn's prompt extends the previous one (the prefix a KV cache reuses);
* ``jsonl`` — one :class:`SessionLogLine` a line: ``session_id``, ``turn``, ``text``, optional
  ``response``, ``ts`` and ``replied_at`` (seconds or ISO), ``lang``, ``domain``, ``intent``;
* ``openai`` — an agent's log: one conversation a line in OpenAI's chat shape
  (:class:`ConversationLine`: ``messages`` with assistant ``tool_calls`` and ``tool`` results,
  ``tools``, ``tool_choice``; the shape of OpenAI's chat fine-tuning files too). Each assistant
  message ends a turn, opened by the messages since the previous one: a user message, or the
  tool results that answer the previous turn's calls. The records carry the tools, the tool results
  that open a turn (``session.inputs``) and the log's calls (``session.log_tool_calls``), which a
  live replay matches the target's own calls against (:mod:`harness.load.sessions`).

Think time before turn ``k > 1``: from the log's timestamps where it has them (``ts_k − replied_at_{k−1}``,
else ``ts_k − ts_{k−1}``), or from a Mooncake-style timing trace (``--trace``: JSONL with
``timestamp`` in ms and a ``session_id`` / ``chat_id`` / ``conversation_id``, or without any, sessions
inferred from growing ``hash_ids`` prefixes, :func:`chain_by_prefix`; session ``i`` of the trace times
dialogue ``i``, turns by the gaps between arrivals), else drawn from a stated distribution
(:class:`ThinkTime`), seeded per session and turn. Dedup (cosine ≥ the threshold, the corpus's
per-language judges) judges each session's FIRST user turn, so that whole conversations are kept or
dropped together.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from itertools import pairwise
from pathlib import Path
from typing import Any, Literal

import numpy as np
import orjson
from pydantic import Field, ValidationError

from harness.common.errors import ConfigError, InputError
from harness.common.formats import first_line, first_object
from harness.common.io import jsonl_lines, parse_jsonl_line
from harness.common.model import StrictModel
from harness.common.registry import Registry
from harness.common.stats import percentile
from harness.corpus import catalog
from harness.corpus import dedup as dedup_mod
from harness.corpus.assemble import PromptTemplate, load_template
from harness.corpus.logs import (
    CROSSWOZ_DOMAINS,
    CorpusReader,
    _most_common_first,
    _payload,
    crosswoz_intent,
    detect_format,
    detect_lang,
    iter_crosswoz,
    read_with,
)
from harness.corpus.manifest import file_sha256, write_corpus_files
from harness.corpus.model import (
    CorpusRecord,
    Manifest,
    Message,
    Provenance,
    Sampling,
    SessionTurn,
    TemplateInfo,
    ToolCall,
    ToolFunction,
)
from harness.corpus.sandbox import PromptRenderer, TemplateError
from harness.corpus.settings import CorpusSettings
from harness.corpus.tokens import TargetTokenizer, load_tokenizer

REPO = Path(__file__).resolve().parents[2]
DEFAULT_SESSION_LOGS = (REPO / "fixtures" / "corpus" / "crosswoz_sample.json.zip",)
DEFAULT_SESSION_TEMPLATE = REPO / "templates" / "prompts" / "session.messages.json"
HISTORY_MARK = "\u27e6history\u27e7"
"""Rendered in place of ``{{ transcript }}`` to find where the history sits in a prompt."""
SESSION_FIELDS = ("session_id", "chat_id", "conversation_id")
"""Names a timing trace's session id may go by."""
MAX_OUTPUT_TOKENS = 1024


# ------------------------------------------------------------------------------------ dialogues


@dataclass(frozen=True, slots=True)
class DialogueTurn:
    user: str
    """The user message that opens the turn ("" when tool results alone open it)."""
    reply: str | None
    ts: float | None = None
    """Seconds (any origin) the user message was sent, when the log says."""
    replied_at: float | None = None
    where: str = ""
    inputs: tuple[Message, ...] | None = None
    """The messages that open the turn when they are not one user message (tool results, a user
    message after them): an agent's log (:data:`SESSION_READERS` ``openai``)."""
    calls: tuple[ToolCall, ...] = ()
    """The tool calls of the reply."""
    sizes: tuple[int, int] | None = None
    """A trace's turn (no text): the tokens its opening messages add to the prompt and the tokens
    of its reply; :func:`materialize` writes texts of those lengths."""
    blocks: tuple[int, ...] = ()
    """A trace's first turn: its prompt's ``hash_ids`` (shared blocks become shared text)."""

    def opener(self) -> list[Message]:
        """The messages that open the turn, as the body carries them."""
        return list(self.inputs) if self.inputs else [Message(role="user", content=self.user)]

    def answer(self) -> Message:
        """The log's reply as an assistant message (its tool calls too)."""
        return Message(role="assistant", content=self.reply or "", tool_calls=list(self.calls) or None)


@dataclass(frozen=True, slots=True)
class Dialogue:
    id: str
    source: str
    """``format:file`` it was read from."""
    lang: str
    domain: str
    intent: str
    turns: tuple[DialogueTurn, ...]
    venues: tuple[str, ...] = ()
    """Venues the conversation names (CrossWOZ), in order: the session's retrieved context."""
    system: tuple[str, ...] = ()
    """The log's own system messages (an agent's log): they replace the template's system part."""
    tools: list[dict[str, Any]] | None = None
    """The tools the conversation offered (OpenAI ``tools``), sent with every turn."""
    tool_choice: str | dict[str, Any] | None = None
    verbatim: bool = False
    """Its user messages go into the body as they are, not through the template's user part (a
    trace's synthetic texts: tens of thousands of tokens, past the template sandbox's output cap)."""

    @property
    def from_trace(self) -> bool:
        """A trace's conversation: lengths without text (:func:`materialize` writes it)."""
        return any(t.sizes is not None for t in self.turns)

    @property
    def agentic(self) -> bool:
        """Whether the conversation has tools, tool calls or tool results (chat templates only)."""
        return bool(self.tools) or any(t.inputs or t.calls for t in self.turns)


SessionReader = CorpusReader[Dialogue]
"""A dialogue log format (:data:`SESSION_READERS`): the request logs' reader type, yielding dialogues."""

SESSION_READERS: Registry[SessionReader] = Registry("dialogue log format")
_WHAT = "dialogue log"
_HINT = "see docs/corpus.md (sessions)"


def detect_session_format(path: Path) -> str:
    """The registered format of a dialogue log, from its content; :class:`InputError` if none fits."""
    return detect_format(SESSION_READERS, path, what=_WHAT, hint=_HINT)


def read_dialogues(paths: Sequence[Path]) -> list[Dialogue]:
    """Every dialogue of every log, in file order; ids prefixed by the file's position when several."""
    out: list[Dialogue] = []
    for k, p in enumerate(paths):
        got = read_with(
            SESSION_READERS,
            p,
            None,
            what=_WHAT,
            hint=_HINT,
            empty="no dialogues with a user turn in this {fmt} log",
        )
        for d in got:
            out.append(d if len(paths) == 1 else Dialogue(f"{k}:{d.id}", *_rest(d)))
    return out


def _rest(d: Dialogue) -> tuple[Any, ...]:
    return (
        d.source,
        d.lang,
        d.domain,
        d.intent,
        d.turns,
        d.venues,
        d.system,
        d.tools,
        d.tool_choice,
        d.verbatim,
    )


def _sniff_crosswoz(name: Path, head: bytes) -> bool:
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    return (
        text.startswith(b"{") and b'"messages"' in head and (b'"sys-usr"' in head or b'"dialog_act"' in head)
    )


def _read_crosswoz(path: Path, data: bytes) -> list[Dialogue]:
    out: list[Dialogue] = []
    src = f"crosswoz:{path.name}"
    for did, msgs in iter_crosswoz(path, data):
        turns: list[DialogueTurn] = []
        domains: list[str] = []
        first_acts: list[tuple[str, str, str, str]] | None = None
        venues: list[str] = []
        for m in msgs:
            for kind, _dom, slot, value in m.real:
                if (
                    kind == "Inform"
                    and slot == "名称"
                    and value not in ("", "none", "无")
                    and value not in venues
                ):
                    venues.append(value)
            if m.role == "usr":
                if not m.text:
                    continue
                domains += [a[1] for a in m.real]
                if first_acts is None and m.real:
                    first_acts = list(m.real)
                turns.append(DialogueTurn(user=m.text, reply=None, where=m.where))
            elif m.role == "sys" and turns and turns[-1].reply is None and m.text:
                last = turns[-1]
                turns[-1] = DialogueTurn(last.user, m.text, last.ts, last.replied_at, last.where)
        if not turns:
            continue
        domain = CROSSWOZ_DOMAINS[_most_common_first(domains)] if domains else "chat"
        out.append(
            Dialogue(
                id=did,
                source=src,
                lang=detect_lang(turns[0].user),
                domain=domain,
                intent=crosswoz_intent(first_acts or []),
                turns=tuple(turns),
                venues=tuple(venues),
            )
        )
    return out


class SessionLogLine(StrictModel):
    """One line of a JSONL dialogue log (``--sessions``)."""

    session_id: str = Field(min_length=1)
    turn: int = Field(ge=1)
    text: str = Field(min_length=1)
    response: str | None = None
    ts: float | datetime | None = None
    """When the user sent it (epoch seconds or ISO 8601)."""
    replied_at: float | datetime | None = None
    """When the answer to it had arrived (epoch seconds or ISO 8601)."""
    lang: Literal["en", "zh"] | None = None
    domain: str | None = None
    intent: str | None = None


def _seconds(v: float | datetime | None) -> float | None:
    if v is None:
        return None
    return v.timestamp() if isinstance(v, datetime) else float(v)


def _sniff_jsonl(name: Path, head: bytes) -> bool:
    obj = first_object(head)
    return obj is not None and {"session_id", "turn", "text"} <= obj.keys()


def _read_jsonl(path: Path, data: bytes) -> list[Dialogue]:
    by_session: dict[str, list[tuple[int, SessionLogLine]]] = {}
    for n, line in jsonl_lines(data.splitlines()):
        row = parse_jsonl_line(line, n, SessionLogLine, file=path, expected="a dialogue log line")
        by_session.setdefault(row.session_id, []).append((n, row))
    out: list[Dialogue] = []
    src = f"jsonl:{path.name}"
    for sid, rows in by_session.items():
        rows.sort(key=lambda x: x[1].turn)
        turns: list[DialogueTurn] = []
        for k, (n, row) in enumerate(rows, start=1):
            if row.turn != k:
                raise InputError(
                    f"session {sid!r} has turn {row.turn} where turn {k} was expected (1, 2, 3 …)",
                    file=path,
                    line=n,
                    field="turn",
                )
            turns.append(
                DialogueTurn(row.text, row.response, _seconds(row.ts), _seconds(row.replied_at), f"line {n}")
            )
        first = rows[0][1]
        out.append(
            Dialogue(
                id=sid,
                source=src,
                lang=first.lang or detect_lang(first.text),
                domain=first.domain or "chat",
                intent=first.intent or "chat",
                turns=tuple(turns),
            )
        )
    return out


class LogMessage(StrictModel):
    """A message of an agent's log (OpenAI chat shape, as its API and its fine-tuning files have it)."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    """Text, or text parts (``{"type": "text", "text": …}``, joined)."""
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    weight: int | None = None
    """A fine-tuning file's per-message weight: not part of the conversation (ignored)."""

    def text(self, where: str, path: Path, line: int) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        parts = []
        for part in self.content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise InputError("only text content parts can be replayed", file=path, line=line, field=where)
            parts.append(part["text"])
        return "\n".join(parts)


class ConversationLine(StrictModel):
    """One line of an agent's log (``openai``): a whole conversation in OpenAI's chat shape."""

    messages: list[LogMessage] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    """Read, not replayed: the target decides whether it calls tools in parallel."""
    session_id: str | None = None
    id: str | None = None
    lang: Literal["en", "zh"] | None = None
    domain: str | None = None
    intent: str | None = None


def _sniff_openai(name: Path, head: bytes) -> bool:
    line = first_line(head)
    return line.startswith(b"{") and b'"messages"' in line and b'"role"' in line


def _read_openai(path: Path, data: bytes) -> list[Dialogue]:
    """One conversation a line: the system messages up front are its system prompt, and each
    assistant message ends a turn that the messages since the previous one opened (a user message, or
    the tool results answering the previous turn's calls)."""
    out: list[Dialogue] = []
    src = f"openai:{path.name}"
    for n, text in jsonl_lines(data.splitlines()):
        row = parse_jsonl_line(text, n, ConversationLine, file=path, expected="a conversation (messages)")
        system: list[str] = []
        turns: list[DialogueTurn] = []
        pending: list[Message] = []
        for i, m in enumerate(row.messages):
            where = f"messages[{i}]"
            content = m.text(f"{where}.content", path, n)
            if m.role in ("system", "developer") and not turns and not pending:
                system.append(content)
                continue
            if m.role == "assistant":
                if not pending:
                    raise InputError(
                        "an assistant message must answer something: a user message or tool results "
                        "come before it",
                        file=path,
                        line=n,
                        field=where,
                    )
                turns.append(_turn(pending, content, tuple(m.tool_calls or ()), f"line {n} {where}"))
                pending = []
                continue
            try:
                role = "system" if m.role == "developer" else m.role
                pending.append(Message(role=role, content=content, tool_call_id=m.tool_call_id, name=m.name))
            except ValidationError as exc:
                raise InputError(exc.errors()[0]["msg"], file=path, line=n, field=where) from None
        if pending:  # the log ends on a question no one answered yet: a last turn without a reply
            turns.append(_turn(pending, None, (), f"line {n}"))
        if not turns or not turns[0].user:
            raise InputError(
                "a conversation must open with a user message", file=path, line=n, field="messages"
            )
        sid = row.session_id or row.id or f"line-{n}"
        out.append(
            Dialogue(
                id=sid,
                source=src,
                lang=row.lang or detect_lang(turns[0].user),
                domain=row.domain or ("agent" if row.tools else "chat"),
                intent=row.intent or ("tool_use" if row.tools else "chat"),
                turns=tuple(turns),
                system=tuple(system),
                tools=row.tools,
                tool_choice=row.tool_choice,
            )
        )
    return out


def _turn(pending: list[Message], reply: str | None, calls: tuple[ToolCall, ...], where: str) -> DialogueTurn:
    users = [m.content for m in pending if m.role == "user"]
    plain = len(pending) == 1 and pending[0].role == "user"
    return DialogueTurn(
        users[-1] if users else "", reply if reply or not calls else None, where=where,
        inputs=None if plain else tuple(pending), calls=calls,
    )  # fmt: skip


AGENT_TOOL = {
    "type": "function",
    "function": {
        "name": "act",
        "description": "Run one step of the task (a trace's tool: its name and schema are not in the trace)",
        "parameters": {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]},
    },
}
"""The one tool a trace's agent sessions offer and call (the trace says how long calls and results
were, not what they were)."""
AGENT_SYSTEM = "You are an agent. Call the act tool for each step of the task, then answer."


def _sniff_mooncake(name: Path, head: bytes) -> bool:
    line = first_line(head)
    return (
        line.startswith(b"{")
        and b'"input_length"' in line
        and b'"hash_ids"' in line
        and b'"timestamp"' in line
    )


def _read_mooncake(path: Path, data: bytes) -> list[Dialogue]:
    """A Mooncake-format trace (``toolagent_trace.jsonl``, the FAST'25 tool and agent workload; any of
    its traces) as agent conversations: sessions inferred from growing ``hash_ids`` prefixes
    (:func:`chain_by_prefix`), every turn but the last answered by a tool call of ``output_length``
    tokens, every later turn opened by that call's result, as long as the prompt grew beyond the
    previous prompt and answer. Texts are written later, to the lengths, by :func:`materialize`."""
    from harness.traces.readers.mooncake import BLOCK_SIZE  # the trace's own block size

    reqs: list[TraceRequest] = []
    for n, line in jsonl_lines(data.splitlines()):
        obj = _timestamped(path, n, line)
        reqs.append(_trace_request(path, n, obj, float(obj["timestamp"]) / 1000.0))
    chains, _ = chain_by_prefix(reqs, BLOCK_SIZE)
    out: list[Dialogue] = []
    for i, chain in enumerate(chains):
        turns: list[DialogueTurn] = []
        for k, j in enumerate(chain):
            r = reqs[j]
            if k == 0:
                added = r.input_tokens
            else:
                prev = reqs[chain[k - 1]]
                added = max(0, r.input_tokens - prev.input_tokens - prev.output_tokens)
            last = k == len(chain) - 1
            call = () if last else (ToolCall(id=f"call_{i}_{k}", function=ToolFunction(name="act")),)
            turns.append(
                DialogueTurn(
                    "", None, ts=r.at_s, where=f"line {j + 1}", calls=call, sizes=(added, r.output_tokens),
                    blocks=r.hash_ids[: r.input_tokens // BLOCK_SIZE] if k == 0 else (),
                )
            )  # fmt: skip
        out.append(
            Dialogue(
                id=f"session-{i}", source=f"mooncake:{path.name}", lang="en", domain="agent",
                intent="tool_use", turns=tuple(turns), system=(AGENT_SYSTEM,), tools=[AGENT_TOOL],
                tool_choice="auto",
            )
        )  # fmt: skip
    return out


def materialize(d: Dialogue, tok: TargetTokenizer) -> Dialogue:
    """A trace's conversation with texts of its lengths, in ``tok``'s tokens: the first turn's prefix
    blocks as the shared block texts (so sessions that share blocks in the trace share text), the
    rest of every prompt's growth as the previous call's result, each reply as a call whose
    ``input`` argument (or, last, an answer) is as long as the trace's output. Deterministic for a
    seed; the chat template's own tokens come on top."""
    from harness.traces.readers.mooncake import BLOCK_SIZE

    turns: list[DialogueTurn] = []
    prev_call: ToolCall | None = None
    for k, t in enumerate(d.turns):
        assert t.sizes is not None
        added, output = t.sizes
        key = f"{d.id}:{k}"
        reply_text = tok.words(f"reply:{key}", output).strip()
        calls: tuple[ToolCall, ...] = ()
        if t.calls:
            args = orjson.dumps({"input": reply_text}).decode()
            calls = (ToolCall(id=t.calls[0].id, function=ToolFunction(name="act", arguments=args)),)
        if k == 0:
            head = tok.prefix(t.blocks, BLOCK_SIZE)
            text = (head + tok.words(f"user:{key}", added - len(t.blocks) * BLOCK_SIZE)).strip()
            turns.append(replace(t, user=text, reply=None if calls else reply_text, calls=calls, sizes=None))
        else:
            assert prev_call is not None
            result = Message(
                role="tool", content=tok.words(f"result:{key}", added).strip(), tool_call_id=prev_call.id
            )
            turns.append(
                replace(t, inputs=(result,), reply=None if calls else reply_text, calls=calls, sizes=None)
            )
        prev_call = calls[0] if calls else None
    return replace(d, turns=tuple(turns), verbatim=True)


SESSION_READERS.register("crosswoz")(
    SessionReader("crosswoz", "CrossWOZ dialogues (.json, .json.zip)", _sniff_crosswoz, _read_crosswoz, 20)
)
SESSION_READERS.register("openai")(
    SessionReader(
        "openai",
        "JSONL: one conversation a line in OpenAI's chat shape (messages with tool calls and tool "
        "results, tools, tool_choice)",
        _sniff_openai,
        _read_openai,
        30,
    )
)
SESSION_READERS.register("mooncake")(
    SessionReader(
        "mooncake",
        "Mooncake JSONL trace (timestamp, input_length, output_length, hash_ids; e.g. the tool and agent "
        "workload): agent sessions from growing hash_ids prefixes, synthetic texts of the trace's lengths",
        _sniff_mooncake,
        _read_mooncake,
        35,
    )
)
SESSION_READERS.register("jsonl")(
    SessionReader("jsonl", "JSONL: session_id, turn, text, response, ts …", _sniff_jsonl, _read_jsonl, 40)
)


# ----------------------------------------------------------------------------------- think time


class ThinkTime(StrictModel):
    """The stated distribution of think times where a log has no timestamps (``--think-time``).

    ``lognormal:MEDIAN,SIGMA`` (seconds; default ``lognormal:8,0.8``: a median user reads and types
    for 8 s), ``exponential:MEAN`` or ``constant:SECONDS``; draws are clipped to ``[lo, hi]``."""

    kind: Literal["lognormal", "exponential", "constant"] = "lognormal"
    a: float = Field(default=8.0, ge=0.0)
    b: float = Field(default=0.8, ge=0.0)
    lo: float = Field(default=0.0, ge=0.0)
    hi: float = Field(default=120.0, gt=0.0)

    @classmethod
    def parse(cls, spec: str) -> ThinkTime:
        kind, _, args = spec.partition(":")
        try:
            nums = [float(x) for x in args.split(",") if x.strip()]
            if kind == "lognormal" and len(nums) == 2:
                return cls(kind="lognormal", a=nums[0], b=nums[1])
            if kind in ("exponential", "constant") and len(nums) == 1:
                return cls(kind=kind, a=nums[0], b=0.0)
        except (ValueError, ValidationError):
            pass
        raise ConfigError(
            f"not a think-time distribution: {spec!r}",
            field="--think-time",
            hint="lognormal:MEDIAN,SIGMA, exponential:MEAN or constant:SECONDS",
        )

    def describe(self) -> str:
        if self.kind == "lognormal":
            return f"lognormal(median {self.a:g} s, sigma {self.b:g}) clipped to [{self.lo:g}, {self.hi:g}] s"
        if self.kind == "exponential":
            return f"exponential(mean {self.a:g} s) clipped to [{self.lo:g}, {self.hi:g}] s"
        return f"constant {self.a:g} s"

    def draw(self, seed: int, session_id: str, turn: int) -> float:
        """A seeded draw for one turn (the same seed, session and turn give the same time)."""
        if self.kind == "constant":
            return self.a
        digest = hashlib.blake2b(f"think:{seed}:{session_id}:{turn}".encode(), digest_size=8).digest()
        rng = np.random.default_rng(int.from_bytes(digest, "big"))
        x = (
            rng.lognormal(math.log(max(self.a, 1e-9)), self.b)
            if self.kind == "lognormal"
            else rng.exponential(self.a)
        )
        return float(min(max(x, self.lo), self.hi))


@dataclass(frozen=True, slots=True)
class SessionTiming:
    """A timing trace's session: its start and its turns' think times (``None``: not in the trace)."""

    start_s: float
    think_s: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class TimingTrace:
    """The sessions of a timing trace (``--trace``), by start time, and how they were found."""

    sessions: list[SessionTiming]
    how: Literal["ids", "prefix"]
    """``ids``: the lines' session ids; ``prefix``: inferred from growing ``hash_ids`` prefixes."""
    requests: int
    """Lines that went into a session."""
    forks: int = 0
    """Requests (``prefix``) that extend a turn another request already continued: new sessions."""

    @property
    def think_source(self) -> str:
        """``think_source`` of the turns it times."""
        return "trace" if self.how == "ids" else "trace-prefix"

    def summary(self) -> dict[str, Any]:
        turns = [len(s.think_s) + 1 for s in self.sessions]
        return {
            "sessions_from": "session ids" if self.how == "ids" else "hash_ids prefix extension",
            "requests": self.requests,
            "sessions": len(self.sessions),
            "multi_turn_sessions": sum(1 for t in turns if t > 1),
            "turns_max": max(turns, default=0),
            "turns_histogram": {str(k): v for k, v in sorted(Counter(turns).items())},
            "forks": self.forks,
        }


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """What prefix inference needs of one trace line."""

    at_s: float
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...]


class _Node:
    """A node of the prefix trie over hash ids: the requests whose full blocks end exactly here."""

    __slots__ = ("ends", "next")

    def __init__(self) -> None:
        self.next: dict[int, _Node] = {}
        self.ends: list[int] = []


def chain_by_prefix(reqs: Sequence[TraceRequest], block_size: int) -> tuple[list[list[int]], int]:
    """Sessions of a trace without session ids, inferred from KV block prefixes: (turn lists, forks).

    Request B is the next turn of an earlier request A when B's ``hash_ids`` start with every FULL
    block of A (``input_tokens // block_size`` of them: A's last block is partial unless the length is
    a multiple, and a longer prompt hashes it differently) and B's prompt holds at least A's prompt
    and A's answer (``B.input ≥ A.input + max(A.output, 1)``): a next turn carries the history,
    answer included. That second test is what separates turns from siblings, requests that share a
    document or system prompt but each ask their own question (the synthetic Mooncake trace is full of
    them: same blocks, a few tokens apart). Among several such A, the one with the longest shared
    prefix is the previous turn (turn k+2 also extends turn k), then the latest; an A that already
    has a next turn is not taken again, so a second continuation (a fork) starts a session of its
    own. Requests are taken in timestamp order, so turns are in timestamp order.
    """
    order = sorted(range(len(reqs)), key=lambda i: (reqs[i].at_s, i))
    root = _Node()
    continued: set[int] = set()
    session_of: dict[int, int] = {}
    sessions: list[list[int]] = []
    forks = 0
    for i in order:
        b = reqs[i]
        path: list[_Node] = []
        node = root
        for h in b.hash_ids:
            nxt = node.next.get(h)
            if nxt is None:
                break
            node = nxt
            path.append(node)
        parent: int | None = None
        taken = False
        for node in reversed(path):  # the longest shared prefix first
            for j in reversed(node.ends):  # then the latest request
                a = reqs[j]
                if b.input_tokens < a.input_tokens + max(a.output_tokens, 1):
                    continue
                if j in continued:
                    taken = True
                    continue
                parent = j
                break
            if parent is not None:
                break
        if parent is None:
            forks += taken
            session_of[i] = len(sessions)
            sessions.append([i])
        else:
            continued.add(parent)
            session_of[i] = session_of[parent]
            sessions[session_of[i]].append(i)
        full = min(len(b.hash_ids), b.input_tokens // block_size)
        node = root
        for h in b.hash_ids[:full]:
            node = node.next.setdefault(h, _Node())
        if full:
            node.ends.append(i)
    return sessions, forks


def read_timing_trace(path: Path) -> TimingTrace:
    """Sessions of a Mooncake-style JSONL trace, by start time.

    With session ids (``session_id`` / ``chat_id`` / ``conversation_id``) on its lines, those group
    the turns (lines without one are skipped); without any, sessions are inferred from ``hash_ids``
    (:func:`chain_by_prefix`, Mooncake's 512-token blocks). Think time before turn k is the gap
    between the arrivals of turns k−1 and k: the trace does not say when turn k−1's answer ended, so
    the gap includes that answer's generation time as well as the user's thinking.
    """
    from harness.traces.readers.mooncake import BLOCK_SIZE  # the trace's own block size

    _, data = _payload(path)
    rows: dict[str, list[float]] = {}
    plain: list[tuple[int, dict[str, Any], float]] = []
    for n, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        obj = _timestamped(path, n, line)
        at_s = float(obj["timestamp"]) / 1000.0
        sid = next((obj[f] for f in SESSION_FIELDS if obj.get(f) is not None), None)
        if sid is not None:
            rows.setdefault(str(sid), []).append(at_s)
        else:
            plain.append((n, obj, at_s))
    if rows:
        sessions = [sorted(ts) for ts in rows.values()]
        return TimingTrace(_timings(sessions), "ids", sum(len(ts) for ts in sessions))
    reqs = [_trace_request(path, n, obj, at_s) for n, obj, at_s in plain if "hash_ids" in obj]
    if not reqs:
        raise InputError(
            f"no line has a session id ({', '.join(SESSION_FIELDS)}) or hash_ids: sessions and think "
            "times cannot be taken from this trace",
            file=path,
            hint="give --sessions a dialogue log only (think times then come from --think-time)",
        )
    chains, forks = chain_by_prefix(reqs, BLOCK_SIZE)
    return TimingTrace(_timings([[reqs[i].at_s for i in c] for c in chains]), "prefix", len(reqs), forks)


def _trace_request(path: Path, n: int, obj: dict[str, Any], at_s: float) -> TraceRequest:
    ids, inp, outp = obj.get("hash_ids"), obj.get("input_length"), obj.get("output_length", 0)
    if not isinstance(ids, list) or not all(isinstance(h, int) for h in ids):
        raise InputError("expected 'hash_ids', a list of integers", file=path, line=n, field="hash_ids")
    for name, v in (("input_length", inp), ("output_length", outp)):
        if not isinstance(v, int) or v < 0:
            raise InputError(
                "expected a token count ≥ 0 (sessions are inferred from hash_ids and lengths)",
                file=path,
                line=n,
                field=name,
            )
    assert isinstance(inp, int) and isinstance(outp, int)
    return TraceRequest(at_s, inp, outp, tuple(ids))


def _timings(sessions: list[list[float]]) -> list[SessionTiming]:
    sessions = sorted(sessions, key=lambda ts: ts[0])
    t0 = sessions[0][0]
    return [SessionTiming(ts[0] - t0, tuple(b - a for a, b in pairwise(ts))) for ts in sessions]


def think_times(
    d: Dialogue, timing: SessionTiming | None, dist: ThinkTime, seed: int, trace_source: str = "trace"
) -> tuple[list[float], list[str]]:
    """Think time before each turn of ``d`` (0 before the first) and where each came from."""
    times, sources = [0.0], ["none"]
    for k in range(1, len(d.turns)):
        cur, prev = d.turns[k], d.turns[k - 1]
        if cur.ts is not None and (prev.replied_at is not None or prev.ts is not None):
            base = prev.replied_at if prev.replied_at is not None else prev.ts
            assert base is not None
            times.append(max(0.0, cur.ts - base))
            sources.append("log")
        elif timing is not None and k - 1 < len(timing.think_s):
            times.append(timing.think_s[k - 1])
            sources.append(trace_source)
        else:
            times.append(dist.draw(seed, d.id, k + 1))
            sources.append(dist.describe())
    return times, sources


# ------------------------------------------------------------------------------------ rendering

TRANSCRIPT_LABELS = {"zh": ("用户", "助手"), "en": ("User", "Assistant")}


def transcript(pairs: Sequence[tuple[str, str]], lang: str) -> str:
    """The one rendered transcript of a history (completions API): ``User: …\\nAssistant: …\\n`` per turn."""
    user, assistant = TRANSCRIPT_LABELS.get(lang, TRANSCRIPT_LABELS["en"])
    return "".join(f"{user}: {u}\n{assistant}: {a}\n" for u, a in pairs)


def retrieved_context(d: Dialogue) -> list[dict[str, Any]]:
    """Catalogue entries of the venues the dialogue names (stable for the whole session)."""
    cat = catalog.load_catalog()
    out: list[dict[str, Any]] = []
    for name in d.venues:
        v = cat.venue_by_name.get(name)
        if v is None:
            continue
        entry = {
            "name": v.name,
            "domain": v.domain,
            "district": v.district,
            "subway": v.subway,
            "rating": v.rating,
            "price": v.price,
            "type": v.type,
            "dishes": list(v.dishes),
        }
        out.append({k: val for k, val in entry.items() if val not in (None, [])})
    return out


def _context(d: Dialogue, k: int, query: str, transcript_text: str) -> dict[str, Any]:
    ctx = retrieved_context(d)
    return {
        "lang": d.lang,
        "domain": d.domain,
        "domain_label": catalog.label(d.domain, d.lang),
        "intent": d.intent,
        "query": query,
        "session_id": d.id,
        "turn": k,
        "context": ctx,
        "context_text": "\n".join(
            "- " + "; ".join(f"{k}={'、'.join(v) if isinstance(v, list) else v}" for k, v in e.items())
            for e in ctx
        ),
        "transcript": transcript_text,
    }


def render_turn(
    tmpl: PromptTemplate, renderer: PromptRenderer, d: Dialogue, k: int, pairs: list[tuple[str, str]]
) -> tuple[str | None, list[Message] | None, tuple[int, int]]:
    """Turn ``k`` (1-based) with ``pairs`` as its history: (prompt, messages, history_at).

    An agent's conversation (:attr:`Dialogue.agentic`) needs a chat template: its history is every
    earlier turn's opening messages and the log's answer with its tool calls, its system part the
    log's own system messages (when it has any), and a turn opened by tool results carries them in
    place of the template's user part."""
    turn = d.turns[k - 1]
    query = turn.user
    if tmpl.kind == "prompt":
        if d.agentic:
            raise TemplateError(
                f"dialogue {d.id!r} has tools or tool calls: a prompt (completions) template cannot "
                "carry them; use a chat template (templates/prompts/session.messages.json)",
                file=tmpl.files[0],
            )
        text = renderer.render(tmpl.name, _context(d, k, query, HISTORY_MARK))
        if text.count(HISTORY_MARK) != 1:
            raise TemplateError(
                "a session prompt template must show {{ transcript }} exactly once", file=tmpl.files[0]
            )
        head, tail = text.split(HISTORY_MARK)
        body = transcript(pairs, d.lang)
        return head + body + tail, None, (len(head), len(head) + len(body))
    msgs: list[Message] = []
    at = (0, 0)
    ctx = _context(d, k, query, transcript(pairs, d.lang))
    system_done = False
    for role, name in tmpl.parts:
        if role == "history":
            start = len(msgs)
            for earlier in d.turns[: k - 1]:
                msgs += [*earlier.opener(), earlier.answer()]
            at = (start, len(msgs))
        elif role == "fewshot":
            continue  # a session's examples are its own history
        elif role == "system" and d.system:
            if not system_done:  # the log's own system prompt, verbatim, once
                msgs += [Message(role="system", content=text) for text in d.system]
                system_done = True
        elif role == "user" and (turn.inputs or d.verbatim):
            msgs += turn.opener()  # tool results (and what the user added), a trace's text: verbatim
        else:
            assert name is not None
            # A template's final newline is not part of a message (the user's text stays verbatim).
            msgs.append(Message(role=role, content=renderer.render(name, ctx).rstrip("\n")))
    if not any(role == "history" for role, _ in tmpl.parts):
        raise TemplateError('a session messages spec needs a {"role": "history"} part', file=tmpl.files[0])
    return None, msgs, at


# ---------------------------------------------------------------------------------------- build


@dataclass
class SessionBuildInputs:
    out: Path
    logs: list[Path] | None = None
    """Dialogue logs; ``None``: the bundled CrossWOZ sample."""
    template: Path = DEFAULT_SESSION_TEMPLATE
    n: int | None = None
    """Sessions to keep (``None``: every distinct one)."""
    think_time: ThinkTime = field(default_factory=ThinkTime)
    trace: Path | None = None
    template_roots: list[Path] = field(default_factory=list)


@dataclass
class SessionBuildResult:
    records: list[CorpusRecord]
    manifest: Manifest
    metrics: dict[str, Any]
    sessions: list[dict[str, Any]]
    dropped: int
    examples: list[dict[str, object]]
    failures: list[str]


def _dedup_first_turns(
    dialogues: list[Dialogue], settings: CorpusSettings, tick: Callable[[str, int, int], None]
) -> tuple[list[int], dict[int, tuple[int, float]], dict[str, dict[str, object]]]:
    """Indices of the dialogues kept (greedy, in order) and, for each dropped one, (kept, cosine).
    A trace's conversations are distinct by construction (and have no text yet): all kept."""
    from harness.corpus.build import _judges  # the corpus's one way to make its per-language judges

    traced = [i for i, d in enumerate(dialogues) if d.from_trace]
    if traced:
        rest = [i for i, d in enumerate(dialogues) if not d.from_trace]
        if not rest:
            return traced, {}, {}
        kept_rest, gone, judged_rest = _dedup_first_turns([dialogues[i] for i in rest], settings, tick)
        gone_back = {rest[b]: (rest[a], c) for b, (a, c) in gone.items()}
        return sorted(traced + [rest[i] for i in kept_rest]), gone_back, judged_rest

    langs = sorted({d.lang for d in dialogues})
    missing = [lang for lang in langs if lang not in settings.dedup_judges]
    if missing:
        raise ConfigError(
            f"no dedup judge for language(s) {', '.join(missing)}", field="HARNESS__CORPUS__DEDUP_JUDGES"
        )
    reference = [_Utt(t.user, d.lang) for d in dialogues for t in d.turns]
    judges = _judges(settings, reference, langs, tick)  # type: ignore[arg-type]
    threshold = settings.dedup_threshold
    kept: list[int] = []
    dropped: dict[int, tuple[int, float]] = {}
    described: dict[str, dict[str, object]] = {}
    for lang in langs:
        idx = [i for i, d in enumerate(dialogues) if d.lang == lang]
        judge = judges[lang]
        vecs = judge.vectors([dialogues[i].turns[0].user for i in idx])
        i_arr, j_arr, s_arr = judge.pairs(vecs, threshold - dedup_mod.MARGIN)
        alive = np.ones(len(idx), dtype=bool)
        for a, b, s in sorted(
            zip(i_arr.tolist(), j_arr.tolist(), s_arr.tolist(), strict=True), key=lambda x: (x[1], x[0])
        ):
            if alive[a] and alive[b]:  # the later one goes, the first-come one stays
                alive[b] = False
                dropped[idx[b]] = (idx[a], float(s))
        kept += [idx[p] for p in np.flatnonzero(alive)]
        described[lang] = {
            **judge.describe(),
            "threshold": threshold,
            "on": "first turn",
            "sessions": len(idx),
            "dropped": int((~alive).sum()),
        }
    return sorted(kept), dropped, described


@dataclass(frozen=True, slots=True)
class _Utt:
    """What a lexical judge's reference needs of an utterance."""

    text: str
    lang: str


def build_sessions(
    inputs: SessionBuildInputs,
    settings: CorpusSettings,
    progress: Callable[[str, int, int], None] | None = None,
) -> SessionBuildResult:
    """Build a session corpus into ``inputs.out``; deterministic for a seed."""
    tick = progress or (lambda phase, done, total: None)
    if not inputs.template.is_file():
        raise TemplateError("template file not found", file=inputs.template)
    renderer = PromptRenderer(
        [inputs.template.resolve().parent, *inputs.template_roots],
        max_output_chars=settings.max_output_chars,
        max_render_s=settings.max_render_s,
    )
    tmpl = load_template(inputs.template, renderer)
    logs = list(inputs.logs) if inputs.logs else list(DEFAULT_SESSION_LOGS)
    for p in logs:
        detect_session_format(p)  # an unknown format fails before anything is read in full
    timing = read_timing_trace(inputs.trace) if inputs.trace is not None else None
    tok = load_tokenizer(str(settings.tokenizer) if settings.tokenizer else None, settings.seed)
    tick("read logs", 0, 1)
    dialogues = read_dialogues(logs)
    tick("read logs", 1, 1)
    # A seeded order: --n takes a sample, not the head of the file; first-come dedup follows it.
    order = np.random.default_rng([settings.seed, 0x5E55]).permutation(len(dialogues))
    dialogues = [dialogues[i] for i in order]
    kept, dropped, judged = _dedup_first_turns(dialogues, settings, tick)
    n = inputs.n if inputs.n is not None else len(kept)
    chosen = kept[:n]
    template_sha = file_sha256(tmpl.files)
    records: list[CorpusRecord] = []
    t0 = min((d.turns[0].ts or 0.0 for d in dialogues if d.from_trace), default=0.0)
    for s, di in enumerate(chosen):
        d = dialogues[di]
        traced = d.from_trace
        if traced:
            d = materialize(d, tok)
        timing_s = timing.sessions[s % len(timing.sessions)] if timing else None
        if traced and timing_s is None:  # a trace's conversation starts when the trace says
            timing_s = SessionTiming((d.turns[0].ts or 0.0) - t0, ())
        thinks, sources = think_times(
            d, timing_s, inputs.think_time, settings.seed, timing.think_source if timing else "trace"
        )
        if traced:  # its turns' times are the trace's arrivals, sessions inferred from prefixes
            sources = [src if src != "log" else "trace-prefix" for src in sources]
        pairs: list[tuple[str, str]] = []
        sid = f"s{settings.seed}-{s:05d}"
        rng = np.random.default_rng([settings.seed, s, 0x7E])
        for k, turn in enumerate(d.turns, start=1):
            prompt, msgs, at = render_turn(tmpl, renderer, d, k, pairs)
            reply_text = turn.answer().text()
            reply_tokens = tok.count(reply_text) if reply_text else 0
            out_tokens = min(MAX_OUTPUT_TOKENS, max(32, math.ceil(reply_tokens * 1.5)))
            records.append(
                CorpusRecord(
                    id=f"{sid}-t{k:02d}",
                    tenant=settings.tenant,
                    prompt=prompt,
                    messages=msgs,
                    sampling=Sampling(temperature=settings.temperature, seed=int(rng.integers(2**31))),
                    max_tokens=out_tokens,
                    expected_output_tokens=reply_tokens,
                    arrival_offset_s=timing_s.start_s if (timing_s is not None and k == 1) else None,
                    tools=d.tools,
                    tool_choice=d.tool_choice if d.tools else None,
                    prefix_group=sid,
                    lang=d.lang,
                    domain=d.domain,
                    intent=d.intent if k == 1 else "tool_result" if turn.inputs else "follow_up",
                    provenance=Provenance(
                        seed=settings.seed,
                        candidate=int(order[di]),
                        template=tmpl.name,
                        template_sha256=template_sha,
                        query_source=d.source,
                        query_id=f"{d.id}-{k}",
                        query_at=turn.where or None,
                    ),
                    session=SessionTurn(
                        session_id=sid,
                        turn=k,
                        turns=len(d.turns),
                        user=turn.user,
                        think_time_s=round(thinks[k - 1], 6),
                        think_source=sources[k - 1],
                        history_at=at,
                        log_reply=turn.reply,
                        inputs=list(turn.inputs) if turn.inputs else None,
                        log_tool_calls=list(turn.calls) or None,
                    ),
                )
            )
            pairs.append((turn.user, turn.reply or ""))
        tick("render", s + 1, len(chosen))
    counts = tok.count_batch([r.text() for r in records])
    for r, c in zip(records, counts, strict=True):
        r.prompt_tokens = c
    per_session = session_rows(records, tok.count_batch)
    metrics = session_metrics(records, per_session)
    metrics.update(
        requested=n, shortfall=max(0, n - len(chosen)), candidates=len(dialogues), dropped=len(dropped)
    )
    if timing is not None:
        metrics["timing_trace"] = timing.summary()
    failures: list[str] = []
    if inputs.n is not None and len(chosen) < inputs.n:
        failures.append(
            f"only {len(chosen)} distinct sessions were possible from the dialogue logs "
            f"({len(dialogues)} dialogues, first turns at cosine < {settings.dedup_threshold}); "
            f"asked for {inputs.n}"
        )
    examples = [
        {"kept": dialogues[k].turns[0].user, "dropped": dialogues[b].turns[0].user, "cosine": round(c, 4)}
        for b, (k, c) in sorted(dropped.items())[:5]
    ]
    manifest = Manifest(
        created_at=datetime.now(UTC).isoformat(),
        seed=settings.seed,
        n=len(records),
        templates=[TemplateInfo(path=str(p), sha256=file_sha256([p])) for p in tmpl.files],
        embedder="none",
        embedder_dim=0,
        tokenizer=str(tok.path),
        block_size=settings.block_size,
        dedup={
            "threshold": settings.dedup_threshold,
            "on": "first turn",
            "candidates": len(dialogues),
            "dropped": len(dropped),
        },
        dedup_judges=judged,
        counts={
            "sessions": len(chosen),
            "records": len(records),
            "candidates": len(dialogues),
            "dropped": len(dropped),
        },
        inputs={
            "template": str(inputs.template),
            "fewshot": ", ".join(map(str, logs)),
            "trace": str(inputs.trace) if inputs.trace else None,
            "think_time": inputs.think_time.describe(),
            "trace_sessions": (
                None
                if timing is None
                else "{sessions} sessions ({multi_turn_sessions} of several turns) from {requests} lines, "
                "by {sessions_from}".format(**timing.summary())
            ),
        },
        sources=[
            {"file": str(p), "format": detect_session_format(p), "sha256": file_sha256([p])} for p in logs
        ],
        settings={
            "sessions": True,
            **{k: (str(v) if isinstance(v, Path) else v) for k, v in settings.model_dump().items()},
        },
    )
    quality_doc = {
        "metrics": metrics,
        "failures": failures,
        "sessions": per_session,
        "dedup_judges": judged,
        "dedup_examples": examples,
    }
    write_corpus_files(inputs.out, records, manifest, quality_doc)
    return SessionBuildResult(records, manifest, metrics, per_session, len(dropped), examples, failures)


def history_texts(r: CorpusRecord) -> list[str]:
    """The history part of a session turn's body, where ``session.history_at`` says it is."""
    if r.session is None:
        return []
    a, b = r.session.history_at
    if b <= a:
        return []
    if r.prompt is not None:
        return [r.prompt[a:b]]
    return [m.text() for m in (r.messages or [])[a:b]]


def session_rows(
    records: Sequence[CorpusRecord], count_batch: Callable[[list[str]], list[int]]
) -> list[dict[str, Any]]:
    """Per-session quality rows (``quality.json`` ``sessions``; ``harness corpus stats``), in order of
    first appearance: ``session_id``, ``dialogue`` (the log's id), ``lang``, ``turns``,
    ``history_tokens_max`` / ``_mean`` (tokens of each turn's history: messages' contents or the
    transcript, counted by ``count_batch``), ``prompt_tokens_max`` and ``think_time_s_sum``."""
    texts = [history_texts(r) for r in records]
    flat = count_batch([t for ts in texts for t in ts])
    rows: dict[str, dict[str, Any]] = {}
    hist: dict[str, list[int]] = {}
    at = 0
    for r, ts in zip(records, texts, strict=True):
        st = r.session
        n = sum(flat[at : at + len(ts)])
        at += len(ts)
        if st is None:
            continue
        row = rows.get(st.session_id)
        if row is None:
            qid = r.provenance.query_id or ""
            row = rows[st.session_id] = {
                "session_id": st.session_id,
                "dialogue": qid.rsplit("-", 1)[0] if qid else None,
                "lang": r.lang,
                "turns": 0,
                "prompt_tokens_max": None,
                "think_time_s_sum": 0.0,
            }
        row["turns"] += 1
        row["think_time_s_sum"] = round(row["think_time_s_sum"] + st.think_time_s, 6)
        if r.prompt_tokens is not None:
            row["prompt_tokens_max"] = max(row["prompt_tokens_max"] or 0, r.prompt_tokens)
        hist.setdefault(st.session_id, []).append(n)
    for sid, row in rows.items():
        h = hist[sid]
        row["history_tokens_max"] = max(h)
        row["history_tokens_mean"] = round(sum(h) / len(h), 1)
    return list(rows.values())


def session_metrics(records: Sequence[CorpusRecord], per_session: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Corpus-wide session metrics: sessions, turns per session, history and prompt tokens."""
    turns = [int(s["turns"]) for s in per_session]
    hist = [int(s["history_tokens_max"]) for s in per_session]
    thinks = [r.session.think_time_s for r in records if r.session is not None and r.session.turn > 1]
    prompt = [r.prompt_tokens for r in records if r.prompt_tokens is not None]
    by_source = Counter(
        ("log" if r.session.think_source in ("log", "trace", "trace-prefix") else "distribution")
        for r in records
        if r.session is not None and r.session.turn > 1
    )

    def pct(xs: Sequence[float], q: float) -> float | None:
        return round(float(percentile(list(xs), q)), 3) if xs else None

    return {
        "sessions": len(per_session),
        "records": len(records),
        "turns_mean": round(sum(turns) / len(turns), 2) if turns else None,
        "turns_p50": pct(turns, 50),
        "turns_max": max(turns, default=None),
        "history_tokens_max_p50": pct(hist, 50),
        "history_tokens_max_p95": pct(hist, 95),
        "history_tokens_max": max(hist, default=None),
        "prompt_tokens_p50": pct(prompt, 50),
        "prompt_tokens_max": max(prompt, default=None),
        "think_time_s_p50": pct(thinks, 50),
        "think_time_s_p95": pct(thinks, 95),
        "think_times_from": dict(by_source),
    }


def session_table(metrics: dict[str, Any]) -> list[tuple[str, str]]:
    """(metric, value) rows for the console."""
    return [(k, str(v)) for k, v in metrics.items()]


def _timestamped(path: Path, n: int, line: bytes) -> dict[str, Any]:
    """Line ``n`` of a Mooncake-style trace: a JSON object with a numeric ``timestamp`` (ms), or an
    ``InputError`` naming the file, line and field."""
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise InputError(f"invalid JSON ({exc.msg})", file=path, line=n) from None
    if not isinstance(obj, dict) or not isinstance(obj.get("timestamp"), int | float):
        raise InputError(
            "expected an object with a numeric 'timestamp' (ms)", file=path, line=n, field="timestamp"
        )
    return obj
