"""On-disk documents of the corpus stage: the request record, its manifest, and the few-shot log line.

``corpus.jsonl`` holds one :class:`CorpusRecord` per line and is what the load stage replays; it
reads it back with :func:`read_corpus` (validated, ``extra="forbid"``, errors name file and line).
The generator's structured inputs travel in :attr:`CorpusRecord.variables` so quality can be
recomputed from the file alone (``harness corpus stats``); the load stage may ignore them.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from harness.common.io import iter_jsonl
from harness.common.model import StrictModel
from harness.common.openai import Endpoint

CORPUS_FILE = "corpus.jsonl"
MANIFEST_FILE = "manifest.json"
QUALITY_FILE = "quality.json"


class ToolFunction(StrictModel):
    name: str = Field(min_length=1)
    arguments: str = "{}"
    """The arguments as the model wrote them: a JSON object, as a string (OpenAI's shape)."""


class ToolCall(StrictModel):
    """One tool call of an assistant message (OpenAI shape)."""

    id: str = Field(min_length=1)
    type: Literal["function"] = "function"
    function: ToolFunction


class Message(StrictModel):
    """One chat message: ``system``, ``user``, ``assistant`` (its ``tool_calls`` too) or ``tool`` (a
    tool's result, answering the call ``tool_call_id``)."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    """The text; an assistant message that only calls tools has none (``null`` in a log reads as "")."""
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _no_content(cls, v: object) -> object:
        return "" if v is None else v

    @model_validator(mode="after")
    def _tool_fields(self) -> Message:
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs the 'tool_call_id' of the call it answers")
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only an assistant message has 'tool_calls'")
        return self

    def wire(self) -> dict[str, Any]:
        """The message as a request carries it (OpenAI shape: ``content`` null beside tool calls)."""
        out = self.model_dump(exclude_none=True)
        if self.tool_calls and not self.content:
            out["content"] = None
        return out

    def text(self) -> str:
        """What the model reads of it: its content, and each tool call as ``name arguments``."""
        calls = " ".join(f"{c.function.name} {c.function.arguments}" for c in self.tool_calls or [])
        return f"{self.content} {calls}".strip() if calls else self.content


class Sampling(StrictModel):
    """Sampling parameters sent with the request (OpenAI-compatible names)."""

    temperature: float = Field(default=0.7, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: int | None = None
    stop: list[str] = Field(default_factory=list)


class Profile(StrictModel):
    user_id: str
    name: str
    locale: str
    lang: Literal["en", "zh"]
    birth_date: str
    """ISO date."""
    city: str
    region: str
    email: str
    phone: str
    tier: str
    signup_at: str
    """ISO datetime with offset."""


class HistoryEvent(StrictModel):
    ts: str
    """ISO datetime with offset."""
    action: str
    detail: str = ""


class Session(StrictModel):
    session_id: str
    start: str
    end: str
    """The session window; every history event lies inside it."""
    events: list[HistoryEvent]


class RequestVariables(StrictModel):
    """The structured inputs the template was rendered from."""

    profile: Profile
    session: Session
    request_at: str
    """When the request is made: after the last history event, inside the session window."""
    domain: str
    intent: str
    query: str
    constraints: dict[str, str | int | float]
    fewshot_ids: list[str] = Field(default_factory=list)


class Fill(StrictModel):
    """What a prompt was brought to its target length with, in tokens of the target tokenizer (the
    order material is added in: real history, catalogue entries, few-shot examples, then filler)."""

    history: int = Field(default=0, ge=0)
    """Earlier turns of the query's own dialogue."""
    catalog: int = Field(default=0, ge=0)
    """Catalogue entries relevant to the query, as retrieved context."""
    fewshot: int = Field(default=0, ge=0)
    """Further few-shot examples from the pool."""
    filler: int = Field(default=0, ge=0)
    """Filler words (only when the real material ran out; placed after the instructions)."""


class Provenance(StrictModel):
    generator: str = "harness.corpus"
    seed: int
    candidate: int
    """Index of the candidate this record was generated as (before dedup)."""
    template: str
    template_sha256: str
    source: str | None = None
    """``format:file`` of the trace request it reproduces, if any."""
    source_line: int | None = None
    source_trace_id: str | None = None
    fitted: Literal["exact", "filled", "padded", "truncated", "none"] = "none"
    """How the prompt was fitted to the target input tokens: ``filled`` with real material only,
    ``padded`` when filler words were needed too (see :attr:`fill`)."""
    fill: Fill | None = None
    """Tokens added per kind of material to reach the target (``None``: nothing was added)."""
    query_source: str | None = None
    """``format:file`` of the request log the query was taken from."""
    query_id: str | None = None
    """The query's id in that log (CLINC150: ``split-row``, CrossWOZ: ``dialogue-turn``)."""
    query_at: str | None = None
    """Where in the log: ``line 12``, ``test[3]`` or ``"10312".messages[4]``."""


class SessionTurn(StrictModel):
    """A record's place in a conversation (``harness corpus build --sessions``).

    The record's body holds the turn as the corpus rendered it: the system prompt and retrieved
    context, the history of turns ``1 … turn−1`` from ``history_source``, then ``user``. A replay with
    live history (:mod:`harness.load.sessions`) swaps ``history_at`` for the turns the target answered.
    """

    session_id: str
    turn: int = Field(ge=1)
    """1-based position in the session."""
    turns: int = Field(ge=1)
    """Turns of the session in this corpus."""
    user: str = ""
    """This turn's user message, verbatim from the log ("" for a turn opened by tool results alone)."""
    inputs: list[Message] | None = None
    """The messages that open this turn when they are not one user message: the results of the tool
    calls the previous turn made (and a user message after them, if any), verbatim from the log. They
    sit in the body right after the history (``history_at``'s end). ``None``: a user message opens it."""
    think_time_s: float = Field(ge=0.0)
    """Seconds between the previous turn's answer and this turn (0 for the first turn)."""
    think_source: str
    """Where ``think_time_s`` came from: ``log`` (timestamps), ``trace`` (a timing trace's session
    ids), ``trace-prefix`` (a timing trace's sessions inferred from ``hash_ids``) or the stated
    distribution."""
    history_source: Literal["live", "log"] = "log"
    """Whose answers the history in this body holds: the log's (as built) or the target's (replayed)."""
    history_at: tuple[int, int]
    """Where the history sits in the body: a message index range (chat) or a character range of the
    prompt (completions), end exclusive; empty for the first turn."""
    log_reply: str | None = None
    """The log's answer to this turn (what ``history_source: log`` puts in later turns)."""
    log_tool_calls: list[ToolCall] | None = None
    """The tool calls of the log's answer to this turn: the next turn's ``inputs`` answer them, and
    a live replay matches the target's calls against them (:mod:`harness.load.sessions`)."""

    @model_validator(mode="after")
    def _opened(self) -> SessionTurn:
        if not self.user and not self.inputs:
            raise ValueError("a turn is opened by a user message ('user') or by tool results ('inputs')")
        return self

    def opener(self) -> list[Message]:
        """The messages that open this turn (its ``inputs``, or its user message)."""
        return list(self.inputs) if self.inputs else [Message(role="user", content=self.user)]


class SessionCall(StrictModel):
    """A record's place in an agent session replayed as its trace's call graph (``harness corpus
    graph``, from ``harness traces graph``).

    The session is one arrival; within it this call is sent ``gap_s`` after the last of the calls it
    waits for (``after``) has ended, or ``gap_s`` after the session's start when it waits for none.
    Calls whose waits are over at the same time go out at once, each on a connection of its own.
    Where this call's recorded input holds the recorded answer of an earlier call (``uses``), a replay
    puts the target's live answer in its place (:mod:`harness.load.sessions`), so the prompt grows as
    the real one did. A call whose predecessor failed is not sent: it fails, naming that call.
    """

    session_id: str
    """The trace this session comes from (its trace id)."""
    call: int = Field(ge=1)
    """1-based position in the session, in the order the calls started in the trace."""
    calls: int = Field(ge=1)
    """Calls of the session in this corpus."""
    after: list[int] = Field(default_factory=list)
    """The calls (1-based, each before this one) whose answers must have ended before this call is
    sent; empty: it waits only for the session's start."""
    uses: list[int] = Field(default_factory=list)
    """The earlier calls whose recorded answer (:attr:`log_output`) this call's body holds."""
    gap_s: float = Field(ge=0.0)
    """Seconds after the last of ``after`` ended (tool and retrieval time, think time), or after the
    session's start for a call that waits for none."""
    depth: int = Field(default=0, ge=0)
    """Calls on the longest chain of waits before this one (0: a root)."""
    log_output: str | None = None
    """This call's recorded answer text: what the bodies of the calls that use it hold."""
    name: str = ""
    """The span's name in the trace (``chat gpt-4o``)."""
    agent: str | None = None
    """``gen_ai.agent.name`` of the call or the agent span around it."""
    recorded_ms: float | None = Field(default=None, ge=0.0)
    """The call's duration in the trace."""
    cold: bool | None = None
    """Whether the session's trace had a cold path (``harness traces coldpaths``); ``None``: not said."""

    @model_validator(mode="after")
    def _earlier(self) -> SessionCall:
        if self.call > self.calls:
            raise ValueError(f"call {self.call} of a session of {self.calls} calls")
        for name, refs in (("after", self.after), ("uses", self.uses)):
            if any(not 1 <= r < self.call for r in refs):
                raise ValueError(f"{name!r} must name earlier calls (1 … {self.call - 1}); got {refs}")
        return self


class CorpusRecord(StrictModel):
    """One synthetic request; exactly one of ``prompt`` / ``messages`` is set."""

    id: str
    tenant: str = "default"
    scenario: str | None = None
    prompt: str | None = None
    messages: list[Message] | None = None
    sampling: Sampling = Field(default_factory=Sampling)
    max_tokens: int = Field(ge=1)
    expected_output_tokens: int = Field(ge=0)
    arrival_offset_s: float | None = Field(default=None, ge=0.0)
    prefix_group: str | None = None
    """Requests with the same group share a leading run of prompt text (from trace ``hash_ids``)."""
    prefix_tokens: int = Field(default=0, ge=0)
    prefix_block_ids: list[int] = Field(default_factory=list)
    """The trace's ``hash_ids`` whose shared text the prompt opens with, in order (each
    ``prefix_tokens / len`` tokens): the keys a KV-block cache simulation of this corpus looks up."""
    prompt_tokens: int | None = Field(default=None, ge=0)
    """Prompt length under the target tokenizer (for messages: the concatenated contents)."""
    target_input_tokens: int | None = Field(default=None, ge=0)
    lang: Literal["en", "zh"]
    domain: str
    intent: str
    variables: RequestVariables | None = None
    provenance: Provenance
    session: SessionTurn | None = None
    """Set on session corpora (``--sessions``): the turn of a conversation this record is."""
    call: SessionCall | None = None
    """Set on agent-session corpora (``harness corpus graph``): the call of a trace's call graph
    this record is."""
    tools: list[dict[str, Any]] | None = None
    """Tools the request offers (OpenAI ``tools``: ``{"type": "function", "function": {name,
    description, parameters}}``); sent with chat requests only."""
    tool_choice: str | dict[str, Any] | None = None
    """``auto``, ``none``, ``required`` or ``{"type": "function", "function": {"name": …}}``; sent only
    when set, and only with ``tools``."""

    @model_validator(mode="after")
    def _one_body(self) -> CorpusRecord:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("exactly one of 'prompt' and 'messages' must be set")
        if self.session is not None and self.call is not None:
            raise ValueError(
                "a record is a conversation's turn ('session') or a graph's call ('call'), not both"
            )
        return self

    def text(self) -> str:
        """The prompt, or the message contents (and tool calls) joined as the target would see them."""
        if self.prompt is not None:
            return self.prompt
        return "\n".join(m.text() for m in self.messages or [])

    def to_request(
        self,
        api: Endpoint | None = None,
        *,
        model: str | None = None,
        max_tokens_cap: int | None = None,
        stream: bool = True,
    ) -> tuple[Endpoint, dict[str, Any]]:
        """The OpenAI request body that replays this record, and the endpoint it goes to.

        ``api`` defaults to the record's own shape (``messages`` → chat, ``prompt`` → completions);
        forcing the other sends a prompt as one user message, or the messages' text as a prompt.
        ``tools`` and ``tool_choice`` go with a chat request (a completions request has no place for
        them). Every sampling field is sent (``stop`` only when non-empty); ``max_tokens`` is capped at
        ``max_tokens_cap``. A streamed body asks for ``usage`` in the last chunk, which is where the
        load stage gets its token counts from.
        """
        endpoint: Endpoint = api or ("chat.completions" if self.messages is not None else "completions")
        body: dict[str, Any] = {}
        if model is not None:
            body["model"] = model
        if endpoint == "chat.completions":
            msgs = self.messages if self.messages is not None else [Message(role="user", content=self.text())]
            body["messages"] = [m.wire() for m in msgs]
            if self.tools:
                body["tools"] = self.tools
                if self.tool_choice is not None:
                    body["tool_choice"] = self.tool_choice
        else:
            body["prompt"] = self.text()
        body["max_tokens"] = min(self.max_tokens, max_tokens_cap) if max_tokens_cap else self.max_tokens
        body.update(self.sampling.model_dump(exclude_none=True))
        if not body.get("stop"):
            body.pop("stop", None)
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        return endpoint, body


class TemplateInfo(StrictModel):
    path: str
    sha256: str


class Manifest(StrictModel):
    version: Literal[1] = 1
    created_at: str
    seed: int
    n: int
    templates: list[TemplateInfo]
    embedder: str
    embedder_dim: int
    tokenizer: str
    block_size: int
    dedup: dict[str, float | int | str]
    dedup_judges: dict[str, dict[str, object]] = Field(default_factory=dict)
    """Per language: which judge decided near-duplicates (method, model or n-grams), and its counts."""
    counts: dict[str, int]
    inputs: dict[str, str | None]
    sources: list[dict[str, str]] = Field(default_factory=list)
    """The request logs read: file, detected format, SHA-256."""
    fewshot: dict[str, object] = Field(default_factory=dict)
    settings: dict[str, object] = Field(default_factory=dict)


class FewShotLogEntry(StrictModel):
    """One line of the harness's JSONL request log (few-shot pool and queries)."""

    id: str
    text: str = Field(min_length=1)
    confidence: float = Field(ge=0.0, le=1.0)
    domain: str | None = None
    lang: str | None = None
    response: str | None = None
    ts: datetime | None = None
    intent: str | None = None


def read_corpus(path: str | Path) -> Iterator[CorpusRecord]:
    """Stream validated records from a ``corpus.jsonl`` (or a corpus directory)."""
    p = Path(path)
    if p.is_dir():
        p = p / CORPUS_FILE
    for _, record in iter_jsonl(p, CorpusRecord, expected="a corpus record"):
        yield record
