"""The replay graph of an agent trace: its LLM calls, which waits for which, and what each sent.

A trace of an agent (OpenTelemetry GenAI semantic conventions) records more than a mix of requests:
which LLM call waited for which, which ran side by side, how long the tools and retrievals between
them took, and whose output went into whose prompt. :func:`replay_graph` keeps that, one
:class:`SessionGraph` per trace, so a replay can send the calls as the agent did.

**The calls** are the spans whose ``gen_ai.operation.name`` is ``chat``, ``text_completion`` or
``generate_content`` (an SDK that writes no operation name: a span with ``gen_ai.request.model`` and
recorded usage or content; Claude Code's own ``claude_code.llm_request`` spans, whose usage is read
from their ``input_tokens``, ``cache_read_tokens``, ``cache_creation_tokens`` and
``output_tokens``). Call spans nested in one another (a framework's ``call_llm`` around the SDK's
``openai.chat``, both instrumented) are one call: the innermost, the one nearest the wire, is kept,
with what it lacks (model, usage) from the nearest span around it. (The outer span may hold more
than the call: the agent kits time the tools the answer asked for inside it.)

**Who waits for whom.** Call B depends on call A when

* A *ended before B started* (by the recorded times: the agent had A's answer when it sent B), or
* B's recorded input holds A's recorded output (at least :data:`MIN_SHARED_CHARS` characters): B was
  built from A's answer whatever the clocks say (skewed clocks cannot reorder content). Such an edge
  is marked ``uses_output``: a replay substitutes A's live output there.

Only the direct dependencies are kept (the transitive reduction): C after B after A is the chain
A → B → C, not also A → C. Calls that overlap in time and share no content are parallel branches
(fan-out); a call with several direct predecessors waits for all of them (fan-in).

**The gap** before a call is what the agent did between its last predecessor's end and its start
(tools, retrievals, thinking): ``start − max(predecessor end)``, or from the trace's start for a call
with none; clipped at 0 (a content edge across skewed clocks) and at ``max_gap_ms`` when given.

**The request** of a call: its system instructions and input messages as OpenAI chat messages
(``gen_ai.system_instructions``, ``gen_ai.input.messages``; the older flattened
``gen_ai.prompt.N.role`` / ``.content`` / ``.tool_calls.M.*`` / ``.tool_call_id`` attributes, or a
single ``gen_ai.prompt`` string), its tool definitions (``gen_ai.tool.definitions``, or the flattened
``llm.request.functions.N.*``), ``temperature``, and as ``max_tokens`` the recorded output
tokens (``gen_ai.usage.output_tokens``, else the requested ``gen_ai.request.max_tokens``), so a replay
generates as much as the agent's model did. A call without recorded content keeps its token counts
(``content: false``): its text comes from the corpus at replay. Span events (the semantic
conventions' older event form) are not read by the trace readers, so their content counts as absent.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any, Literal

from pydantic import Field

from harness.common.model import StrictModel
from harness.traces.model import Span, TagValue, Trace

LLM_OPERATIONS = frozenset({"chat", "text_completion", "generate_content"})
"""``gen_ai.operation.name`` values of a call to a model (``invoke_agent``, ``execute_tool``,
``embeddings`` … are not replayed as LLM calls)."""
MIN_SHARED_CHARS = 24
"""The shortest recorded output that counts as carried into a later input: shorter ones ("OK", a
name) appear in prompts by chance."""


class ChatMessage(StrictModel):
    """One OpenAI chat message of a call's request."""

    role: str
    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class CallRequest(StrictModel):
    """What a call sends: an OpenAI chat request's body, but for ``model`` (the target's at replay)."""

    messages: list[ChatMessage] = Field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    max_tokens: int | None = None
    temperature: float | None = None


