"""One module per input format; importing this package registers them all in ``READERS``."""

from __future__ import annotations

from harness.traces.readers import (
    azure,
    burstgpt,
    coldpaths,
    jaeger_json,
    jaeger_query,
    mooncake,
    otlp_json,
    splitwise,
)

__all__ = [
    "azure",
    "burstgpt",
    "coldpaths",
    "jaeger_json",
    "jaeger_query",
    "mooncake",
    "otlp_json",
    "splitwise",
]
