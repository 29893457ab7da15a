"""Prometheus ``/metrics`` text and counters: the one parser of the exposition and the one rule for how
much a counter grew.

Three readers need a target's ``/metrics``: the load stage's scraper (``server_metrics.jsonl``, the
server's own prefix hit rate), the anomaly attribution (labelled series of the cache and server
metrics) and the avalanche analysis (write-backs per value tier). They all read the text with
:func:`parse_exposition` and every difference of a counter's scrapes goes through
:func:`counter_increase`, so a reset (the server restarted) is counted the same way in a run's
summary, a report's plot and an anomaly's rate.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

Labels = tuple[tuple[str, str], ...]
"""A sample's labels as sorted ``(name, value)`` pairs: hashable, and equal for equal label sets."""

NOISE = 1e-9
"""A counter that went down by at most this share of its value did not reset: the drop is float
noise (a sum over label sets taken in another order, a histogram's ``_sum`` re-added)."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One sample line of an exposition."""

    name: str
    """The sample's own name (a counter's ``…_total``, a histogram's ``…_sum`` / ``…_count``)."""
    labels: Labels
    value: float


def parse_exposition(text: str, names: Iterable[str] | None = None) -> list[Sample]:
    """The samples of a Prometheus text exposition, in the order written; only those whose sample name
    is in ``names`` when it is given. Parsed by ``prometheus_client``'s text parser; raises
    ``ValueError`` for a (wanted) line that is not a sample.

    With ``names``, the other lines are dropped before parsing, comments included: the scraper runs in
    the Locust process that paces the arrivals, where a scrape's CPU delays them, and a server's
    exposition is mostly histogram buckets (``harness serve``'s: 200 lines, 14 kB; parsing all of it
    took 10 ms on a busy 2-core machine, the few wanted lines a fraction of that). A sample's name is
    the same without its ``# TYPE`` line, so nothing read changes."""
    from prometheus_client.parser import text_string_to_metric_families

    if names is not None:
        text = _lines_of(text, frozenset(names))
    return [
        Sample(s.name, tuple(sorted(s.labels.items())), float(s.value))
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def _lines_of(text: str, names: frozenset[str]) -> str:
    """The sample lines of ``names`` only."""
    keep: list[str] = []
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        cut = len(line)
        for sep in ("{", " "):
            i = line.find(sep)
            if 0 <= i < cut:
                cut = i
        if line[:cut] in names:
            keep.append(line)
    return "\n".join(keep) + "\n"


def counter_increase(before: float, after: float) -> float:
    """How much a counter grew from one scrape (``before``) to the next (``after``).

    The difference; when the counter went down it was reset (the server restarted) and, as
    Prometheus's ``increase()`` does, the value after the reset is the growth since it restarted from
    0. A drop within :data:`NOISE` of the value is float noise, not a reset: no growth (counting it
    as a reset would add the whole counter)."""
    if after >= before:
        return after - before
    if before - after <= NOISE * abs(before):
        return 0.0
    return after


def total_increase(values: Sequence[float]) -> float | None:
    """How much a counter grew over its scrapes ``values`` (in time order): the sum of
    :func:`counter_increase` over consecutive scrapes. ``None`` with fewer than two (no interval)."""
    if len(values) < 2:
        return None
    return sum(counter_increase(a, b) for a, b in itertools.pairwise(values))
