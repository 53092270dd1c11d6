"""CustomResourceDefinitions generated from the plugins' pydantic models.

Kubernetes wants a structural OpenAPI v3 schema: no `$ref`, no `anyOf` for optional
fields, `x-kubernetes-*` extensions where the API server should keep free-form objects or
run CEL rules. `python -m statefleet.generate` writes `crds/`; a unit test fails when it is stale.
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic import BaseModel

from framework.kube.meta import GROUP, VERSION

_DROPPED_KEYS = {"title", "default"}


def structural_schema(model: type[BaseModel]) -> dict[str, Any]:
    """`model`'s JSON schema, with references inlined and optional fields made plain."""
    schema = model.model_json_schema(by_alias=True, mode="validation")
    definitions = schema.pop("$defs", {})
    return _clean(schema, definitions)


def status_properties(model: type[BaseModel] | None) -> dict[str, Any]:
    """The properties of a status model's schema ({} without one)."""
    return structural_schema(model).get("properties", {}) if model is not None else {}


def _clean(node: Any, definitions: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_clean(item, definitions) for item in node]
    if not isinstance(node, dict):
        return node
    node = dict(node)
    while "$ref" in node or "anyOf" in node:  # Optional[Model] is an anyOf holding a $ref
        if "$ref" in node:
            target = copy.deepcopy(definitions[node.pop("$ref").rsplit("/", 1)[-1]])
            node = {**target, **node}
        if "anyOf" in node:  # Optional[X]: X, since absent already means None
            variants = [v for v in node.pop("anyOf") if v.get("type") != "null"]
            if len(variants) == 1:
                node = {**variants[0], **node}
            else:
                node["x-kubernetes-int-or-string"] = True
    for bound, limit in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(node.get(bound), int | float) and not isinstance(node.get(bound), bool):
            node[limit], node[bound] = node[bound], True  # OpenAPI v3.0's form, which Kubernetes reads
    if "enum" in node and "type" not in node:
        node["type"] = "string"
    if node.get("x-kubernetes-preserve-unknown-fields"):
        node.setdefault("type", "object")
        node.pop("additionalProperties", None)
    cleaned = {k: _clean(v, definitions) for k, v in node.items() if k not in _DROPPED_KEYS}
    if cleaned.get("additionalProperties") is True:
        cleaned.pop("additionalProperties")
        cleaned["x-kubernetes-preserve-unknown-fields"] = True
    if cleaned.get("additionalProperties") is False:
        cleaned.pop("additionalProperties")
    return cleaned


def dropped_fields(value: Any, schema: dict[str, Any], path: str = "status") -> list[str]:
    """The paths in `value` the API server would drop when it writes it under `schema` (it
    prunes an object's fields its schema does not name, unless it preserves unknown fields)."""
    if isinstance(value, list):
        items = schema.get("items") or {}
        return [p for i, item in enumerate(value) for p in dropped_fields(item, items, f"{path}[{i}]")]
    if not isinstance(value, dict) or schema.get("type") != "object":
        return []
    known = schema.get("properties")
    keeps_unknown = schema.get("x-kubernetes-preserve-unknown-fields") or known is None
    dropped = []
    for key, item in value.items():
        if known is not None and key in known:
            dropped += dropped_fields(item, known[key], f"{path}.{key}")
        elif not keeps_unknown:
            dropped.append(f"{path}.{key}")
    return dropped


def build_crd(
    kind: str,
    plural: str,
    spec_model: type[BaseModel],
    status_schema: dict[str, Any],
    short_names: tuple[str, ...],
    printer_columns: list[dict[str, Any]],
    categories: tuple[str, ...] = ("statefleet", "all"),
) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": list(short_names),
                "categories": list(categories),
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": printer_columns,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": structural_schema(spec_model),
                                "status": status_schema,
                            },
                        }
                    },
                }
            ],
        },
    }
