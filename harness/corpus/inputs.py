"""Request inputs built around real queries: the query pool, profiles, sessions and constraints.

A request's query is a real user utterance from a request log (:mod:`harness.corpus.logs`); the
rest of the prompt is built around it so that it reads like the same person's visit:

* the **session** is a few actions of the query's domain in the order users take them (search
  before view before act, :data:`harness.corpus.catalog.FLOWS`), each naming a real catalogue
  item — the entities of the query itself where it names some (the restaurant, the city, the
  bank; the CrossWOZ venue the dialogue is about), else items of the same kind;
* the **constraints** are what the query says, and nothing it does not: the user's stated slots
  (CrossWOZ dialog acts), the city and region or country it names, an amount, a party size, a day;
  plus the reply channel;
* the **profile** lives in a real city of a real region (GeoNames); Faker gives the name, e-mail,
  phone and dates.

Candidates are drawn in a seeded order that interleaves domains and intents (near-duplicates are
mostly same-intent, so spreading them keeps dedup from wasting candidates). Candidate ``i`` uses
its own RNG from ``(seed, i)``; which utterance it takes depends on the candidates before it, so a
build is deterministic for a seed and later dedup rounds never disturb earlier candidates.
"""

from __future__ import annotations

import hashlib
import re
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import numpy as np

from harness.common.errors import ConfigError
from harness.common.stats import Distribution
from harness.corpus import catalog
from harness.corpus.logs import Utterance
from harness.corpus.model import HistoryEvent, Profile, RequestVariables, Session
from harness.traces.model import ScenarioClass, ScenarioSet

LOCALE_LANG = {"en_US": "en", "zh_CN": "zh"}
LANG_LOCALE = {v: k for k, v in LOCALE_LANG.items()}
# Corpus timestamps sit in a fixed window so that a seed reproduces them on any day.
EPOCH = datetime(2026, 1, 5, tzinfo=UTC)
HORIZON_DAYS = 300
BEIJING = "北京市"

_NUM = {
    "one": 1,
    "two": 2,
    "three": 3,
    "four": 4,
    "five": 5,
    "six": 6,
    "seven": 7,
    "eight": 8,
    "nine": 9,
    "ten": 10,
}
_MONEY = re.compile(r"\$\s?(\d[\d,]*(?:\.\d+)?)|\b(\d[\d,]*(?:\.\d+)?)\s?(?:dollars|bucks|usd)\b")
_PARTY = re.compile(r"\bfor (\d{1,2}|" + "|".join(_NUM) + r")(?: people| persons| guests| of us)?\b")
_WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_DAY = re.compile(r"\b(today|tonight|tomorrow|this weekend|next week|" + "|".join(_WEEKDAYS) + r")\b")


def candidate_rng(seed: int, index: int, purpose: str = "req") -> np.random.Generator:
    digest = hashlib.sha256(f"{seed}:{purpose}:{index}".encode()).digest()
    rng: np.random.Generator = np.random.default_rng(int.from_bytes(digest[:8], "little"))
    return rng


@dataclass(frozen=True, slots=True)
class Pick:
    """What one candidate is about: its scenario class, the real query, its domain and intent."""

    scenario: ScenarioClass | None
    query: Utterance
    domain: str
    intent: str


@dataclass(frozen=True, slots=True)
class Drawn:
    """A candidate half made (:meth:`InputSampler.draw`): its pick, language, and its RNG, whose
    stream :meth:`InputSampler.dress` continues."""

    pick: Pick
    lang: str
    rng: np.random.Generator

    @property
    def query(self) -> str:
        """The request's query text, as the dressed candidate's ``RequestVariables.query`` will hold it."""
        return self.pick.query.text


def _interleave(items: list[Utterance], rng: np.random.Generator) -> list[Utterance]:
    """Items reordered round-robin over (domain, intent) groups, each group and the round order shuffled."""
    groups: dict[tuple[str, str], list[Utterance]] = {}
    for u in items:
        groups.setdefault((u.domain or "", u.intent or ""), []).append(u)
    keys = sorted(groups)
    queues = []
    for k in (keys[int(j)] for j in rng.permutation(len(keys))):
        g = groups[k]
        queues.append(deque(g[int(j)] for j in rng.permutation(len(g))))
    out: list[Utterance] = []
    while queues:
        nxt = []
        for q in queues:
            out.append(q.popleft())
            if q:
                nxt.append(q)
        queues = nxt
    return out