class GraphCall(StrictModel):
    """One LLM call of a session, with its place in the graph."""

    id: str
    """The span id."""
    name: str
    """The span's operation name (``chat model-a``)."""
    model: str | None = None
    """``gen_ai.request.model`` (a replay sends the target's model)."""
    agent: str | None = None
    """The ``gen_ai.agent.name`` of the nearest ``invoke_agent`` span above it."""
    depth: int = 0
    """Calls on the longest chain of predecessors before it (0: a root of the graph)."""
    depends_on: list[str] = Field(default_factory=list)
    """Direct predecessors (span ids): it is sent after all of them have ended, plus :attr:`gap_ms`."""
    uses_output: list[str] = Field(default_factory=list)
    """Predecessors whose recorded output its recorded input holds (substituted live at replay)."""
    gap_ms: float = 0.0
    """Recorded time from its last predecessor's end (or the session's start) to its start."""
    offset_ms: float = 0.0
    """Recorded start, from the session's start."""
    duration_ms: float = 0.0
    input_tokens: int | None = None
    output_tokens: int | None = None
    cached_tokens: int | None = None
    """``gen_ai.usage.cache_read.input_tokens``: the provider's prompt-cache hit."""
    content: bool = False
    """Its input messages were recorded (otherwise the corpus supplies the text at replay)."""
    request: CallRequest = Field(default_factory=CallRequest)
    output: str | None = None
    """The recorded output text (what a successor's input may hold)."""
    error: bool = False


class SessionGraph(StrictModel):
    """The LLM calls of one trace (one agent session) and their dependencies."""

    session: str
    """The trace id."""
    source: str = ""
    start_us: int = 0
    """The trace's start: the session's arrival."""
    calls: list[GraphCall] = Field(default_factory=list)
    makespan_ms: float = 0.0
    """Recorded time from the session's start to its last call's end."""
    critical_path_ms: float = 0.0
    """The longest chain of gaps and call durations through the graph: equals :attr:`makespan_ms`
    when the graph explains the recorded timing (less when gaps were capped)."""
    edges_by: dict[Literal["time", "content"], int] = Field(default_factory=dict)
    """How many dependencies each rule found (an edge both found counts under ``content``)."""
    cold: bool | None = None
    """The trace has a cold path (``harness traces coldpaths``); ``None``: not known."""

    def fan_out(self) -> int:
        """The most calls that depend directly on one call, or that start the session together."""
        counts: dict[str, int] = {}
        for c in self.calls:
            for p in c.depends_on or ["<start>"]:
                counts[p] = counts.get(p, 0) + 1
        return max(counts.values(), default=0)

    def fan_in(self) -> int:
        """The most direct predecessors one call waits for."""
        return max((len(c.depends_on) for c in self.calls), default=0)


def replay_graph(trace: Trace, *, max_gap_ms: float | None = None) -> SessionGraph:
    """The :class:`SessionGraph` of ``trace`` (the module docstring's rules); no calls: an empty one."""
    spans = [s for s in trace.spans.values() if _is_call(s)]
    parent = _parents(trace)
    ids = {s.span_id for s in spans}
    # The innermost call span of a nest is the call; the spans around it are wrappers.
    wrappers = {a for s in spans for a in _ancestors(s.span_id, parent) if a in ids}
    calls = sorted((s for s in spans if s.span_id not in wrappers), key=lambda s: (s.start_us, s.span_id))
    start = trace.start_us
    nodes = [
        _call(s, trace, parent, start, [a for a in _ancestors(s.span_id, parent) if a in ids]) for s in calls
    ]
    inputs = [_input_text(n) for n in nodes]
    # Every pair of calls is compared (times, and an output searched for in a later input): quadratic
    # in the calls of one trace, which an agent's session holds tens or hundreds of, not thousands.
    preds: list[set[int]] = []
    content: list[set[int]] = []
    for j, b in enumerate(calls):
        by_time = {i for i, a in enumerate(calls[:j]) if a.end_us <= b.start_us}
        by_content = {
            i
            for i in range(j)
            if (out := nodes[i].output) and len(out) >= MIN_SHARED_CHARS and out in inputs[j]
        }
        preds.append(by_time | by_content)
        content.append(by_content)
    direct = _reduce(preds)
    edges: dict[Literal["time", "content"], int] = {"time": 0, "content": 0}
    depth: list[int] = []
    for j, (node, span) in enumerate(zip(nodes, calls, strict=True)):
        ds = sorted(direct[j])
        node.depends_on = [calls[i].span_id for i in ds]
        node.uses_output = [calls[i].span_id for i in sorted(content[j])]
        for i in ds:
            edges["content" if i in content[j] else "time"] += 1
        ready = max((calls[i].end_us for i in ds), default=start)
        gap = max(0.0, (span.start_us - ready) / 1000.0)
        node.gap_ms = min(gap, max_gap_ms) if max_gap_ms is not None else gap
        depth.append(1 + max((depth[i] for i in ds), default=-1))
        node.depth = depth[j]
    finish: list[float] = []
    for j, node in enumerate(nodes):
        begin = max((finish[i] for i in direct[j]), default=0.0) + node.gap_ms
        finish.append(begin + node.duration_ms)
    makespan = max(((s.end_us - start) / 1000.0 for s in calls), default=0.0)
    return SessionGraph(
        session=trace.trace_id, source=trace.source, start_us=start, calls=nodes,
        makespan_ms=round(makespan, 3), critical_path_ms=round(max(finish, default=0.0), 3), edges_by=edges,
    )  # fmt: skip


