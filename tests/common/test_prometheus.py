"""The one exposition parser and the one counter rule (harness.common.prometheus).

Expected values are worked by hand from the text and the numbers written in each test.
"""

from __future__ import annotations

import pytest

from harness.common.prometheus import Sample, counter_increase, parse_exposition, total_increase

TEXT = """\
# HELP cache_hits_total Cache hits per tier.
# TYPE cache_hits_total counter
cache_hits_total{tier="l2",tenant="b"} 3.0
cache_hits_total{tenant="a",tier="l1"} 8.0
cache_hits_created{tenant="a",tier="l1"} 1.7e+09
# TYPE cache_lookup_seconds histogram
cache_lookup_seconds_bucket{le="0.1",tier="l1"} 4.0
cache_lookup_seconds_bucket{le="+Inf",tier="l1"} 5.0
cache_lookup_seconds_count{tier="l1"} 5.0
cache_lookup_seconds_sum{tier="l1"} 0.25
harness_engine_running_requests 2
"""


def test_every_sample_in_order_with_sorted_labels() -> None:
    got = parse_exposition(TEXT)
    assert [s.name for s in got] == [
        "cache_hits_total", "cache_hits_total", "cache_hits_created", "cache_lookup_seconds_bucket",
        "cache_lookup_seconds_bucket", "cache_lookup_seconds_count", "cache_lookup_seconds_sum",
        "harness_engine_running_requests",
    ]  # fmt: skip
    assert got[1] == Sample("cache_hits_total", (("tenant", "a"), ("tier", "l1")), 8.0)
    assert got[0].labels == (("tenant", "b"), ("tier", "l2"))  # sorted, whatever the text's order
    assert got[-1] == Sample("harness_engine_running_requests", (), 2.0)


def test_only_the_names_asked_for_and_their_names_unchanged_without_type_lines() -> None:
    got = parse_exposition(TEXT, ["cache_hits_total", "cache_lookup_seconds_sum", "absent"])
    assert [(s.name, s.value) for s in got] == [
        ("cache_hits_total", 3.0), ("cache_hits_total", 8.0), ("cache_lookup_seconds_sum", 0.25)
    ]  # fmt: skip
    assert parse_exposition(TEXT, []) == []


def test_text_that_is_not_an_exposition() -> None:
    # Lines of other names are dropped unread: a login page has no wanted sample.
    assert parse_exposition("<html>not metrics</html>\n", ["up"]) == []
    with pytest.raises(ValueError):  # a wanted line that is not a sample
        parse_exposition('up{job="x"} lots\n', ["up"])
    with pytest.raises(ValueError):  # everything is wanted without names
        parse_exposition("<html>not metrics</html>\n")


def test_a_counter_grows_by_its_difference() -> None:
    assert counter_increase(100.0, 150.0) == 50.0
    assert counter_increase(7.0, 7.0) == 0.0


def test_a_reset_counts_the_value_after_it_from_zero() -> None:
    # 180 then 20: the server restarted and has counted 20 since; Prometheus's increase() says 20.
    assert counter_increase(180.0, 20.0) == 20.0
    assert counter_increase(180.0, 0.0) == 0.0


def test_a_drop_by_float_noise_is_no_growth_not_a_reset() -> None:
    big = 123456789.125
    assert counter_increase(big, big * (1 - 1e-12)) == 0.0  # not the whole counter again
    assert counter_increase(0.30000000000000004, 0.3) == 0.0
    # A real drop, however close the value after it, is a reset.
    assert counter_increase(1000.0, 990.0) == 990.0


def test_total_increase_over_scrapes() -> None:
    assert total_increase([100.0, 150.0, 180.0, 20.0, 50.0]) == 50 + 30 + 20 + 30  # one reset
    assert total_increase([10.0, 40.0, 5.0, 25.0, 3.0, 4.0]) == 30 + 5 + 20 + 3 + 1  # two resets
    assert total_increase([5.0, 5.0 - 1e-15, 9.0]) == pytest.approx(4.0)  # noise, then growth
    assert total_increase([42.0]) is None  # one point: no interval
    assert total_increase([]) is None