class QueryPool:
    """The real utterances requests may use, per language, in the seeded interleaved order.

    Each utterance is used at most once; :meth:`take` pops the next unused one of a language,
    optionally of a domain.
    """

    def __init__(self, utterances: Sequence[Utterance], seed: int) -> None:
        rng = np.random.default_rng(
            int.from_bytes(hashlib.sha256(f"{seed}:queries".encode()).digest()[:8], "little")
        )
        by_lang: dict[str, list[Utterance]] = {}
        for u in utterances:
            by_lang.setdefault(u.lang, []).append(u)
        self.order = {lang: _interleave(us, rng) for lang, us in sorted(by_lang.items())}
        self._next = {lang: 0 for lang in self.order}
        self._by_domain: dict[tuple[str, str], deque[int]] = {}
        for lang, us in self.order.items():
            for k, u in enumerate(us):
                self._by_domain.setdefault((lang, u.domain or ""), deque()).append(k)
        self._used: set[tuple[str, int]] = set()
        self._left = {lang: len(us) for lang, us in self.order.items()}

    @property
    def langs(self) -> list[str]:
        return list(self.order)

    def domains(self, lang: str) -> list[str]:
        return sorted({d for (lg, d) in self._by_domain if lg == lang and d})

    def left(self, lang: str) -> int:
        return self._left.get(lang, 0)

    def take(self, lang: str, domain: str | None = None) -> Utterance | None:
        if domain is not None:
            q = self._by_domain.get((lang, domain))
            while q:
                k = q.popleft()
                if (lang, k) not in self._used:
                    self._used.add((lang, k))
                    self._left[lang] -= 1
                    return self.order[lang][k]
        seq = self.order.get(lang, [])
        while self._next.get(lang, 0) < len(seq):
            k = self._next[lang]
            self._next[lang] = k + 1
            if (lang, k) not in self._used:
                self._used.add((lang, k))
                self._left[lang] -= 1
                return seq[k]
        return None


def scenario_domain(sc: ScenarioClass, domains: Sequence[str]) -> str | None:
    """The domain (of ``domains``) a scenario class points at: a ``domain`` tag, else keywords."""
    tag = sc.tags.get("domain") or sc.tags.get("business_domain")
    if isinstance(tag, str) and tag in domains:
        return tag
    haystack = " ".join([sc.name, *sc.service_path, *sc.operations]).lower()
    best, best_hits = None, 0
    for d, words in catalog.scenario_keywords(domains).items():
        hits = sum(haystack.count(w) for w in words)
        if hits > best_hits:
            best, best_hits = d, hits
    return best