def replay_graphs(
    traces: Iterable[Trace],
    *,
    max_gap_ms: float | None = None,
    cold: Collection[str] | None = None,
    sessions: Literal["all", "cold", "warm"] = "all",
) -> Iterator[SessionGraph]:
    """One :class:`SessionGraph` per trace that has LLM calls. ``cold``: the ids of the traces with a
    cold path (each graph's :attr:`~SessionGraph.cold` says whether it is one); ``sessions`` keeps
    the cold ones, the warm ones or all (``cold`` or ``warm`` need ``cold``)."""
    if sessions != "all" and cold is None:
        raise ValueError("choosing cold or warm sessions needs the cold traces' ids")
    for trace in traces:
        g = replay_graph(trace, max_gap_ms=max_gap_ms)
        if cold is not None:
            g.cold = trace.trace_id in cold
        if g.calls and (sessions == "all" or g.cold == (sessions == "cold")):
            yield g


# ---- the graph --------------------------------------------------------------------------------------


def _reduce(preds: Sequence[set[int]]) -> list[set[int]]:
    """The transitive reduction of a DAG given as each node's predecessors (all earlier in order):
    drop ``i`` from ``j``'s when ``i`` is already an ancestor of another predecessor of ``j``."""
    ancestors: list[set[int]] = []
    direct: list[set[int]] = []
    for p in preds:
        implied = set().union(*(ancestors[i] for i in p)) if p else set()
        direct.append(p - implied)
        ancestors.append(p | implied)
    return direct


def _parents(trace: Trace) -> dict[str, str]:
    return {child: sid for sid, kids in trace.children.items() for child in kids}


def _ancestors(sid: str, parent: Mapping[str, str]) -> Iterable[str]:
    seen: set[str] = set()
    while (sid := parent.get(sid, "")) and sid not in seen:
        seen.add(sid)
        yield sid


# ---- one call ---------------------------------------------------------------------------------------


def _is_call(span: Span) -> bool:
    op = span.tags.get("gen_ai.operation.name")
    if op is not None:
        return str(op) in LLM_OPERATIONS
    tags = _usage(span.tags)
    recorded = any(k.startswith(("gen_ai.usage.", "gen_ai.prompt", "gen_ai.input.")) for k in tags)
    return "gen_ai.request.model" in tags and recorded


