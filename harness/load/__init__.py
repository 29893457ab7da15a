"""Load generation with Locust: open-loop replay, staged QPS ladder, request colouring, TTFT/ITL/TPOT."""

from __future__ import annotations
