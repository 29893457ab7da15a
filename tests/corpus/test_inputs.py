"""Requests built around real queries: sessions in flow order naming catalogue items, constraints
that say what the query says, profiles in real places."""

from __future__ import annotations

import pytest

from harness.corpus import catalog
from harness.corpus.inputs import InputSampler, QueryPool
from harness.corpus.logs import read_log

from .conftest import FIXTURES


@pytest.fixture(scope="module")
def built() -> list:  # type: ignore[type-arg]
    logs = read_log(FIXTURES / "clinc150_sample.json") + read_log(FIXTURES / "crosswoz_sample.json.zip")
    s = InputSampler(5, logs)
    out = []
    for i in range(200):
        got = s.variables(i)
        assert got is not None
        out.append(got)
    return out


def test_every_query_is_used_once_and_domains_interleave() -> None:
    logs = read_log(FIXTURES / "clinc150_sample.json")
    pool = QueryPool(logs, seed=1)
    taken = [pool.take("en") for _ in range(len(logs))]
    assert pool.take("en") is None
    assert sorted(u.id for u in taken if u) == sorted(u.id for u in logs)
    first = [u.intent for u in taken[:150] if u]
    assert len(set(first)) == 150  # one of each intent before any intent's second


def test_sessions_follow_the_flow_and_name_catalogue_items(built: list) -> None:  # type: ignore[type-arg]
    cat = catalog.load_catalog()
    for v, pick in built:
        steps = [s.action for s in catalog.flow(pick.query.domain, v.profile.lang, pick.query.intent).steps]
        actions = [e.action for e in v.session.events]
        assert actions == sorted(actions, key=steps.index)  # search before view before act
        for e in v.session.events:
            assert e.detail in cat.items[v.profile.lang], (e.action, e.detail)


def test_constraints_say_what_the_query_says(built: list) -> None:  # type: ignore[type-arg]
    cat = catalog.load_catalog()
    checked_zh = checked_en = 0
    for v, pick in built:
        q = pick.query
        if v.profile.lang == "zh":
            stated = dict(q.slots)
            for key, value in v.constraints.items():
                if key in ("channel", "city", "district", "name"):
                    continue
                assert stated[key] == value  # a slot the user stated in the dialogue
            if q.focus in cat.venue_by_name:
                venue = cat.venue_by_name[q.focus]
                assert venue.name in [e.detail for e in v.session.events]  # the venue talked about was seen
                assert v.constraints["name"] == venue.name
                assert v.constraints.get("district") == venue.district or venue.district is None
                checked_zh += 1
        else:
            found: dict[str, str] = {}
            for kind, phrase in cat.entities_en(q.text):
                found.setdefault(kind, phrase)  # the first place named
            if "place" in found:
                place = cat.place_by_text[found["place"]]
                assert v.constraints["place"] == place.name
                assert v.constraints.get("region") == place.region
                checked_en += 1
            else:
                assert "place" not in v.constraints
        assert cat.in_region(v.profile.lang, v.profile.city, v.profile.region)
    assert checked_zh >= 20 and checked_en >= 3


def test_venue_fits_reads_crosswoz_constraints() -> None:
    from harness.corpus.inputs import venue_fits

    v = catalog.Venue("restaurant", "x", "西城区", None, 4.6, 120.0, None, ("驴杂汤",), None)
    assert venue_fits(v, {"price_per_person": "100-150元", "rating": "4.5分以上", "dish": "驴杂汤"})
    assert not venue_fits(v, {"price_per_person": "50-100元"})
    assert not venue_fits(v, {"rating": "5分"}) and not venue_fits(v, {"dish": "烤鸭"})
    assert venue_fits(v, {"facilities": "无烟房"})  # not in the catalogue: not held against it
    free = catalog.Venue("attraction", "y", None, None, 4.0, 0.0, None, (), "1小时")
    assert venue_fits(free, {"ticket": "免费", "visit_duration": "1小时"})
    assert not venue_fits(free, {"ticket": "不免费"})


def test_a_searched_venue_meets_the_stated_constraints(built: list) -> None:  # type: ignore[type-arg]
    from harness.corpus.inputs import venue_fits

    cat = catalog.load_catalog()
    checked = 0
    for v, pick in built:
        q = pick.query
        if v.profile.lang != "zh" or q.focus or q.domain not in ("hotel", "restaurant", "attraction"):
            continue
        slots = dict(q.slots)
        if not any(venue_fits(x, slots) for x in cat.venues_by_domain[q.domain]):
            continue  # nothing in the catalogue fits: any venue of the domain will do
        named = [cat.venue_by_name[e.detail] for e in v.session.events if e.detail in cat.venue_by_name]
        for venue in named:
            assert venue_fits(venue, slots) or venue.name in q.text
            checked += 1
    assert checked >= 5


def test_draw_then_dress_in_any_order_equals_variables() -> None:
    # The build draws a round's queries first (the encoder judges them meanwhile) and dresses
    # them after: that must give exactly the candidates of drawing and dressing one by one.
    logs = read_log(FIXTURES / "clinc150_sample.json") + read_log(FIXTURES / "crosswoz_sample.json.zip")
    one_by_one = InputSampler(11, logs)
    expected = [one_by_one.variables(i) for i in range(60)]
    split = InputSampler(11, logs)
    drawn = [split.draw(i) for i in range(60)]
    assert all(d is not None for d in drawn)
    dressed = {i: split.dress(drawn[i]) for i in reversed(range(60))}  # type: ignore[arg-type]
    for i, want in enumerate(expected):
        assert want is not None
        assert dressed[i][0] == want[0] and dressed[i][1] == want[1]
        assert drawn[i].query == want[0].query  # type: ignore[union-attr]  # what dedup judges


def test_draw_returns_none_when_the_queries_run_out() -> None:
    logs = read_log(FIXTURES / "fewshot_log.jsonl")
    s = InputSampler(0, logs)
    got = [s.draw(i) for i in range(len(logs) + 1)]
    assert all(d is not None for d in got[:-1]) and got[-1] is None