def _call(
    span: Span, trace: Trace, parent: Mapping[str, str], start: int, around: Sequence[str]
) -> GraphCall:
    # The call's own attributes first, then what the wrappers around it add (nearest first).
    tags: dict[str, TagValue] = {}
    for sid in reversed(around):
        tags.update(trace.spans[sid].tags)
    tags.update(_usage(span.tags))
    messages = _messages(tags)
    output = _output_text(tags)
    out_tokens = _int(tags.get("gen_ai.usage.output_tokens", tags.get("gen_ai.usage.completion_tokens")))
    requested = _int(tags.get("gen_ai.request.max_tokens"))
    agent = next(
        (
            str(trace.spans[a].tags["gen_ai.agent.name"])
            for a in _ancestors(span.span_id, parent)
            if a in trace.spans and "gen_ai.agent.name" in trace.spans[a].tags
        ),
        None,
    )
    temperature = tags.get("gen_ai.request.temperature")
    return GraphCall(
        id=span.span_id, name=span.operation, model=_str(tags.get("gen_ai.request.model")), agent=agent,
        offset_ms=(span.start_us - start) / 1000.0, duration_ms=span.duration_us / 1000.0,
        input_tokens=_int(tags.get("gen_ai.usage.input_tokens", tags.get("gen_ai.usage.prompt_tokens"))),
        output_tokens=out_tokens, cached_tokens=_int(tags.get("gen_ai.usage.cache_read.input_tokens")),
        content=bool(messages), output=output, error=span.error,
        request=CallRequest(
            messages=messages, tools=_tools(tags), max_tokens=out_tokens or requested,
            temperature=float(temperature) if isinstance(temperature, int | float) else None,
        ),
    )  # fmt: skip


def _usage(tags: Mapping[str, TagValue]) -> Mapping[str, TagValue]:
    """``tags`` with the usage that Claude Code's own tracing records (``span.type: llm_request``;
    ``input_tokens`` counts only the uncached part, beside ``cache_read_tokens`` and
    ``cache_creation_tokens``) in the semantic conventions' names: the input is all three, as
    ``gen_ai.usage.input_tokens`` counts it, and the cache reads are its cached part."""
    if tags.get("span.type") != "llm_request" or "gen_ai.usage.output_tokens" in tags:
        return tags
    parts = [_int(tags.get(k)) for k in ("input_tokens", "cache_read_tokens", "cache_creation_tokens")]
    out = _int(tags.get("output_tokens"))
    if parts[0] is None or out is None:
        return tags
    return {
        **tags,
        "gen_ai.usage.input_tokens": sum(p or 0 for p in parts),
        "gen_ai.usage.output_tokens": out,
        "gen_ai.usage.cache_read.input_tokens": parts[1] or 0,
    }


def _messages(tags: Mapping[str, TagValue]) -> list[ChatMessage]:
    """The call's request messages in OpenAI's chat form, from whichever form the SDK recorded."""
    out: list[ChatMessage] = []
    system = _json(tags.get("gen_ai.system_instructions"))
    if system is not None:
        text = _parts_text(system) if isinstance(system, list) else str(system)
        if text:
            out.append(ChatMessage(role="system", content=text))
    recorded = _json(tags.get("gen_ai.input.messages"))
    if isinstance(recorded, list):
        for m in recorded:
            if isinstance(m, dict):
                out.extend(_chat_messages(m))
        return out
    flat = _flattened(tags, "gen_ai.prompt")
    if flat:
        return out + flat
    prompt = tags.get("gen_ai.prompt")
    if isinstance(prompt, str) and prompt:
        out.append(ChatMessage(role="user", content=prompt))
    return out if len(out) > (1 if system is not None else 0) or recorded is not None else []


def _chat_messages(m: Mapping[str, Any]) -> list[ChatMessage]:
    """One recorded message (``{"role", "parts": [...]}``, or OpenAI's ``{"role", "content"}``) as chat
    messages: text and tool calls in one, each tool result a ``tool`` message of its own."""
    role = str(m.get("role", "user"))
    parts = m.get("parts")
    if not isinstance(parts, list):
        content = m.get("content")
        return [ChatMessage(role=role, content=content if isinstance(content, str) else _parts_text(content))]
    calls = [
        {
            "id": str(p.get("id", "")),
            "type": "function",
            "function": {"name": str(p.get("name", "")), "arguments": _dumps(p.get("arguments", {}))},
        }
        for p in parts
        if isinstance(p, dict) and p.get("type") == "tool_call"
    ]
    results = [
        ChatMessage(role="tool", tool_call_id=str(p.get("id", "")), content=_dumps(p.get("response", "")))
        for p in parts
        if isinstance(p, dict) and p.get("type") == "tool_call_response"
    ]
    text = _parts_text(parts)
    own = [ChatMessage(role=role, content=text or None, tool_calls=calls or None)] if text or calls else []
    return own + results


