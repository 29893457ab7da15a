"""Which commands show a load option is declared on its field (``Flag(uses=…)``), not in lists."""

from __future__ import annotations

import pytest

from harness.common.options import flag_of
from harness.load.options import RUN_USES, USES, LoadOptions, load_flags


def test_every_use_a_field_declares_is_in_the_vocabulary() -> None:
    for name, info in LoadOptions.model_fields.items():
        assert set(flag_of(info).uses) <= USES.keys(), name
    assert set(RUN_USES) < USES.keys()


def test_a_command_shows_the_fields_of_its_uses() -> None:
    capacity = load_flags("send", "precision")
    assert {"corpus", "max_tokens_cap", "api_key", "until_precision"} <= set(capacity)
    assert not {"rate", "start_delay", "max_duration", "schedule"} & set(capacity)
    # harness run takes every use, and none of a run's own fields (it sets its --out and stage itself)
    run = load_flags(*RUN_USES)
    assert {"schedule", "rate", "capacity", "speedup", "max_duration", "plan", "preload"} <= set(run)
    assert not {"results_dir", "stage", "warmup_id", "precision_confidence"} & set(run)
    # the cache keys on what the warmup plan prepares as the replay will send it
    assert load_flags("key") == ("model", "max_tokens_cap", "api")


def test_a_ladder_refuses_a_replays_arrivals_and_a_replay_has_no_plan() -> None:
    ladder, replay = set(load_flags(but="arrivals")), set(load_flags(but="ladder"))
    assert "plan" in ladder and "plan" not in replay
    assert not {"rate", "schedule", "duration", "stage", "until_precision"} & ladder
    assert ladder | replay == set(LoadOptions.model_fields)


def test_an_unknown_use_is_a_programming_error() -> None:
    with pytest.raises(AssertionError, match="not a use"):
        load_flags("sned")