class InputSampler:
    """Draws candidate ``i``: scenario, language, a real query, profile, session and constraints."""

    def __init__(
        self,
        seed: int,
        queries: Sequence[Utterance],
        *,
        locales: Sequence[str] = ("en_US", "zh_CN"),
        scenarios: ScenarioSet | None = None,
        session_minutes: float = 30.0,
    ) -> None:
        from faker import Faker

        unknown = [loc for loc in locales if loc not in LOCALE_LANG]
        if unknown:
            raise ConfigError(
                f"unsupported locale(s) {', '.join(unknown)}; supported: {', '.join(LOCALE_LANG)}",
                field="HARNESS__CORPUS__LOCALES",
            )
        self.seed = seed
        self.catalog = catalog.load_catalog()
        wanted = {LOCALE_LANG[loc] for loc in locales}
        self.pool = QueryPool([q for q in queries if q.lang in wanted], seed)
        self.langs = self.pool.langs
        self.fakers = {lang: Faker(LANG_LOCALE[lang]) for lang in self.langs}
        self.scenarios = scenarios
        self.session_minutes = session_minutes
        self._sc_weights: np.ndarray | None = None
        if scenarios is not None and scenarios.classes:
            w = np.array([c.weight for c in scenarios.classes], dtype=np.float64)
            self._sc_weights = w / w.sum() if w.sum() > 0 else np.full(len(w), 1.0 / len(w))
        self._venue_names = sorted(self.catalog.venue_by_name, key=len, reverse=True)
        self._geo_p = {
            lang: np.array([n for _, _, n in rows], dtype=np.float64) / sum(n for _, _, n in rows)
            for lang, rows in self.catalog.geo.items()
        }

    def exhausted(self) -> bool:
        return all(self.pool.left(lang) == 0 for lang in self.langs)

    def variables(self, index: int) -> tuple[RequestVariables, Pick] | None:
        """Candidate ``index``, or ``None`` when every query of the allowed languages is used."""
        drawn = self.draw(index)
        return self.dress(drawn) if drawn is not None else None

    def draw(self, index: int) -> Drawn | None:
        """The first, cheap half of :meth:`variables`: candidate ``index``'s scenario, language and
        query (``None`` when the queries ran out).

        The build draws a whole round first so the encoder can judge the queries while
        :meth:`dress` builds the rest; draws must be made in index order (each takes the next
        unused query), dresses in any order (each uses only its own RNG and read-only data).
        """
        rng = candidate_rng(self.seed, index)
        sc: ScenarioClass | None = None
        if self.scenarios is not None and self._sc_weights is not None:
            sc = self.scenarios.classes[int(rng.choice(len(self._sc_weights), p=self._sc_weights))]
        live = [lang for lang in self.langs if self.pool.left(lang) > 0]
        if not live:
            return None
        lang = live[int(rng.integers(len(live)))]
        domain = scenario_domain(sc, self.pool.domains(lang)) if sc is not None else None
        q = self.pool.take(lang, domain)
        if q is None:
            return None
        return Drawn(Pick(sc, q, q.domain or "general", q.intent or "unlabelled"), lang, rng)

    def dress(self, drawn: Drawn) -> tuple[RequestVariables, Pick]:
        """The second half of :meth:`variables`: profile, session and constraints around a drawn query."""
        pick, lang, rng, q = drawn.pick, drawn.lang, drawn.rng, drawn.pick.query
        fake = self.fakers[lang]
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
        rows = self.catalog.geo[lang]
        city, region, _ = rows[int(rng.choice(len(rows), p=self._geo_p[lang]))]
        profile = Profile(
            user_id=f"u{int(rng.integers(10**9)):09d}",
            name=fake.name(),
            locale=LANG_LOCALE[lang],
            lang="zh" if lang == "zh" else "en",
            birth_date=birth.isoformat(),
            city=city,
            region=region,
            email=fake.email(),
            phone=fake.phone_number(),
            tier=catalog.TIERS[int(rng.integers(len(catalog.TIERS)))],
            signup_at=signup.isoformat(),
        )
        entities = self._entities(q, lang)
        venue = self._venue(q, rng) if lang == "zh" else None
        window = timedelta(minutes=self.session_minutes * float(rng.uniform(0.3, 1.0)))
        start = request_at - window
        steps = catalog.flow(q.domain, lang, q.intent).steps
        k = int(rng.integers(1, len(steps) + 1))
        chosen = sorted(int(j) for j in rng.choice(len(steps), size=k, replace=False))
        # What the query is about was seen in the session: the named venue, restaurant, place …
        about = set(entities) | (
            {"venue"} if venue is not None and (q.focus or q.domain in ("metro", "taxi")) else set()
        )
        for j, step in enumerate(steps):
            if step.kind in about and not any(steps[c].kind == step.kind for c in chosen):
                chosen = sorted([*chosen, j])
        k = len(chosen)
        offsets = np.sort(rng.uniform(0, window.total_seconds() * 0.98, size=k))
        # One item per kind and session: the restaurant searched for is the one viewed.
        items: dict[str, str] = {}
        for j in chosen:
            kind = steps[j].kind
            if kind not in items:
                items[kind] = self._detail(
                    kind=kind, lang=lang, entities=entities, venue=venue, profile=profile, rng=rng
                )
        events = [
            HistoryEvent(
                ts=(start + timedelta(seconds=float(o))).isoformat(),
                action=steps[j].action,
                detail=items[steps[j].kind],
            )
            for j, o in zip(chosen, offsets, strict=True)
        ]
        session = Session(
            session_id=f"s{int(rng.integers(10**12)):012d}",
            start=start.isoformat(),
            end=(request_at + timedelta(minutes=5)).isoformat(),
            events=events,
        )
        constraints = self._constraints(
            q=q, lang=lang, entities=entities, venue=venue, request_at=request_at, rng=rng
        )
        return (
            RequestVariables(
                profile=profile,
                session=session,
                request_at=request_at.isoformat(),
                domain=pick.domain,
                intent=pick.intent,
                query=drawn.query,
                constraints=constraints,
            ),
            pick,
        )

    # ------------------------------------------------------------------ helpers

    def _entities(self, q: Utterance, lang: str) -> dict[str, str]:
        """Catalogue items the query names, by kind (the first of each kind)."""
        found: dict[str, str] = {}
        if lang == "en":
            for kind, phrase in self.catalog.entities_en(q.text):
                found.setdefault(kind, phrase)
        else:
            slots = dict(q.slots)
            dish = slots.get("dish")
            if dish in self.catalog.dishes_zh:
                found["dish"] = dish
        return found

    def _venue(self, q: Utterance, rng: np.random.Generator) -> catalog.Venue | None:
        """The venue a Chinese request is about: the dialogue's, one it names, or one fitting its slots."""
        cat = self.catalog
        if q.focus and q.focus in cat.venue_by_name:
            return cat.venue_by_name[q.focus]
        for name in self._venue_names:
            if len(name) >= 3 and name in q.text:
                return cat.venue_by_name[name]
        slots = dict(q.slots)
        for key in ("origin", "destination", "name"):
            if slots.get(key) in cat.venue_by_name:
                return cat.venue_by_name[slots[key]]
        options = cat.venues_by_domain.get(q.domain or "", ())
        if not options:
            options = cat.venues
        fitting = [v for v in options if venue_fits(v, slots)]
        pool = fitting or options
        return pool[int(rng.integers(len(pool)))]

    def _detail(
        self,
        *,
        kind: str,
        lang: str,
        entities: dict[str, str],
        venue: catalog.Venue | None,
        profile: Profile,
        rng: np.random.Generator,
    ) -> str:
        cat = self.catalog
        if kind == "home_city":
            return profile.city
        if kind == "local":
            return entities.get("place", profile.city)
        if kind in entities:
            return entities[kind]
        if lang == "zh":
            if kind == "venue" and venue is not None:
                return venue.name
            if kind == "district":
                return venue.district if venue is not None and venue.district else BEIJING
            if kind == "subway" and venue is not None and venue.subway:
                return venue.subway
            if kind == "dish" and venue is not None and venue.dishes:
                return venue.dishes[int(rng.integers(len(venue.dishes)))]
            return venue.name if venue is not None else profile.city
        if kind == "place":
            places = cat.places
            return places[int(rng.integers(len(places)))].text
        values = cat.kinds_en.get(kind) or (profile.city,)
        return values[int(rng.integers(len(values)))]

    def _constraints(
        self,
        *,
        q: Utterance,
        lang: str,
        entities: dict[str, str],
        venue: catalog.Venue | None,
        request_at: datetime,
        rng: np.random.Generator,
    ) -> dict[str, str | int | float]:
        out: dict[str, str | int | float] = {}
        chans = catalog.CHANNELS[lang]
        out["channel"] = chans[int(rng.integers(len(chans)))]
        if lang == "zh":
            for key, value in q.slots:
                out[key] = value
            if venue is not None and q.focus == venue.name:
                out["name"] = venue.name
            if venue is not None:
                out["city"] = BEIJING
                if venue.district:
                    out["district"] = venue.district
            return out
        text = q.text.lower()
        place = self.catalog.place_by_text.get(entities.get("place", ""))
        if place is not None:
            out["place"] = place.name
            if place.region:
                out["region"] = place.region
        m = _MONEY.search(text)
        if m:
            out["amount"] = float((m.group(1) or m.group(2)).replace(",", ""))
            out["currency"] = "USD"
        m = _PARTY.search(text)
        if m and q.domain in ("kitchen_and_dining", "travel"):
            word = m.group(1)
            out["party_size"] = int(word) if word.isdigit() else _NUM[word]
        m = _DAY.search(text)
        if m:
            s, e = _day_window(m.group(1), request_at)
            out["window_start"] = s.isoformat()
            out["window_end"] = e.isoformat()
        return out


