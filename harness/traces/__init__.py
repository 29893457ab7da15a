"""Trace ingestion: distributed traces and LLM request traces → normalized model, cold paths, scenarios."""

from __future__ import annotations
