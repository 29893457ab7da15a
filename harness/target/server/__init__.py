"""OpenAI-compatible streaming server in front of the engine and the response cache stack."""

from __future__ import annotations
