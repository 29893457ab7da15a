"""A chat model's generated text split, as it streams, into thinking, the answer and tool calls.

A chat template says what its model writes besides an answer (:class:`ChatSyntax`, read from the
template's text once per server):

* **thinking**: a template that mentions ``<think>`` marks its model's reasoning as
  ``<think>…</think>`` (DeepSeek-R1, Qwen3, SmolLM3 …). Text from an opening tag at the start of the
  output (or from the start, when the template's generation prompt opens the tag itself) to
  ``</think>`` is streamed as
  ``delta.reasoning_content``, the rest as ``content``; ``usage.completion_tokens_details.
  reasoning_tokens`` counts the tokens generated while thinking (the tags included);
* **tool calls**: a syntax of :data:`TOOL_SYNTAXES` whose marker the template mentions. ``hermes``
  (``<tool_call>{"name": …, "arguments": {…}}</tool_call>``: Hermes 2 Pro, Qwen2.5, Qwen3, the
  format vLLM's ``hermes`` parser reads) is the one known. When the request offers ``tools`` (and
  ``tool_choice`` is not ``none``), a call in that syntax is streamed as ``delta.tool_calls``: the
  call's id and name first, then its arguments in fragments as the model writes them, so a client
  times a tool call's tokens as it would an answer's. A call whose JSON does not parse is returned
  as the text the model wrote (content), as vLLM does.

A model whose template has neither (the random-init presets, SmolLM2) gets the passthrough: every
token's text is content, as before; ``GET /v1/models`` says which a model has
(:meth:`ChatSyntax.describe`). The parser holds back only the few characters that may be the start
of a marker (``<think``, ``</tool_ca`` …) until the next token shows whether they are; the response
cache stores the model's raw text, so a hit is split by the same parser into the same parts.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from harness.common.registry import Registry

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


@dataclass(frozen=True, slots=True)
class ToolSyntax:
    """How a model family writes a tool call: one JSON object between two markers."""

    name: str
    open: str
    close: str
    about: str


TOOL_SYNTAXES: Registry[ToolSyntax] = Registry("tool-call syntax")
TOOL_SYNTAXES.register("hermes")(
    ToolSyntax(
        "hermes",
        "<tool_call>",
        "</tool_call>",
        '<tool_call>{"name": …, "arguments": {…}}</tool_call> (Hermes 2 Pro, Qwen2.5, Qwen3)',
    )
)


@dataclass(frozen=True, slots=True)
class ChatSyntax:
    """What a chat template says its model writes besides an answer."""

    tools: ToolSyntax | None = None
    thinking: bool = False
    opened: bool = False
    """The generation prompt itself opens ``<think>`` (DeepSeek-R1): the output starts thinking."""

    @classmethod
    def of(cls, template: str, generation_prompt: str = "") -> ChatSyntax:
        """Read from a chat template's text: the first tool syntax whose opening marker it mentions,
        and whether it mentions ``<think>``; ``generation_prompt``: a conversation it rendered, which
        shows whether it opens the tag itself."""
        tools = next((s for _, s in TOOL_SYNTAXES.items() if s.open in template), None)
        thinking = THINK_OPEN in template
        opened = thinking and generation_prompt.rstrip().endswith(THINK_OPEN)
        return cls(tools=tools, thinking=thinking, opened=opened)

    def describe(self) -> dict[str, Any]:
        """The ``GET /v1/models`` block: what the model can do with tools and thinking, and why not."""
        return {
            "tool_calls": self.tools.name if self.tools is not None else None,
            "reasoning": "think" if self.thinking else None,
            "tools_accepted": True,
            "note": (
                f"tool calls in {self.tools.about} are returned as tool_calls"
                if self.tools is not None
                else "this model's chat template has no tool-call syntax: tools and tool_choice are "
                "accepted and passed to the template, and the answer is returned as content"
            ),
        }


Kind = Literal["content", "reasoning"]


@dataclass(slots=True)
class OutputDelta:
    """What one piece of generated text adds to each part of the answer."""

    content: str = ""
    reasoning: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    """Streamed ``delta.tool_calls`` entries: ``{"index", "id", "type", "function": {"name",
    "arguments"}}`` when a call starts, ``{"index", "function": {"arguments"}}`` after."""

    def __bool__(self) -> bool:
        return bool(self.content or self.reasoning or self.tool_calls)

    def add(self, other: OutputDelta) -> None:
        self.content += other.content
        self.reasoning += other.reasoning
        self.tool_calls += other.tool_calls


def _held(text: str, marker: str) -> int:
    """Length of the longest end of ``text`` that is a proper start of ``marker`` (to hold back)."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


