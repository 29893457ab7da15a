"""Trace-driven load and cache-warmup harness for LLM inference services.

The package is one subpackage per pipeline stage, named by what it produces:
``traces`` → ``corpus`` → ``load`` → target (``engine``, ``cache``, ``server``) → results → ``gates``,
with ``reports`` and ``analysis`` reading results, and ``common`` holding shared types, errors and settings.
A stage imports only stages upstream of it and ``harness.common``.
"""

from __future__ import annotations

__version__ = "0.1.0"
