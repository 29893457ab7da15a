"""Shared types, errors, settings and I/O helpers used by every stage."""

from __future__ import annotations

from harness.common.errors import (
    CheckFailed,
    ConfigError,
    ExitCode,
    HarnessError,
    InputError,
    UnavailableError,
)

__all__ = [
    "CheckFailed",
    "ConfigError",
    "ExitCode",
    "HarnessError",
    "InputError",
    "UnavailableError",
]
