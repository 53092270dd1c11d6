"""The base of every spec model: camelCase in the API, CEL rules, errors that name the field."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

# A Kubernetes quantity, as the API server accepts it (e.g. 1Gi, 500M, 0.5).
QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?(m|k|Ki|M|Mi|G|Gi|T|Ti|P|Pi|E|Ei)?$"


def immutable(field: str) -> dict[str, Any]:
    """The CEL rule (a field's `json_schema_extra`) that refuses a change of the field."""
    return {"x-kubernetes-validations": [{"rule": "self == oldSelf", "message": f"{field} is immutable"}]}


def optional_immutable(field: str) -> dict[str, Any]:
    """The same for an optional field, on the object that holds it: neither set, unset nor changed."""
    return {
        "x-kubernetes-validations": [
            {
                "rule": f"has(self.{field}) == has(oldSelf.{field}) && "
                f"(!has(self.{field}) || self.{field} == oldSelf.{field})",
                "message": f"{field} is immutable",
            }
        ]
    }


class ApiModel(BaseModel):
    """A part of a resource's spec: camelCase in the API, snake_case in Python, no unknown fields."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    def to_api(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


class StatusModel(ApiModel):
    """A part of a resource's status: camelCase as the spec; read back, it ignores the fields it
    does not name (kopf's, an older operator's). Its JSON schema is the CRD's status schema."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")


def free_form(description: str, nullable: bool = False) -> Any:
    """A field holding any object (a Job's report, a recorded spec): kept as written."""
    extra: dict[str, Any] = {"x-kubernetes-preserve-unknown-fields": True}
    if nullable:
        extra["nullable"] = True
    return Field(default=None, description=description, json_schema_extra=extra)


def describe_validation_error(error: ValidationError) -> str:
    """One line per problem, each naming the field as the user wrote it (spec.storage.size)."""
    parts = []
    for problem in error.errors():
        location = ".".join(str(p) for p in ("spec", *problem["loc"]))
        parts.append(f"{location}: {problem['msg']}")
    return "; ".join(parts)
