"""Warmup planning, QPS-decay and cache-avalanche models, index-warmup checks."""

from __future__ import annotations
