"""The catalogue sessions and profiles are built from: real items, real places, and domain flows.

Data (``harness/corpus/data``, provenance and licences in its README):

* ``venues_zh.json`` — every CrossWOZ venue (Beijing hotels, restaurants, attractions) with its
  district, subway exit, type, price, rating and dishes (Apache-2.0);
* ``catalog_en.json`` — slot-like phrases CLINC150 users typed (restaurants, banks, cards, dishes,
  airlines, groceries, account kinds; each in at least two utterances) and the places they named
  that GeoNames knows (CC-BY-3.0 / CC-BY-4.0);
* ``geo.json`` — real (city, region) pairs for profiles: US cities with their state, Chinese cities
  with their province (GeoNames, CC-BY-4.0).

A :class:`Flow` lists a domain's session actions in the order users take them (search before
view before act), each with the kind of catalogue item its detail names. Domains are the logs'
own labels (CLINC150's ten, CrossWOZ's five, the JSONL fixture's five); an unknown domain gets the
generic flow, whose details are the user's own city.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import orjson

DATA_DIR = Path(__file__).resolve().parent / "data"


@dataclass(frozen=True, slots=True)
class Step:
    action: str
    kind: str
    """Catalogue kind the detail is drawn from (``restaurant``, ``place``, ``venue``, ``subway`` …).
    ``local`` is the place the query names, else the user's own city; ``home_city`` is the latter."""


@dataclass(frozen=True, slots=True)
class Flow:
    """A domain's session actions in plausible order, and its labels and scenario keywords."""

    steps: tuple[Step, ...]
    label_en: str
    label_zh: str
    keywords: tuple[str, ...] = ()


def _flow(label_en: str, label_zh: str, keywords: str, *steps: tuple[str, str]) -> Flow:
    return Flow(tuple(Step(a, k) for a, k in steps), label_en, label_zh, tuple(keywords.split()))


