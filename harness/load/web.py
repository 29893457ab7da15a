"""Web UI tab (filled in below)."""

from __future__ import annotations

from typing import Any


def mount(env: Any) -> None:
    return None
