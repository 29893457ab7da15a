"""Run reports with plots."""

from __future__ import annotations