FLOWS: dict[str, Flow] = {
    # CLINC150 domains (English)
    "banking": _flow(
        "banking", "银行", "bank payment account transfer ledger finance balance",
        ("sign_in", "bank"), ("view_accounts", "account"), ("view_transactions", "account"),
        ("open_transfers", "account"),
    ),
    "credit_cards": _flow(
        "credit cards", "信用卡", "card credit rewards apr",
        ("sign_in", "bank"), ("view_card", "card"), ("view_statement", "card"), ("view_rewards", "card"),
    ),
    "kitchen_and_dining": _flow(
        "kitchen and dining", "厨房与餐饮", "food recipe restaurant menu kitchen meal dining reservation",
        ("search_recipes", "dish"), ("view_recipe", "dish"), ("search_restaurants", "restaurant"),
        ("view_restaurant", "restaurant"),
    ),
    "home": _flow(
        "home assistant", "家居助手", "home list reminder calendar music",
        ("open_lists", "grocery"), ("view_shopping_list", "grocery"), ("add_list_item", "grocery"),
    ),
    "auto_and_commute": _flow(
        "auto and commute", "汽车与通勤", "car commute traffic gas uber",
        ("check_traffic", "local"), ("search_gas_stations", "local"), ("view_route", "local"),
    ),
    "travel": _flow(
        "travel", "旅行", "travel trip flight hotel booking itinerary airline",
        ("search_destinations", "place"), ("search_flights", "place"), ("compare_airlines", "airline"),
        ("view_destination", "place"),
    ),
    "utility": _flow(
        "utilities", "实用工具", "weather time timer alarm calculator",
        ("check_weather", "local"), ("check_time_zone", "local"), ("view_map", "local"),
    ),
    "work": _flow(
        "workplace", "工作", "work pto payroll meeting insurance",
        ("open_hr_portal", "home_city"), ("view_direct_deposit", "account"), ("view_benefits", "account"),
    ),
    "small_talk": _flow("small talk", "闲聊", "chat talk", ("open_chat", "home_city")),
    "meta": _flow("assistant settings", "助手设置", "settings assistant", ("open_settings", "home_city")),
    # CrossWOZ domains (Chinese); the venue kind is a Beijing venue of the domain
    "hotel": _flow(
        "hotels", "酒店", "hotel lodging room",
        ("search_hotels", "district"), ("view_hotel", "venue"), ("view_map", "subway"),
        ("read_reviews", "venue"),
    ),
    "restaurant": _flow(
        "restaurants", "餐馆", "restaurant food dining menu",
        ("search_restaurants", "dish"), ("view_restaurant", "venue"), ("view_menu", "dish"),
        ("view_map", "subway"),
    ),
    "attraction": _flow(
        "attractions", "景点", "attraction sight ticket tour",
        ("search_attractions", "district"), ("view_attraction", "venue"), ("view_map", "subway"),
    ),
    "metro": _flow(
        "metro", "地铁", "metro subway route", ("view_place", "venue"), ("search_route", "subway"),
    ),
    "taxi": _flow(
        "taxi", "出租车", "taxi cab ride", ("view_place", "venue"), ("request_taxi_quote", "venue"),
    ),
    # the JSONL fixture's domains
    "ecommerce": _flow(
        "online shopping", "电商", "shop cart order checkout product catalog store",
        ("search_products", "grocery"), ("view_item", "grocery"), ("add_to_cart", "grocery"),
    ),
    "telecom": _flow(
        "telecom", "通信", "telecom mobile plan sim network roaming broadband",
        ("view_plan", "home_city"), ("view_coverage", "local"),
    ),
    "food_delivery": _flow(
        "food delivery", "外卖", "delivery courier takeaway",
        ("search_restaurants", "restaurant"), ("browse_menu", "dish"),
    ),
}  # fmt: skip
GENERIC = _flow("customer service", "客户服务", "", ("open_app", "home_city"), ("browse", "home_city"))
# Domains whose intents do different things get a flow per intent group (CLINC150 intents).
_RESTAURANT = _flow("", "", "", ("search_restaurants", "restaurant"), ("view_restaurant", "restaurant"))
_RECIPE = _flow("", "", "", ("search_recipes", "dish"), ("view_recipe", "dish"))
_LISTS = _flow("", "", "", ("open_lists", "grocery"), ("view_shopping_list", "grocery"))
_ASSISTANT = _flow(
    "",
    "",
    "",
    ("open_assistant", "home_city"),
)
INTENT_FLOWS: dict[str, Flow] = {
    **dict.fromkeys(
        ("restaurant_reservation", "confirm_reservation", "cancel_reservation", "restaurant_reviews",
         "restaurant_suggestion", "how_busy", "accept_reservations"),
        _RESTAURANT,
    ),
    **dict.fromkeys(
        ("recipe", "ingredients_list", "cook_time", "calories", "nutrition_info", "meal_suggestion",
         "food_last", "ingredient_substitution"),
        _RECIPE,
    ),
    **dict.fromkeys(("shopping_list", "shopping_list_update", "order"), _LISTS),
    **dict.fromkeys(
        ("play_music", "what_song", "update_playlist", "reminder", "reminder_update", "calendar",
         "calendar_update", "todo_list", "todo_list_update", "smart_home", "next_song", "timer", "alarm"),
        _ASSISTANT,
    ),
}  # fmt: skip
# Chinese requests of an English-catalogue domain use the venue flow closest to it.
ZH_FLOW_FOR = {"travel": "hotel", "food_delivery": "restaurant", "kitchen_and_dining": "restaurant"}
CHANNELS = {
    "en": ("mobile app", "web chat", "email", "phone call"),
    "zh": ("手机App", "网页在线客服", "微信", "电话"),
}
TIERS = ("basic", "silver", "gold", "platinum")


def flow(domain: str | None, lang: str, intent: str | None = None) -> Flow:
    """The flow of a request in ``lang`` of ``domain`` (of ``intent``, where the domain splits)."""
    if lang == "en" and intent in INTENT_FLOWS:
        return INTENT_FLOWS[intent]
    name = domain or ""
    if lang == "zh" and name in ZH_FLOW_FOR:
        name = ZH_FLOW_FOR[name]
    if lang == "en" and name in ("hotel", "restaurant", "attraction", "metro", "taxi"):
        return GENERIC  # the venue catalogue is Chinese
    return FLOWS.get(name, GENERIC)


