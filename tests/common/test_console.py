"""The table helper of the command line's output (harness.common.console.table)."""

from __future__ import annotations

import io

from rich.console import Console

from harness.common.console import table


def test_columns_left_by_name_the_rest_right_and_a_pair_says_its_own() -> None:
    t = table("t", ("name", "n", ("ok", "center")), [("a", "1", "✓"), ("bb", "22", "✗")], left={"name"})
    assert [(c.header, c.justify) for c in t.columns] == [("name", "left"), ("n", "right"), ("ok", "center")]
    assert t.row_count == 2 and list(t.columns[1].cells) == ["1", "22"]


def test_without_left_every_column_is_rich_s_default_and_options_reach_the_table() -> None:
    t = table("t", ("a", "b"), title_justify="left", caption="c")
    assert [c.justify for c in t.columns] == ["left", "left"] and t.row_count == 0
    assert (t.title, t.title_justify, t.caption) == ("t", "left", "c")
    assert [c.justify for c in table("t", ("a", "b"), left=()).columns] == ["right", "right"]


def test_it_prints_as_a_table_built_by_hand_does() -> None:
    from rich.table import Table

    by_hand = Table(title="x")
    by_hand.add_column("k")
    by_hand.add_column("v", justify="right")
    by_hand.add_row("a", "1")
    out = []
    for t in (by_hand, table("x", ("k", "v"), [("a", "1")], left={"k"})):
        console = Console(width=40, record=True, file=io.StringIO())
        console.print(t)
        out.append(console.export_text())
    assert out[0] == out[1]
