"""CI gates on P95 decode latency, TTFT and prefill memory against baselines."""

from __future__ import annotations
