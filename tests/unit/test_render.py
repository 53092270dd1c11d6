"""Rendering a service's templates: a failure names the template and what went wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from framework.render import RenderFailed, render_children

pytestmark = pytest.mark.unit


def test_objects_render_in_template_name_order(tmp_path: Path) -> None:
    (tmp_path / "svc").mkdir()
    (tmp_path / "svc" / "20-b.yaml.j2").write_text("kind: B\nname: {{ name }}\n")
    (tmp_path / "svc" / "10-a.yaml.j2").write_text("kind: A\n---\nkind: A2\n")
    assert render_children("svc", {"name": "x"}, tmp_path) == [
        {"kind": "A"},
        {"kind": "A2"},
        {"kind": "B", "name": "x"},
    ]


@pytest.mark.parametrize(
    ("template", "context", "said"),
    [
        (
            "data: |\n  line = '{{ value }}'\nkind: X\n",
            {"value": "a\nb: [c"},
            "ParserError: while parsing a flow sequence",
        ),
        ("kind: {{ missing }}\n", {}, "UndefinedError: 'missing' is undefined"),
    ],
)
def test_a_failure_names_the_template(tmp_path: Path, template: str, context: dict, said: str) -> None:
    (tmp_path / "svc").mkdir()
    (tmp_path / "svc" / "10-config.yaml.j2").write_text(template)
    with pytest.raises(RenderFailed) as failed:
        render_children("svc", context, tmp_path)
    assert str(failed.value).startswith("svc/10-config.yaml.j2: ")
    assert said in str(failed.value)
