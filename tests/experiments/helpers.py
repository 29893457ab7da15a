"""What the experiments' tests share: a paired run's spec from load options, as a recipe gives it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.experiments.paired_spec import PairedSpec
from harness.experiments.recipe import Recipe


def paired_spec(out: Path, *, url: str | None = None, gate: Path | None = None, **load: Any) -> PairedSpec:
    """A :class:`PairedSpec` for these load options (``plan``, ``preload``, ``capacity`` among them),
    against ``url`` (default: a ``harness serve`` to start) and gated by ``gate``."""
    recipe = Recipe.model_validate(
        {"target": {"url": url} if url else {}, "load": load, "gate": {"baseline": gate} if gate else {}}
    )
    return PairedSpec(recipe, out=out)
