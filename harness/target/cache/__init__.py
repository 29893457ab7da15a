"""Response cache stack: normalized keys, Bloom guard, L1 LRU+TTL, L2 Redis, L3 FAISS semantic cache."""

from __future__ import annotations
