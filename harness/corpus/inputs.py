"""Seeded request inputs: Faker profiles and sessions, intents and constraints, scenario weighting.

Every candidate request ``i`` draws from its own RNG derived from ``(seed, i)``, so candidate ``i``
is the same whatever was generated before it; that keeps a build deterministic for a seed and
lets dedup ask for more candidates without disturbing the ones already kept.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np

from harness.common.stats import Distribution
from harness.corpus import catalog
from harness.corpus.model import HistoryEvent, Profile, RequestVariables, Session
from harness.traces.model import ScenarioClass, ScenarioSet

LOCALE_LANG = {"en_US": "en", "zh_CN": "zh"}
CURRENCY = {"en": "USD", "zh": "CNY"}
# Corpus timestamps sit in a fixed window so that a seed reproduces them on any day.
EPOCH = datetime(2026, 1, 5, tzinfo=UTC)
HORIZON_DAYS = 300


def candidate_rng(seed: int, index: int, purpose: str = "req") -> np.random.Generator:
    digest = hashlib.sha256(f"{seed}:{purpose}:{index}".encode()).digest()
    rng: np.random.Generator = np.random.default_rng(int.from_bytes(digest[:8], "little"))
    return rng


@dataclass(frozen=True, slots=True)
class Pick:
    """What one candidate is about, before any text is produced."""

    scenario: ScenarioClass | None
    domain: catalog.Domain
    intent: catalog.Intent


def scenario_domain(sc: ScenarioClass) -> catalog.Domain | None:
    """The domain a scenario class points at: a ``domain`` tag, else keywords in its path and operations."""
    tag = sc.tags.get("domain") or sc.tags.get("business_domain")
    if tag and tag in catalog.DOMAIN_NAMES:
        return catalog.domain(tag)
    haystack = " ".join([sc.name, *sc.service_path, *sc.operations]).lower()
    best, best_hits = None, 0
    for d in catalog.DOMAINS:
        hits = sum(haystack.count(k) for k in d.keywords) + sum(
            haystack.count(k) for it in d.intents for k in it.keywords
        )
        if hits > best_hits:
            best, best_hits = d, hits
    return best


def _intent_weights(domain: catalog.Domain, sc: ScenarioClass | None) -> np.ndarray:
    """Intent weights within a domain: operation shares matched by keyword, smoothed so none is zero."""
    w = np.ones(len(domain.intents), dtype=np.float64)
    if sc is not None and sc.operations:
        for op, share in sc.operations.items():
            low = op.lower()
            for j, it in enumerate(domain.intents):
                if any(k in low for k in it.keywords):
                    w[j] += 4.0 * share * len(domain.intents)
    out: np.ndarray = w / w.sum()
    return out


class InputSampler:
    """Draws scenario, domain, intent, profile, session and constraints for candidate ``i``."""

    def __init__(
        self,
        seed: int,
        *,
        locales: Sequence[str] = ("en_US", "zh_CN"),
        scenarios: ScenarioSet | None = None,
        session_minutes: float = 30.0,
        max_history: int = 8,
    ) -> None:
        from faker import Faker

        unknown = [loc for loc in locales if loc not in LOCALE_LANG]
        if unknown:
            from harness.common.errors import ConfigError

            raise ConfigError(
                f"unsupported locale(s) {', '.join(unknown)}; supported: {', '.join(LOCALE_LANG)}"
            )
        self.seed = seed
        self.locales = list(locales)
        self.fakers = {loc: Faker(loc) for loc in self.locales}
        self.scenarios = scenarios
        self.session_minutes = session_minutes
        self.max_history = max_history
        self._sc_weights: np.ndarray | None = None
        self._sc_domains: list[catalog.Domain | None] = []
        if scenarios is not None and scenarios.classes:
            w = np.array([c.weight for c in scenarios.classes], dtype=np.float64)
            self._sc_weights = w / w.sum() if w.sum() > 0 else np.full(len(w), 1.0 / len(w))
            self._sc_domains = [scenario_domain(c) for c in scenarios.classes]

    def pick(self, rng: np.random.Generator) -> Pick:
        sc: ScenarioClass | None = None
        dom: catalog.Domain | None = None
        if self.scenarios is not None and self._sc_weights is not None:
            j = int(rng.choice(len(self._sc_weights), p=self._sc_weights))
            sc = self.scenarios.classes[j]
            dom = self._sc_domains[j]
            if dom is None:  # no keyword matched: a stable domain per class, so the class stays coherent
                h = int(hashlib.sha256(sc.name.encode()).hexdigest(), 16)
                dom = catalog.DOMAINS[h % len(catalog.DOMAINS)]
        if dom is None:
            dom = catalog.DOMAINS[int(rng.integers(len(catalog.DOMAINS)))]
        iw = _intent_weights(dom, sc)
        intent = dom.intents[int(rng.choice(len(dom.intents), p=iw))]
        return Pick(sc, dom, intent)

    def variables(self, index: int) -> tuple[RequestVariables, Pick]:
        rng = candidate_rng(self.seed, index)
        pick = self.pick(rng)
        locale = self.locales[int(rng.integers(len(self.locales)))]
        lang = LOCALE_LANG[locale]
        fake = self.fakers[locale]
        fake.seed_instance(int(rng.integers(2**31)))

        request_at = EPOCH + timedelta(seconds=float(rng.uniform(0, HORIZON_DAYS * 86400)))
        # Not Faker's date_of_birth: it counts back from today, which would make a seed's corpus
        # depend on the day it is built (and could make a user under 18 at request time).
        birth = (request_at - timedelta(days=float(rng.uniform(19 * 365.25, 80 * 365.25)))).date()
        adult = datetime(birth.year + 18, birth.month, min(birth.day, 28), tzinfo=UTC)
        signup_lo = max(adult, request_at - timedelta(days=3650))
        signup = signup_lo + timedelta(
            seconds=float(rng.uniform(0, max(1.0, (request_at - signup_lo).total_seconds() - 86400)))
        )
        region = fake.province() if lang == "zh" else fake.state()
        profile = Profile(
            user_id=f"u{int(rng.integers(10**9)):09d}",
            name=fake.name(),
            locale=locale,
            lang=lang,
            birth_date=birth.isoformat(),
            city=fake.city(),
            region=region,
            email=fake.email(),
            phone=fake.phone_number(),
            tier=catalog.TIERS[int(rng.integers(len(catalog.TIERS)))],
            signup_at=signup.isoformat(),
        )

        window = timedelta(minutes=self.session_minutes * float(rng.uniform(0.3, 1.0)))
        start = request_at - window
        n_events = int(rng.integers(1, self.max_history + 1))
        offsets = np.sort(rng.uniform(0, window.total_seconds() * 0.98, size=n_events))
        events = [
            HistoryEvent(
                ts=(start + timedelta(seconds=float(o))).isoformat(),
                action=pick.domain.actions[int(rng.integers(len(pick.domain.actions)))],
                detail=fake.word() + (" " + fake.word() if lang == "en" else fake.word()),
            )
            for o in offsets
        ]
        session = Session(
            session_id=f"s{int(rng.integers(10**12)):012d}",
            start=start.isoformat(),
            end=(request_at + timedelta(minutes=5)).isoformat(),
            events=events,
        )
        constraints = self._constraints(
            rng=rng, pick=pick, lang=lang, fake=fake, request_at=request_at, profile=profile
        )
        query = self._query(rng, pick.intent, pick.domain, lang, constraints)
        return (
            RequestVariables(
                profile=profile,
                session=session,
                request_at=request_at.isoformat(),
                domain=pick.domain.name,
                intent=pick.intent.name,
                query=query,
                constraints=constraints,
            ),
            pick,
        )

    def _constraints(
        self,
        *,
        rng: np.random.Generator,
        pick: Pick,
        lang: str,
        fake: Any,
        request_at: datetime,
        profile: Profile,
    ) -> dict[str, str | int | float]:
        out: dict[str, str | int | float] = {}
        tags = pick.scenario.tags if pick.scenario is not None else {}
        for kind in pick.intent.constraints:
            if kind == "time_window":
                lead = float(rng.uniform(-5, 30))  # negative: asking about the past (an order, a charge)
                s = (request_at + timedelta(days=lead)).replace(minute=0, second=0, microsecond=0)
                e = s + timedelta(hours=float(rng.integers(2, 24 * 7)))
                out["window_start"] = s.isoformat()
                out["window_end"] = e.isoformat()
            elif kind == "region":
                out["region"] = tags.get("region") or (profile.city if rng.random() < 0.4 else fake.city())
            elif kind == "budget":
                scale = 8.0 if lang == "zh" else 1.0
                out["budget"] = round(float(rng.lognormal(np.log(150), 0.8)) * scale, 0)
                out["currency"] = tags.get("currency") or CURRENCY[lang]
            elif kind == "party_size":
                out["party_size"] = int(rng.integers(1, 9))
            elif kind == "quantity":
                out["quantity"] = int(rng.integers(1, 5))
            elif kind == "channel":
                chans = catalog.CHANNELS_ZH if lang == "zh" else catalog.CHANNELS_EN
                out["channel"] = chans[int(rng.integers(len(chans)))]
            elif kind == "priority":
                pri = catalog.PRIORITIES_ZH if lang == "zh" else catalog.PRIORITIES_EN
                out["priority"] = pri[int(rng.integers(len(pri)))]
        return out

    def _query(
        self,
        rng: np.random.Generator,
        intent: catalog.Intent,
        domain: catalog.Domain,
        lang: str,
        c: dict[str, str | int | float],
    ) -> str:
        patterns = intent.zh if lang == "zh" else intent.en
        pattern = patterns[int(rng.integers(len(patterns)))]

        def when(key: str) -> str:
            v = c.get(key)
            if not isinstance(v, str):
                return "今天" if lang == "zh" else "today"
            d = datetime.fromisoformat(v)
            return f"{d.month}月{d.day}日{d.hour}点" if lang == "zh" else d.strftime("%b %d %H:00")

        cur = str(c.get("currency", CURRENCY[lang]))
        budget = c.get("budget")
        money = (f"{budget:.0f}元" if cur == "CNY" else f"{budget:.0f} {cur}") if budget is not None else ""
        slots = {
            "city": c.get("region", ""),
            "start": when("window_start"),
            "end": when("window_end"),
            "party": c.get("party_size", 2),
            "budget": money,
            "quantity": c.get("quantity", 1),
            "channel": c.get("channel", ""),
            "priority": c.get("priority", ""),
        }
        text = pattern.format(**slots)
        details = domain.details_zh if lang == "zh" else domain.details_en
        k = int(rng.integers(0, 3))
        if k and details:
            picks = rng.choice(len(details), size=min(k, len(details)), replace=False)
            sep = "" if lang == "zh" else " "
            text += sep + sep.join(details[int(j)] for j in picks)
        return text


def sample_distribution(dist: Distribution, rng: np.random.Generator) -> int:
    """Draw from a summarised distribution by inverting its piecewise-linear quantile function."""
    qs = np.array([0.0, 0.5, 0.9, 0.95, 0.99, 1.0])
    points = [dist.min, dist.p50, dist.p90, dist.p95, dist.p99, dist.max]
    if any(v is None for v in points):
        raise ValueError("cannot sample from an empty distribution")
    vs = np.maximum.accumulate(np.array(points, dtype=np.float64))
    return max(1, round(float(np.interp(rng.random(), qs, vs))))
