"""read_yaml: one way to read the YAML files people write, naming file, line and field."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict

from harness.common.errors import ConfigError, InputError
from harness.common.io import read_yaml


class Stage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    qps: float


class Doc(BaseModel):
    model_config = ConfigDict(extra="forbid")
    stages: list[Stage]


def test_valid_and_plain_mapping(tmp_path: Path) -> None:
    p = tmp_path / "p.yaml"
    p.write_text("stages:\n  - name: a\n    qps: 1\n")
    assert read_yaml(p, Doc, expected="a plan").stages[0].qps == 1.0
    assert read_yaml(p, expected="a plan") == {"stages": [{"name": "a", "qps": 1}]}


def test_a_bad_field_names_its_line(tmp_path: Path) -> None:
    p = tmp_path / "p.yaml"
    p.write_text("stages:\n  - name: a\n    qps: 1\n  - name: b\n    qps: fast\n")
    with pytest.raises(InputError) as err:
        read_yaml(p, Doc, expected="a plan")
    assert (err.value.line, err.value.field) == (5, "stages.1.qps")
    p.write_text("stages:\n  - name: a\n    qps: 1\n    qsp: 2\n")
    with pytest.raises(ConfigError) as cerr:
        read_yaml(p, Doc, expected="a plan", error=ConfigError, hint=lambda e: "typo?")
    assert (cerr.value.line, cerr.value.field, cerr.value.hint) == (4, "stages.0.qsp", "typo?")


def test_not_yaml_or_not_a_mapping(tmp_path: Path) -> None:
    p = tmp_path / "p.yaml"
    p.write_text("stages:\n  - name: [a\n")
    with pytest.raises(InputError) as err:
        read_yaml(p, Doc, expected="a plan")
    assert "not valid YAML" in err.value.message and err.value.line is not None
    p.write_text("- 1\n- 2\n")
    with pytest.raises(InputError, match="not a YAML mapping, expected a plan"):
        read_yaml(p, Doc, expected="a plan")