def label(domain: str | None, lang: str) -> str:
    f = FLOWS.get(domain or "", GENERIC)
    return f.label_zh if lang == "zh" else f.label_en


@dataclass(frozen=True, slots=True)
class Venue:
    domain: str
    name: str
    district: str | None
    subway: str | None
    rating: float | None
    price: float | None
    type: str | None
    dishes: tuple[str, ...]
    duration: str | None = None


@dataclass(frozen=True, slots=True)
class Place:
    text: str
    """As users write it (lower case)."""
    name: str
    country: str
    region: str | None


@dataclass(frozen=True)
class Catalog:
    """The loaded catalogue (one per process, see :func:`load_catalog`)."""

    venues: tuple[Venue, ...]
    venues_by_domain: dict[str, tuple[Venue, ...]]
    venue_by_name: dict[str, Venue]
    kinds_en: dict[str, tuple[str, ...]]
    places: tuple[Place, ...]
    place_by_text: dict[str, Place]
    geo: dict[str, tuple[tuple[str, str, int], ...]]
    """lang → (city, region, population)."""
    districts: tuple[str, ...]
    subways: tuple[str, ...]
    dishes_zh: tuple[str, ...]
    items: dict[str, frozenset[str]]
    """lang → every string a session detail may name (for the catalogue-share metric)."""
    regions: dict[str, dict[str, frozenset[str]]]
    """lang → city → the regions a city of that name lies in (names repeat: Springfield)."""
    _en_pattern: re.Pattern[str]

    def in_region(self, lang: str, city: str, region: str) -> bool:
        """Whether a city of that name lies in ``region`` (per the GeoNames table)."""
        return region in self.regions.get(lang, {}).get(city, frozenset())

    def entities_en(self, text: str) -> list[tuple[str, str]]:
        """(kind, phrase) of the catalogue phrases in an English text, in text order; a phrase of
        several kinds (``american``: an airline and a card) is listed under each."""
        out: list[tuple[str, str]] = []
        for m in self._en_pattern.finditer(text.lower()):
            phrase = m.group(1)
            out.extend((kind, phrase) for kind, values in self.kinds_en.items() if phrase in values)
            if phrase in self.place_by_text:
                out.append(("place", phrase))
        return out


def _load(name: str) -> Any:
    return orjson.loads((DATA_DIR / name).read_bytes())


@lru_cache(maxsize=1)
def load_catalog() -> Catalog:
    """Read the bundled catalogue once per process."""
    venues = tuple(
        Venue(
            domain=v["domain"],
            name=v["name"],
            district=v.get("district"),
            subway=v.get("subway"),
            rating=v.get("rating"),
            price=v.get("price"),
            type=v.get("type"),
            dishes=tuple(v.get("dishes") or ()),
            duration=v.get("duration"),
        )
        for v in _load("venues_zh.json")
    )
    by_domain: dict[str, list[Venue]] = {}
    for v in venues:
        by_domain.setdefault(v.domain, []).append(v)
    en = _load("catalog_en.json")
    kinds = {k: tuple(v) for k, v in en["kinds"].items()}
    places = tuple(
        Place(text=p["text"], name=p["name"], country=p["country"], region=p.get("region"))
        for p in en["places"]
    )
    geo_raw = _load("geo.json")
    geo = {lang: tuple((c, r, int(n)) for c, r, n in rows) for lang, rows in geo_raw.items()}
    phrases = sorted({x for v in kinds.values() for x in v} | {p.text for p in places}, key=len, reverse=True)
    # A plural names the same item ("pizzas" → pizza).
    pattern = re.compile(r"(?<![\w'])(" + "|".join(re.escape(p) for p in phrases) + r")(?:e?s)?(?![\w'])")
    districts = tuple(sorted({v.district for v in venues if v.district}))
    subways = tuple(sorted({v.subway for v in venues if v.subway}))
    dishes_zh = tuple(sorted({d for v in venues for d in v.dishes}))
    items = {
        "zh": frozenset({v.name for v in venues} | set(districts) | set(subways) | set(dishes_zh))
        | {c for c, _, _ in geo["zh"]},
        "en": frozenset({x for v in kinds.values() for x in v} | {p.text for p in places})
        | {c for c, _, _ in geo["en"]},
    }
    return Catalog(
        venues=venues,
        venues_by_domain={k: tuple(v) for k, v in by_domain.items()},
        venue_by_name={v.name: v for v in venues},
        kinds_en=kinds,
        places=places,
        place_by_text={p.text: p for p in places},
        geo=geo,
        districts=districts,
        subways=subways,
        dishes_zh=dishes_zh,
        items=items,
        regions={lang: _regions(rows) for lang, rows in geo.items()},
        _en_pattern=pattern,
    )


