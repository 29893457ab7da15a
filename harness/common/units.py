"""Shares written as percentages: the one parser of ``"10%"``.

People write shares as ``10%`` in command lines, YAML plans, baselines and the web UI; the code
works in fractions (``0.1``). :func:`parse_percent` reads a percentage and nothing else (a ladder's
``qps: 50%`` is a share of capacity, ``qps: 50`` requests/s); :func:`fraction` is the pydantic
before-validator of a field that takes either form (``rel_tolerance: 10%`` or ``0.1``). Both say
what was wrong in the same words.
"""

from __future__ import annotations

import math
from typing import Any


def parse_percent(text: str) -> float | None:
    """``"50%"`` → ``0.5``; ``None`` when ``text`` is not a percentage (no ``%`` at its end).

    Raises ``ValueError`` for a percentage that is not a finite number (``"x%"``, ``"nan%"``); the
    range (above 0, below 100 %) is the caller's to check."""
    t = text.strip()
    if not t.endswith("%"):
        return None
    try:
        share = float(t[:-1]) / 100.0
    except ValueError:
        raise ValueError(f"{text!r} is not a percentage like 10%") from None
    if not math.isfinite(share):
        raise ValueError(f"{text!r} is not a percentage like 10%")
    return share


def fraction(value: Any) -> Any:
    """A pydantic before-validator: ``"10%"`` and ``"0.1"`` → ``0.1``; other values pass (pydantic
    checks them). Raises ``ValueError`` for text that is neither a percentage nor a number."""
    if not isinstance(value, str):
        return value
    share = parse_percent(value)
    if share is not None:
        return share
    try:
        return float(value.strip())
    except ValueError:
        raise ValueError(f"{value!r} is not a percentage like 10% or a fraction like 0.1") from None