_RANGE = re.compile(r"^(\d+(?:\.\d+)?)-(\d+(?:\.\d+)?)元$")
_ABOVE = re.compile(r"^(\d+(?:\.\d+)?)(?:元|分)以上$")
_BELOW = re.compile(r"^(\d+(?:\.\d+)?)元以下$")
_EXACT = re.compile(r"^(\d+(?:\.\d+)?)分$")


def _fits_number(value: float | None, wanted: str) -> bool:
    """Whether a venue's price or rating meets a CrossWOZ constraint (``100-150元``, ``4.5分以上``,
    ``20元以下``, ``免费``, ``不免费``, ``5分``); an unparsed constraint is not held against it."""
    if wanted == "免费":
        return value == 0
    if wanted == "不免费":
        return value is not None and value > 0
    if value is None:
        return False
    m = _RANGE.match(wanted)
    if m:
        return float(m.group(1)) <= value <= float(m.group(2))
    m = _ABOVE.match(wanted)
    if m:
        return value >= float(m.group(1))
    m = _BELOW.match(wanted)
    if m:
        return value <= float(m.group(1))
    m = _EXACT.match(wanted)
    return value == float(m.group(1)) if m else True


# What the catalogue can check of a stated constraint, by slot (others — facilities, names — pass).
VENUE_CHECKS: dict[str, Callable[[catalog.Venue, str], bool]] = {
    "dish": lambda v, w: w in v.dishes,
    "hotel_type": lambda v, w: w == v.type,
    "visit_duration": lambda v, w: w == v.duration,
    "rating": lambda v, w: _fits_number(v.rating, w),
    "price": lambda v, w: _fits_number(v.price, w),
    "price_per_person": lambda v, w: _fits_number(v.price, w),
    "ticket": lambda v, w: _fits_number(v.price, w),
}


