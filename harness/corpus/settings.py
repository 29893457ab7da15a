"""Corpus settings (env prefix ``HARNESS__CORPUS__``); ``harness corpus build`` options override them."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings

from harness.common.model import StrictModel
from harness.common.settings import stage_config


class Thresholds(StrictModel):
    """Minimums / maximums a corpus must meet; ``None`` disables a check."""

    min_completeness: float | None = 0.987
    min_temporal: float | None = 0.959
    max_dup_rate_after: float | None = 0.0
    max_mean_cosine: float | None = None
    min_distinct_2: float | None = None
    max_ks: float | None = None
    min_catalog_share: float | None = 0.95
    min_region_agreement: float | None = 1.0

    @classmethod
    def of(cls, settings: object) -> Thresholds:
        """The thresholds a settings object (``CorpusSettings``) carries under the same field names."""
        return cls(**{name: getattr(settings, name) for name in cls.model_fields})


# The quality thresholds are declared once, in Thresholds, and settable as HARNESS__CORPUS__MIN_* too.
class CorpusSettings(BaseSettings, Thresholds):
    """Defaults for building a corpus."""

    model_config = stage_config("corpus")

    seed: int = 0
    dedup_threshold: float = Field(default=0.82, gt=0.0, le=1.0)
    dedup_method: str = "auto"
    """Pair search of the ``embedding`` judge: ``auto`` (exact up to 20 000 candidates, faiss
    beyond), ``exact`` or ``faiss``."""
    dedup_judges: dict[str, str] = Field(default_factory=lambda: {"en": "embedding", "zh": "char-tfidf"})
    """Per language, the judge of near-duplicate queries: ``embedding`` (the sentence embedder's
    cosine) or ``char-tfidf`` (character 2–3-gram TF-IDF cosine, for languages the embedder was not
    trained on). Set a multilingual ``embed_model`` to judge Chinese by embedding too."""
    embed_model: Path | None = None
    """A local sentence-transformers model directory for the ``embedding`` judge; default MiniLM."""
    max_rounds: int = Field(default=8, ge=1)
    """Generate-and-dedup rounds before giving up on reaching ``n`` distinct requests."""
    fewshot_top_n: int = Field(default=100, ge=1)
    """Few-shot pool size: the most confident log lines, stratified by domain (docs/corpus.md)."""
    fewshot_k: int | None = Field(default=None, ge=1)
    """KMeans clusters when a log has no domain labels; ``None``: chosen by silhouette in 2..10."""
    shot_set_size: int = Field(default=12, ge=1)
    shots_per_prompt: int = Field(default=3, ge=0)
    fewshot_floor: int = Field(default=1, ge=0)
    locales: list[str] = Field(default_factory=lambda: ["en_US", "zh_CN"])
    tokenizer: Path | None = None
    """Target tokenizer (``tokenizer.json`` or checkpoint dir); default: MiniLM's."""
    block_size: int = Field(default=512, ge=1)
    """Tokens per trace ``hash_ids`` block when the trace does not say (Mooncake: 512)."""
    block_tokens: int | None = Field(default=None, ge=1)
    """Rescale a trace's prompts so each ``hash_ids`` block is this many tokens: input lengths scale by
    the same factor (``block_tokens / the trace's block size``), output lengths do not. The reuse
    structure (which requests share which leading blocks) is kept exactly; a production trace's
    9 k-token prompts then fit a small target (Mooncake at 16 tokens a block: ÷ 32). ``None``: as traced."""
    max_input_tokens: int | None = Field(default=None, ge=1)
    """Cap on prompt tokens: a trace or scenario target above it is clipped to it, so a corpus built
    from production lengths still fits a target with a shorter context (``None``: no cap)."""
    min_body_tokens: int = Field(default=32, ge=0)
    """Tokens kept for the request itself after a shared prefix, when the target allows."""
    tenant: str = "default"
    temperature: float = Field(default=0.7, ge=0.0, le=2.0)
    max_output_chars: int = Field(default=200_000, ge=1)
    max_render_s: float = Field(default=2.0, gt=0.0)
    device: str = "auto"
    batch_size: int = Field(default=64, ge=1)
    embed_cache: bool = True
    """Cache embeddings in ``<run_dir>/cache/embeddings.sqlite`` keyed by text hash."""
    pool_cache: bool = True
    """Cache the few-shot pool in ``<run_dir>/cache/fewshot/`` keyed by the logs' SHA-256 and the
    pool settings: a later build from the same logs skips the pool's encoder work."""
