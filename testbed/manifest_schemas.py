"""JSON schemas for kubeconform, offline: Kubernetes' own from the OpenAPI v3 documents its
Go module ships (`api/openapi-spec/v3`, the release the test bed runs: what its API server
serves), Statefleet's from its CRDs. One strict, standalone file per kind and version, named
as kubeconform looks them up (`{{ .ResourceKind }}{{ .KindSuffix }}.json`:
`statefulset-apps-v1.json`, `pod-v1.json`).

    python3 testbed/manifest_schemas.py OPENAPI_V3_DIR CRD_DIR OUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

# The draft the rewritten schemas follow (numeric exclusive bounds), named in each.
DRAFT = "https://json-schema.org/draft/2020-12/schema"
# Values the API takes as a number or a string.
NUMBER_OR_STRING = {"anyOf": [{"type": "string"}, {"type": "number"}]}
LOOSE = {
    "io.k8s.apimachinery.pkg.util.intstr.IntOrString": NUMBER_OR_STRING,
    "io.k8s.apimachinery.pkg.api.resource.Quantity": NUMBER_OR_STRING,
}


def file_name(group: str, version: str, kind: str) -> str:
    """kubeconform's name: kind, then the group's first label (when there is a group), then
    the version, lower-cased."""
    suffix = f"-{group.split('.')[0]}-{version}" if group else f"-{version}"
    return f"{kind}{suffix}".lower() + ".json"


def strict(schema: Any) -> Any:
    """Every object that lists its properties refuses others (unless it keeps unknown fields);
    every typed value may also be null (as YAML writes an empty field). Walks schemas by their
    keywords: a property may be named like one (`type`, `anyOf`: JSONSchemaProps has both)."""
    if not isinstance(schema, dict):
        return schema
    made = dict(schema)
    for key in ("properties", "definitions", "patternProperties"):
        if isinstance(made.get(key), dict):
            made[key] = {name: strict(value) for name, value in made[key].items()}
    for key in ("items", "additionalProperties", "not"):
        if isinstance(made.get(key), dict):
            made[key] = strict(made[key])
    for key in ("allOf", "anyOf", "oneOf"):
        if isinstance(made.get(key), list):
            made[key] = [strict(value) for value in made[key]]
    unknown_kept = made.get("x-kubernetes-preserve-unknown-fields")
    if "properties" in made and "additionalProperties" not in made and not unknown_kept:
        made["additionalProperties"] = False
    for bound, exclusive in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
        # OpenAPI 3.0's form, a flag on the bound: 2020-12 takes the bound itself.
        if isinstance(made.get(exclusive), bool) and made.pop(exclusive) and bound in made:
            made[exclusive] = made.pop(bound)
    if made.get("x-kubernetes-int-or-string") is True:
        made.pop("type", None)
        made.update(NUMBER_OR_STRING)
    kind = made.get("type")
    if isinstance(kind, str):
        made["type"] = [kind, "null"]
    return made


def standalone(name: str, definitions: dict[str, Any]) -> dict[str, Any]:
    """Definition `name` with every definition it reaches, references kept local."""
    reached: dict[str, Any] = {}

    def visit(node: Any) -> Any:
        if isinstance(node, list):
            return [visit(item) for item in node]
        if not isinstance(node, dict):
            return node
        reference = node.get("$ref") if isinstance(node.get("$ref"), str) else ""
        if reference.startswith("#/components/schemas/"):
            target = reference.rsplit("/", 1)[1]
            if target in LOOSE:
                return LOOSE[target]
            if target not in reached:
                reached[target] = {}
                reached[target] = visit(definitions[target])
            return {"$ref": f"#/definitions/{target}"}
        return {key: visit(value) for key, value in node.items()}

    root = visit(definitions[name])
    return {"$schema": DRAFT, **strict({**root, "definitions": reached})}


def kubernetes_schemas(documents: Path, out: Path) -> int:
    definitions: dict[str, Any] = {}
    for path in sorted(documents.glob("*.json")):
        definitions.update((json.loads(path.read_text()).get("components") or {}).get("schemas") or {})
    written = 0
    for name, definition in definitions.items():
        for gvk in definition.get("x-kubernetes-group-version-kind") or []:
            schema = standalone(name, definitions)
            (out / file_name(gvk["group"], gvk["version"], gvk["kind"])).write_text(json.dumps(schema))
            written += 1
    return written


def crd_schemas(crd_dir: Path, out: Path) -> int:
    written = 0
    for path in sorted(crd_dir.glob("*.yaml")):
        for crd in yaml.safe_load_all(path.read_text()):
            if not crd or crd.get("kind") != "CustomResourceDefinition":
                continue
            group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
            for version in crd["spec"]["versions"]:
                schema = dict(version["schema"]["openAPIV3Schema"])
                properties = dict(schema.get("properties") or {})
                properties.setdefault("apiVersion", {"type": "string"})
                properties.setdefault("kind", {"type": "string"})
                properties.setdefault("metadata", {"type": "object"})
                schema["properties"] = properties
                name = file_name(group, version["name"], kind)
                (out / name).write_text(json.dumps({"$schema": DRAFT, **strict(schema)}))
                written += 1
    return written


def main() -> int:
    documents, crd_dir, out = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    out.mkdir(parents=True, exist_ok=True)
    made = kubernetes_schemas(documents, out)
    made += crd_schemas(crd_dir, out)
    print(f"{made} schemas in {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
