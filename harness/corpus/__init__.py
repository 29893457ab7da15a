"""Synthetic request corpora: sandboxed Jinja templates, Faker profiles, few-shot pool, embedding dedup."""

from __future__ import annotations
