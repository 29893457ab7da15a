"""Dialogues: whole conversations read from dialogue logs, the input of a session corpus (``--sessions``).

A :class:`Dialogue` is one conversation of a log: its turns (:class:`DialogueTurn`: the user message,
or the messages that open the turn, the log's reply and its tool calls, timestamps where the log has
them) and what holds for the whole conversation (language, domain, intent, the venues it names, the
log's own system messages, the tools it offered). :mod:`harness.corpus.sessions` builds a session
corpus from them, one record per turn.

Dialogue logs (registry :data:`SESSION_READERS`, detected from content; :func:`read_dialogues`):

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
  tool results that answer the previous turn's calls;
* ``mooncake`` — a Mooncake-format trace (``timestamp``, ``input_length``, ``output_length``,
  ``hash_ids``; e.g. the FAST'25 tool and agent workload) as agent conversations: sessions inferred
  from growing ``hash_ids`` prefixes (:func:`harness.corpus.timing.chain_by_prefix`), lengths
  without text until :func:`materialize` writes texts of those lengths in the target's tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import orjson
from pydantic import Field, ValidationError

from harness.common.errors import InputError
from harness.common.formats import first_line, first_object
from harness.common.io import jsonl_lines, parse_jsonl_line
from harness.common.model import StrictModel
from harness.common.registry import Registry
from harness.corpus.logs import (
    CROSSWOZ_DOMAINS,
    CorpusReader,
    _most_common_first,
    crosswoz_intent,
    detect_format,
    detect_lang,
    iter_crosswoz,
    read_with,
)
from harness.corpus.model import Message, ToolCall, ToolFunction
from harness.corpus.timing import TraceRequest, _timestamped, _trace_request, chain_by_prefix
from harness.corpus.tokens import TargetTokenizer


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
