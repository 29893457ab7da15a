"""Corpus quality: completeness, temporal plausibility, diversity, duplicates, token-length fit.

Definitions (also in docs/corpus.md):

* field completeness: share of required (record, field) cells that are present and non-empty;
* temporal plausibility: share of records whose timeline is consistent — birth ≤ adult signup ≤
  request, history events ordered and inside the session window, request after the last event
  and inside the window, constraint windows with start ≤ end;
* diversity: mean pairwise cosine of the dedup embeddings (lower is more diverse; computed
  exactly as ``(‖Σx‖² − Σ‖x‖²) / (n(n−1))``) and distinct-1/2 over the request texts;
* duplicate rate: share of items having an earlier item at cosine ≥ threshold, before and after
  dedup;
* token-length fit: two-sample KS statistic of prompt tokens against the target lengths;
* catalogue share: share of session events whose detail names an item of the catalogue
  (:mod:`harness.corpus.catalog`: a venue, dish, district, subway exit, place, restaurant …);
* region agreement: share of records whose profile city lies in its profile region, and whose
  constraints' place lies in their region (and Beijing district in Beijing);
* query in prompt: share of records whose query appears verbatim in the request as sent;
* filler token share: filler-word tokens (added only when real material ran out before a target
  length, :mod:`harness.corpus.assemble`) over all prompt tokens.

Thresholds turn metrics into a :class:`CheckFailed` naming every metric that missed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from datetime import date, datetime
from itertools import pairwise

import numpy as np
import numpy.typing as npt

from harness.common.errors import CheckFailed
from harness.corpus.model import CorpusRecord, RequestVariables
from harness.corpus.settings import Thresholds

REQUIRED_PROFILE = (
    "user_id",
    "name",
    "locale",
    "birth_date",
    "city",
    "region",
    "email",
    "phone",
    "tier",
    "signup_at",
)
_WORD = re.compile(r"[\u4e00-\u9fff]|[^\W\d_]+|\d+", re.UNICODE)


def completeness(records: Sequence[CorpusRecord]) -> float:
    total = 0
    filled = 0
    for r in records:
        cells: list[object] = [r.id, r.text(), r.domain, r.intent, r.max_tokens]
        v = r.variables
        if v is None:
            cells += [None] * (len(REQUIRED_PROFILE) + 4)
        else:
            cells += [getattr(v.profile, f) for f in REQUIRED_PROFILE]
            cells += [v.session.events, v.query, v.intent, v.constraints]
        total += len(cells)
        filled += sum(1 for c in cells if c not in (None, "", [], {}))
    return filled / total if total else 0.0


def _dt(value: str) -> datetime:
    return datetime.fromisoformat(value)


def timeline_ok(v: RequestVariables) -> bool:
    """Whether one record's timestamps tell a possible story (see module docstring)."""
    try:
        birth = date.fromisoformat(v.profile.birth_date)
        signup = _dt(v.profile.signup_at)
        start, end, req = _dt(v.session.start), _dt(v.session.end), _dt(v.request_at)
        events = [_dt(e.ts) for e in v.session.events]
        age_at_signup = (signup.date() - birth).days / 365.25
        if not (age_at_signup >= 17.9 and signup <= req):
            return False
        if not (start <= req <= end):
            return False
        if any(b < a for a, b in pairwise(events)):
            return False
        if any(not (start <= t <= req) for t in events):
            return False
        ws, we = v.constraints.get("window_start"), v.constraints.get("window_end")
        if isinstance(ws, str) and isinstance(we, str) and _dt(we) < _dt(ws):
            return False
    except (ValueError, TypeError):
        return False
    return True


def temporal_plausibility(records: Sequence[CorpusRecord]) -> float:
    if not records:
        return 0.0
    return sum(1 for r in records if r.variables is not None and timeline_ok(r.variables)) / len(records)


def mean_pairwise_cosine(x: npt.NDArray[np.float32]) -> float | None:
    n = len(x)
    if n < 2:
        return None
    x64 = x.astype(np.float64)
    s = x64.sum(axis=0)
    return float((s @ s - np.einsum("ij,ij->", x64, x64)) / (n * (n - 1)))


def distinct_n(texts: Iterable[str], n: int) -> float:
    grams: list[tuple[str, ...]] = []
    for t in texts:
        toks = [w.lower() for w in _WORD.findall(t)]
        grams.extend(tuple(toks[i : i + n]) for i in range(len(toks) - n + 1))
    return len(set(grams)) / len(grams) if grams else 0.0


def ks_statistic(actual: Sequence[int], target: Sequence[int]) -> float | None:
    if not actual or not target:
        return None
    from scipy.stats import ks_2samp

    return float(ks_2samp(np.asarray(actual), np.asarray(target)).statistic)


def catalog_share(records: Sequence[CorpusRecord]) -> float | None:
    """Share of session events whose detail is a catalogue item (``None`` without events)."""
    from harness.corpus.catalog import load_catalog

    cat = load_catalog()
    total = found = 0
    for r in records:
        if r.variables is None:
            continue
        items = cat.items.get(r.variables.profile.lang, frozenset())
        for e in r.variables.session.events:
            total += 1
            found += e.detail in items
    return found / total if total else None