def _output_text(tags: Mapping[str, TagValue]) -> str | None:
    recorded = _json(tags.get("gen_ai.output.messages"))
    if isinstance(recorded, list):
        texts = [_parts_text(m.get("parts", m.get("content"))) for m in recorded if isinstance(m, dict)]
        return "\n".join(t for t in texts if t) or None
    flat = _flattened(tags, "gen_ai.completion")
    if flat:
        return "\n".join(m.content for m in flat if m.content) or None
    completion = tags.get("gen_ai.completion")
    return completion if isinstance(completion, str) and completion else None


def _input_text(call: GraphCall) -> str:
    """Everything the call's request says, where a predecessor's output may stand."""
    texts = []
    for m in call.request.messages:
        texts.append(m.content or "")
        texts += [str(c.get("function", {}).get("arguments", "")) for c in m.tool_calls or []]
    return "\n".join(texts)


def _flattened(tags: Mapping[str, TagValue], prefix: str) -> list[ChatMessage]:
    """``PREFIX.N.role`` / ``.content`` / ``.tool_calls.M.{id,name,arguments}`` / ``.tool_call_id``
    attributes (OpenLLMetry's form) as messages, in N's order."""
    out = []
    n = 0
    while f"{prefix}.{n}.content" in tags or f"{prefix}.{n}.role" in tags:
        at = f"{prefix}.{n}"
        content = tags.get(f"{at}.content")
        calls = []
        m = 0
        while f"{at}.tool_calls.{m}.name" in tags:
            call = f"{at}.tool_calls.{m}"
            name, arguments = str(tags[f"{call}.name"]), str(tags.get(f"{call}.arguments", ""))
            calls.append(
                {"id": str(tags.get(f"{call}.id", "")), "type": "function",
                 "function": {"name": name, "arguments": arguments}}
            )  # fmt: skip
            m += 1
        out.append(
            ChatMessage(
                role=str(tags.get(f"{at}.role", "user")),
                content=str(content) if content is not None else None,
                tool_calls=calls or None,
                tool_call_id=_str(tags.get(f"{at}.tool_call_id")),
            )
        )
        n += 1
    return out


def _tools(tags: Mapping[str, TagValue]) -> list[dict[str, Any]] | None:
    defs = _json(tags.get("gen_ai.tool.definitions"))
    if not isinstance(defs, list):
        defs = []
        n = 0
        while f"llm.request.functions.{n}.name" in tags:
            at = f"llm.request.functions.{n}"
            declared = {"name": tags[f"{at}.name"], "description": tags.get(f"{at}.description"),
                        "parameters": _json(tags.get(f"{at}.parameters"))}  # fmt: skip
            defs.append({k: v for k, v in declared.items() if v is not None})
            n += 1
    tools = []
    for d in defs:
        if not isinstance(d, dict):
            continue
        inner = d.get("function")
        fn: dict[str, Any] = inner if isinstance(inner, dict) else d
        tools.append({
            "type": "function",
            "function": {k: fn[k] for k in ("name", "description", "parameters") if k in fn},
        })  # fmt: skip
    return tools or None


def _parts_text(parts: Any) -> str:
    """The text of a message's parts (``[{"type": "text", "content": …}]``), or of plain content."""
    if isinstance(parts, str):
        return parts
    if not isinstance(parts, list):
        return ""
    texts = []
    for p in parts:
        if isinstance(p, str):
            texts.append(p)
        elif isinstance(p, dict) and p.get("type", "text") == "text":
            value = p.get("content", p.get("text"))
            if isinstance(value, str):
                texts.append(value)
    return "\n".join(texts)


def _json(value: TagValue | None) -> Any:
    """A JSON attribute (most SDKs write structured attributes as JSON strings); other strings as they
    are."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _dumps(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


def _int(value: TagValue | None) -> int | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        return int(float(value))
    except (TypeError, ValueError):
        return None


def _str(value: TagValue | None) -> str | None:
    return None if value is None else str(value)