def _regions(rows: Sequence[tuple[str, str, int]]) -> dict[str, frozenset[str]]:
    out: dict[str, set[str]] = {}
    for city, region, _ in rows:
        out.setdefault(city, set()).add(region)
    return {c: frozenset(r) for c, r in out.items()}


def scenario_keywords(domains: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """Keywords that point a scenario class at each of ``domains``."""
    return {d: (*FLOWS.get(d, GENERIC).keywords, d.replace("_", " ")) for d in domains}


# --------------------------------------------------------------------------- retrieved context

_ZH_KIND = {"hotel": "酒店", "restaurant": "餐馆", "attraction": "景点"}
_PRICE = {"hotel": "价格 {}元/晚", "restaurant": "人均 {}元", "attraction": "门票 {}元"}
REFERENCE_DOMAINS = {"hotel": ("hotel",), "restaurant": ("restaurant",), "attraction": ("attraction",)}
"""Which venue kinds a Chinese request of a domain retrieves first; metro and taxi requests (and
the domains mapped by :data:`ZH_FLOW_FOR`) are about getting to a venue of any kind."""


def venue_line(v: Venue) -> str:
    """One venue of the catalogue as a line of retrieved context (every field the catalogue has)."""
    parts = [f"{v.name}（{_ZH_KIND.get(v.domain, v.domain)}{'，' + v.type if v.type else ''}）"]
    if v.district:
        parts.append(f"北京市{v.district}")
    if v.subway:
        parts.append(f"地铁: {v.subway}")
    if v.rating is not None:
        parts.append(f"评分 {v.rating:g}")
    if v.price is not None:
        parts.append(_PRICE.get(v.domain, "价格 {}元").format(f"{v.price:g}"))
    if v.duration:
        parts.append(f"游玩时间 {v.duration}")
    if v.dishes:
        parts.append("推荐菜: " + "、".join(v.dishes[:8]))
    return "；".join(parts) + "。"


@lru_cache(maxsize=1)
def venue_lines() -> tuple[str, ...]:
    """Every venue as a line of context, in catalogue order (what shared prefix blocks are cut from)."""
    return tuple(venue_line(v) for v in load_catalog().venues)


def reference(
    lang: str,
    domain: str,
    constraints: dict[str, str | int | float],
    rng: Any,
    limit: int | None = None,
) -> list[str]:
    """Catalogue entries relevant to a request, most relevant first: what a retrieval step would
    put in front of the model. The venue the request names, then venues of its domain in its
    district, then the rest of its domain, then other venues (each tier in a seeded order).

    Only the CrossWOZ venue database has entries with content; English requests (CLINC150's
    catalogue is bare names) get none and reach their length from few-shot examples instead.
    """
    if lang != "zh":
        return []
    cat = load_catalog()
    kinds = REFERENCE_DOMAINS.get(ZH_FLOW_FOR.get(domain, domain), tuple(_ZH_KIND))
    name = str(constraints.get("name", ""))
    district = str(constraints.get("district", ""))
    tiers: list[list[Venue]] = [[], [], [], []]
    for v in cat.venues:
        if v.name == name:
            tiers[0].append(v)
        elif v.domain in kinds and district and v.district == district:
            tiers[1].append(v)
        elif v.domain in kinds:
            tiers[2].append(v)
        else:
            tiers[3].append(v)
    out: list[str] = []
    for tier in tiers:
        order = rng.permutation(len(tier)) if len(tier) > 1 else range(len(tier))
        out.extend(venue_line(tier[int(i)]) for i in order)
        if limit is not None and len(out) >= limit:
            break
    return out if limit is None else out[:limit]
