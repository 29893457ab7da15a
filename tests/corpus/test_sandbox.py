"""Sandboxed template rendering: escapes refused, data literal, roots confined, limits enforced."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness.common.errors import ConfigError
from harness.corpus.sandbox import PromptRenderer, TemplateError

from .conftest import TEMPLATES


def _renderer(tmp_path: Path, files: dict[str, str], **kw: object) -> PromptRenderer:
    root = tmp_path / "root"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text, encoding="utf-8")
    return PromptRenderer([root], **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "source",
    [
        "{{ ''.__class__.__mro__ }}",
        "{{ x | attr('__class__') }}",
        "{{ '{0.__class__}'.format(x) }}",
        "{{ x.__init__.__globals__ }}",
        "{{ x.append(4) }}",
        "{{ cycler.__init__.__globals__.os }}",
    ],
)
def test_sandbox_escapes_raise_a_clear_error(tmp_path: Path, source: str) -> None:
    r = _renderer(tmp_path, {"t.j2": source})
    with pytest.raises(TemplateError) as info:
        r.render("t.j2", {"x": [1, 2]})
    assert isinstance(info.value, ConfigError)
    assert "t.j2" in str(info.value)
    assert "unsafe" in str(info.value) or "undefined" in str(info.value)


def test_trace_text_renders_literally(tmp_path: Path) -> None:
    r = _renderer(tmp_path, {"t.j2": "Q: {{ q }}|{{ items | join(',') }}"})
    data = "{{ 7*7 }} {% for i in range(3) %}x{% endfor %} {{ ''.__class__ }}"
    out = r.render("t.j2", {"q": data, "items": ["{# c #}", "{{ y }}"]})
    assert out == f"Q: {data}|{{# c #}},{{{{ y }}}}"
    assert "49" not in out


def test_undefined_variable_is_an_error(tmp_path: Path) -> None:
    r = _renderer(tmp_path, {"t.j2": "line one\n{{ missing }}"})
    with pytest.raises(TemplateError, match="missing") as info:
        r.render("t.j2", {})
    assert info.value.line == 2


@pytest.mark.parametrize("name", ["../secret.txt", "/etc/passwd", "a/../../secret.txt", "..\\secret.txt"])
def test_traversal_names_are_refused(tmp_path: Path, name: str) -> None:
    (tmp_path / "secret.txt").write_text("SECRET")
    r = _renderer(tmp_path, {"t.j2": "ok"})
    with pytest.raises(TemplateError):
        r.render(name, {})


def test_include_traversal_is_refused(tmp_path: Path) -> None:
    (tmp_path / "secret.txt").write_text("SECRET")
    r = _renderer(tmp_path, {"t.j2": "{% include '../secret.txt' %}"})
    with pytest.raises(TemplateError):
        r.render("t.j2", {})


def test_symlink_escape_is_refused(tmp_path: Path) -> None:
    (tmp_path / "secret.txt").write_text("SECRET")
    r = _renderer(tmp_path, {"t.j2": "{% include 'link.j2' %}"})
    os.symlink(tmp_path / "secret.txt", tmp_path / "root" / "link.j2")
    with pytest.raises(TemplateError, match="outside"):
        r.render("t.j2", {})


def test_output_size_and_repetition_limits(tmp_path: Path) -> None:
    r = _renderer(
        tmp_path,
        {"loop.j2": "{% for i in range(50000) %}0123456789{% endfor %}", "mul.j2": "{{ 'a' * 100000000 }}"},
        max_output_chars=10_000,
    )
    with pytest.raises(TemplateError, match="exceeds 10000"):
        r.render("loop.j2", {})
    with pytest.raises(TemplateError, match="too large"):
        r.render("mul.j2", {})


def test_big_integer_arithmetic_is_refused(tmp_path: Path) -> None:
    """A big-int ``**`` runs in C where the render-time check cannot stop it: refused up front."""
    r = _renderer(
        tmp_path,
        {
            "pow.j2": "{{ (((9**64)**64)**64)**64 }}",
            "mul.j2": "{{ ((9**64)**64)**4 * ((9**64)**64)**4 }}",
            "ok.j2": "{{ 2**64 }}",
        },
    )
    for name in ("pow.j2", "mul.j2"):
        with pytest.raises(TemplateError, match="too large"):
            r.render(name, {})
    assert r.render("ok.j2", {}) == str(2**64)


def test_render_time_limit(tmp_path: Path) -> None:
    src = "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}x{% endfor %}"
    r = _renderer(tmp_path, {"slow.j2": src}, max_render_s=0.2)
    with pytest.raises(TemplateError, match="longer than"):
        r.render("slow.j2", {})


def test_shipped_templates_render_with_documented_variables() -> None:
    from harness.corpus.assemble import template_context
    from harness.corpus.inputs import InputSampler
    from harness.corpus.logs import Utterance, read_log

    from .conftest import FIXTURES

    sampler = InputSampler(3, read_log(FIXTURES / "clinc150_sample.json"))
    got = sampler.variables(0)
    assert got is not None
    v, pick = got
    shot = Utterance(
        id="x", text="{{ 7*7 }} literal", lang="en", domain="travel", intent=None, source="t", response="ok"
    )
    ctx = template_context(v, pick, [shot], None)
    r = PromptRenderer([TEMPLATES])
    out = r.render("four_section.j2", ctx)
    for needle in (v.profile.name, v.query, v.session.events[0].action, "{{ 7*7 }} literal", v.request_at):
        assert needle in out
    assert out.count("## ") == 4
    system = r.render("chat/system.j2", ctx)
    user = r.render("chat/user.j2", ctx)
    assert v.profile.name in system
    assert user.rstrip().endswith(v.query)
