"""Renders a service's children from its jinja2 templates (`templates/<service>/*.yaml.j2`)."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import jinja2
import yaml

TEMPLATES_DIR = Path(__file__).resolve().parent.parent / "templates"


class RenderFailed(Exception):
    """A template could not render the context, or rendered what is not YAML."""


@functools.cache
def environment(root: Path = TEMPLATES_DIR) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(root)),
        undefined=jinja2.StrictUndefined,  # a missing variable is a bug, not an empty string
        keep_trailing_newline=True,
        autoescape=False,  # YAML, not HTML
    )
    env.filters["json"] = lambda value: json.dumps(value, sort_keys=True)
    return env


def render_children(
    service: str, context: dict[str, Any], root: Path = TEMPLATES_DIR
) -> list[dict[str, Any]]:
    """Every object the service's templates render for `context`, in template-name order."""
    env = environment(root)
    children: list[dict[str, Any]] = []
    for template_name in sorted(
        n for n in env.list_templates() if n.startswith(f"{service}/") and n.endswith(".yaml.j2")
    ):
        try:
            text = env.get_template(template_name).render(**context)
            documents = list(yaml.safe_load_all(text))
        except (jinja2.TemplateError, yaml.YAMLError, ValueError, TypeError) as error:
            raise RenderFailed(f"{template_name}: {type(error).__name__}: {error}") from error
        children.extend(document for document in documents if document)
    return children