def region_ok(v: RequestVariables) -> bool:
    """Whether one record's places agree: profile city in its region, constraint place in its region."""
    from harness.corpus.catalog import load_catalog

    cat = load_catalog()
    lang = v.profile.lang
    if not cat.in_region(lang, v.profile.city, v.profile.region):
        return False
    c = v.constraints
    place, region = c.get("place"), c.get("region")
    if isinstance(place, str) and region is not None:
        regions = {p.region for p in cat.places if p.name == place}
        if region not in regions:
            return False
    district = c.get("district")
    return district is None or (district in cat.districts and c.get("city") == "北京市")


def region_agreement(records: Sequence[CorpusRecord]) -> float | None:
    vs = [r.variables for r in records if r.variables is not None]
    return sum(1 for v in vs if region_ok(v)) / len(vs) if vs else None


def query_in_prompt(records: Sequence[CorpusRecord]) -> float | None:
    vs = [(r.variables.query, r.text()) for r in records if r.variables is not None]
    return sum(1 for q, t in vs if q in t) / len(vs) if vs else None


def filler_token_share(records: Sequence[CorpusRecord]) -> float | None:
    """Filler-word tokens over all prompt tokens (records with a measured length)."""
    total = sum(r.prompt_tokens or 0 for r in records)
    filler = sum(r.provenance.fill.filler for r in records if r.provenance.fill is not None)
    return filler / total if total else None


def compute(
    records: Sequence[CorpusRecord],
    *,
    vectors: npt.NDArray[np.float32] | None = None,
    dup_before: float | None = None,
    dup_after: float | None = None,
    texts: Sequence[str] | None = None,
) -> dict[str, float | int | None]:
    """All metrics for ``records`` (``vectors``: their dedup embeddings, same order)."""
    texts = (
        list(texts)
        if texts is not None
        else [r.variables.query if r.variables else r.text() for r in records]
    )
    prompt_tokens = [
        r.prompt_tokens for r in records if r.prompt_tokens is not None and r.target_input_tokens is not None
    ]
    targets = [
        r.target_input_tokens
        for r in records
        if r.prompt_tokens is not None and r.target_input_tokens is not None
    ]
    exact = sum(1 for a, b in zip(prompt_tokens, targets, strict=True) if a == b)
    return {
        "records": len(records),
        "field_completeness": completeness(records),
        "temporal_plausibility": temporal_plausibility(records),
        "mean_pairwise_cosine": mean_pairwise_cosine(vectors) if vectors is not None else None,
        "distinct_1": distinct_n(texts, 1),
        "distinct_2": distinct_n(texts, 2),
        "dup_rate_before": dup_before,
        "dup_rate_after": dup_after,
        "token_ks": ks_statistic([int(p) for p in prompt_tokens], [int(t) for t in targets if t is not None]),
        "token_exact_share": (exact / len(targets)) if targets else None,
        "catalog_share": catalog_share(records),
        "region_agreement": region_agreement(records),
        "query_in_prompt": query_in_prompt(records),
        "filler_token_share": filler_token_share(records),
    }


_CHECKS: tuple[tuple[str, str, str], ...] = (
    ("min_completeness", "field_completeness", "min"),
    ("min_temporal", "temporal_plausibility", "min"),
    ("max_dup_rate_after", "dup_rate_after", "max"),
    ("max_mean_cosine", "mean_pairwise_cosine", "max"),
    ("min_distinct_2", "distinct_2", "min"),
    ("max_ks", "token_ks", "max"),
    ("min_catalog_share", "catalog_share", "min"),
    ("min_region_agreement", "region_agreement", "min"),
)


def limits(thresholds: Thresholds) -> dict[str, tuple[float | None, str]]:
    """Metric → ``(limit, kind)``: the threshold it is checked against (``None``: not set) and
    whether that is a ``min`` or a ``max``."""
    return {metric: (getattr(thresholds, tname), kind) for tname, metric, kind in _CHECKS}


def meets(value: float | int, limit: float, kind: str) -> bool:
    """Whether ``value`` is within a ``min`` or ``max`` ``limit``."""
    return value >= limit if kind == "min" else value <= limit


def failures(metrics: dict[str, float | int | None], thresholds: Thresholds) -> list[str]:
    out: list[str] = []
    for metric, (limit, kind) in limits(thresholds).items():
        value = metrics.get(metric)
        if limit is None or value is None:
            continue
        if not meets(value, limit, kind):
            op = "≥" if kind == "min" else "≤"
            out.append(f"{metric} = {value:.4f}, needs {op} {limit}")
    return out


def check(metrics: dict[str, float | int | None], thresholds: Thresholds, file: str | None = None) -> None:
    """Raise :class:`CheckFailed` listing every metric that misses its threshold."""
    bad = failures(metrics, thresholds)
    if bad:
        raise CheckFailed("corpus quality below threshold: " + "; ".join(bad), file=file)