_NAME_FIRST = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*(?=\{)')
"""The start of a call that streams: its name, then an arguments object (the usual order)."""
_TRAILING = re.compile(r"[\s}]*\Z")


def new_call_id() -> str:
    """A tool call id (``call_`` and 24 random hex digits): unique, not secret."""
    return f"call_{random.getrandbits(96):024x}"


@dataclass(slots=True)
class _Call:
    index: int
    id: str
    buf: str = ""
    name: str | None = None
    """Set once the name is streamed (the call is then streaming its arguments)."""
    args_at: int = 0
    """Where the arguments start in ``buf``."""
    sent: int = 0
    """Characters of the arguments already streamed."""


class ChatOutput:
    """One response's parser: :meth:`feed` each token's text, :meth:`finish` at the end."""

    def __init__(self, syntax: ChatSyntax, *, parse_tools: bool = False) -> None:
        self.syntax = syntax
        self.tools = syntax.tools if parse_tools else None
        self._state: Literal["start", "think", "answer", "call"] = (
            "think" if syntax.opened else "start" if syntax.thinking else "answer"
        )
        self._buf = ""
        self._call: _Call | None = None
        self.calls: list[dict[str, Any]] = []
        """Finished calls (assistant-message shape: id, type, function name and arguments)."""
        self.reasoning_tokens = 0
        self._gap = ""
        """Whitespace after a tool call: dropped if another call or the end follows."""

    @property
    def passthrough(self) -> bool:
        """Nothing to parse: every token's text is content."""
        return self._state == "answer" and self.tools is None and not self._buf

    def feed(self, text: str) -> OutputDelta:
        """The parts one token's text adds (a token counts as thinking when the parser thought
        before or after it)."""
        was = self._state
        out = OutputDelta()
        self._buf += text
        self._run(out, final=False)
        if was == "think" or self._state == "think":
            self.reasoning_tokens += 1
        return out

    def finish(self) -> OutputDelta:
        """Whatever was held back, now that no more text comes."""
        out = OutputDelta()
        self._run(out, final=True)
        return out

    def parse(self, text: str) -> OutputDelta:
        """A whole text at once (a response that is not streamed)."""
        out = self.feed(text)
        out.add(self.finish())
        return out

    # ------------------------------------------------------------------------------ the machine

    def _run(self, out: OutputDelta, *, final: bool) -> None:
        while True:
            state = self._state
            if state == "start":
                head = self._buf.lstrip()
                if head.startswith(THINK_OPEN):
                    self._buf = head[len(THINK_OPEN) :]
                    self._state = "think"
                elif THINK_OPEN.startswith(head) and not final and head:
                    return  # maybe the tag, not whole yet
                elif not head and not final:
                    return
                else:
                    self._state = "answer"
            elif state == "think":
                at = self._buf.find(THINK_CLOSE)
                if at >= 0:
                    out.reasoning += self._buf[:at]
                    self._buf = self._buf[at + len(THINK_CLOSE) :]
                    self._state = "answer"
                    continue
                keep = 0 if final else _held(self._buf, THINK_CLOSE)
                out.reasoning += self._buf[: len(self._buf) - keep]
                self._buf = self._buf[len(self._buf) - keep :]
                return
            elif state == "answer":
                if self.tools is None:
                    out.content += self._buf
                    self._buf = ""
                    return
                marker = self.tools.open
                at = self._buf.find(marker)
                if at >= 0:
                    self._text(out, self._buf[:at], call_follows=True)
                    self._buf = self._buf[at + len(marker) :]
                    self._call = _Call(len(self.calls), new_call_id())
                    self._state = "call"
                    continue
                keep = 0 if final else _held(self._buf, marker)
                self._text(out, self._buf[: len(self._buf) - keep], call_follows=False)
                self._buf = self._buf[len(self._buf) - keep :]
                if final and not self.calls:
                    out.content += self._gap  # an answer's own trailing whitespace
                if final:
                    self._gap = ""
                return
            else:  # call
                self._run_call(out, final=final)
                if self._state == "call":
                    return

    def _text(self, out: OutputDelta, text: str, *, call_follows: bool) -> None:
        """Answer text, less its trailing whitespace, which waits to see what follows: before a tool
        call it is dropped, before more text (or at the end of an answer without calls) it is sent."""
        body = text.rstrip()
        if body:
            out.content += self._gap + body
            self._gap = ""
        self._gap += text[len(body) :]
        if call_follows:
            self._gap = ""

    def _run_call(self, out: OutputDelta, *, final: bool) -> None:
        call = self._call
        assert call is not None and self.tools is not None
        close = self.tools.close
        call.buf += self._buf
        self._buf = ""
        at = call.buf.find(close)
        body = call.buf if at < 0 else call.buf[:at]
        if call.name is None:
            m = _NAME_FIRST.match(body)
            if m is not None:  # the name is whole and the arguments (an object) follow: stream them
                call.name, call.args_at = _unescape(m.group(1)), m.end()
                out.tool_calls.append(
                    {"index": call.index, "id": call.id, "type": "function",
                     "function": {"name": call.name, "arguments": ""}}
                )  # fmt: skip
        if at >= 0:
            rest = call.buf[at + len(close) :]
            call.buf = body
            self._close_call(out, call)
            self._call = None
            self._state = "answer"
            self._buf = rest
            return
        if final:  # cut off (max_tokens) inside a call
            if call.name is None:
                out.content += self.tools.open + call.buf
            else:
                self._stream_args(out, call, call.buf[call.args_at :])
            self._call = None
            self._state = "answer"
            return
        if call.name is None:
            return  # the name is not whole yet, or the call is in another order: wait for its end
        # Stream the arguments, less what may be the wrapper's closing brace or the close marker.
        args = call.buf[call.args_at :]
        args = args[: len(args) - _held(args, close)]
        args = args[: _TRAILING.search(args).start()]  # type: ignore[union-attr]  # always matches
        self._stream_args(out, call, args)

    def _stream_args(self, out: OutputDelta, call: _Call, args: str) -> None:
        new = args[call.sent :]
        if new:
            out.tool_calls.append({"index": call.index, "function": {"arguments": new}})
            call.sent += len(new)

    def _close_call(self, out: OutputDelta, call: _Call) -> None:
        assert self.tools is not None
        try:
            obj = orjson.loads(call.buf)
        except orjson.JSONDecodeError:
            obj = None
        name = obj.get("name") if isinstance(obj, dict) else None
        if not isinstance(name, str) or not name:
            if call.name is None:  # not a call after all: what the model wrote is the answer
                out.content += self.tools.open + call.buf + self.tools.close
                return
            name = call.name
        if call.name is None:  # not streamed (another key order, string arguments): all at once
            raw = obj.get("arguments", obj.get("parameters", {})) if isinstance(obj, dict) else {}
            args = raw if isinstance(raw, str) else orjson.dumps(raw).decode()
            out.tool_calls.append(
                {"index": call.index, "id": call.id, "type": "function",
                 "function": {"name": name, "arguments": args}}
            )  # fmt: skip
        else:
            text = call.buf[call.args_at :].rstrip()
            text = text[:-1].rstrip() if text.endswith("}") else text  # the wrapper's own brace
            self._stream_args(out, call, text)
            args = text
        self.calls.append({"id": call.id, "type": "function", "function": {"name": name, "arguments": args}})


def _unescape(s: str) -> str:
    try:
        out = orjson.loads(f'"{s}"')
    except orjson.JSONDecodeError:
        return s
    return out if isinstance(out, str) else s