def venue_fits(v: catalog.Venue, slots: dict[str, str]) -> bool:
    """Whether a venue meets every constraint the user stated that the catalogue can check."""
    return all(VENUE_CHECKS[key](v, wanted) for key, wanted in slots.items() if key in VENUE_CHECKS)


def _day_window(word: str, at: datetime) -> tuple[datetime, datetime]:
    """The time window a day word means, seen from ``at`` (``tonight`` → 18:00–24:00 of that day)."""
    day = at.replace(hour=0, minute=0, second=0, microsecond=0)
    if word == "today":
        return at.replace(microsecond=0), day + timedelta(days=1)
    if word == "tonight":
        return max(at.replace(microsecond=0), day + timedelta(hours=18)), day + timedelta(days=1)
    if word == "tomorrow":
        return day + timedelta(days=1), day + timedelta(days=2)
    if word == "this weekend":
        sat = day + timedelta(days=(5 - day.weekday()) % 7)
        return max(sat, at.replace(microsecond=0)), sat + timedelta(days=2)
    if word == "next week":
        mon = day + timedelta(days=7 - day.weekday())
        return mon, mon + timedelta(days=7)
    target = _WEEKDAYS.index(word)
    d = day + timedelta(days=(target - day.weekday()) % 7 or 7)
    return d, d + timedelta(days=1)


def sample_distribution(dist: Distribution, rng: np.random.Generator) -> int:
    """Draw from a summarised distribution by inverting its piecewise-linear quantile function."""
    qs = np.array([0.0, 0.5, 0.9, 0.95, 0.99, 1.0])
    points = [dist.min, dist.p50, dist.p90, dist.p95, dist.p99, dist.max]
    if any(v is None for v in points):
        raise ValueError("cannot sample from an empty distribution")
    vs = np.maximum.accumulate(np.array(points, dtype=np.float64))
    return max(1, round(float(np.interp(rng.random(), qs, vs))))
