"""The version catalog: which versions of each service a platform team offers.

Each service offers its own (`catalog.yaml` beside its plugin); a platform team replaces a
service's with its own, cluster-wide, in the Helm values (a YAML file the operator reads at
start), by service:

    <service>:
      default: "2"
      versions:
        "1": {image: example/server:1, state: deprecated}
        "2": {image: example/server:2}
        "0": {image: example/server:0, state: disabled}
        "2-compatible": {image: example/other-server:5, flavor: other}

`flavor` names the server behind an image when a service can be served by more than one (a
server that speaks another's protocol); the plugin says which flavors it knows.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator


class VersionState(StrEnum):
    ENABLED = "enabled"
    DEPRECATED = "deprecated"
    DISABLED = "disabled"


class CatalogVersion(BaseModel):
    model_config = ConfigDict(extra="forbid")
    image: str = Field(min_length=1)
    state: VersionState = VersionState.ENABLED
    flavor: str | None = Field(default=None, pattern=r"^[a-z][a-z0-9-]*$")


class ServiceCatalog(BaseModel):
    model_config = ConfigDict(extra="forbid")
    default: str
    versions: dict[str, CatalogVersion]

    @model_validator(mode="after")
    def default_is_offered(self) -> ServiceCatalog:
        offered = self.versions.get(self.default)
        if offered is None or offered.state == VersionState.DISABLED:
            raise ValueError(f"default version {self.default!r} is not an offered version")
        return self

    def offered(self) -> list[str]:
        return sorted(
            (v for v, entry in self.versions.items() if entry.state != VersionState.DISABLED),
            key=_version_key,
        )


class Catalog(BaseModel):
    model_config = ConfigDict(extra="forbid")
    services: dict[str, ServiceCatalog] = Field(default_factory=dict)

    @classmethod
    def from_yaml(cls, text: str) -> Catalog:
        return cls(services=yaml.safe_load(text) or {})

    @classmethod
    def from_file(cls, path: Path) -> Catalog:
        return cls.from_yaml(path.read_text())

    def over(self, defaults: dict[str, ServiceCatalog]) -> Catalog:
        """This catalog where it names a service, each service's own versions elsewhere."""
        return Catalog(services={**defaults, **self.services})

    def to_yaml(self) -> str:
        services = {
            name: entry.model_dump(mode="json", exclude_defaults=True)
            for name, entry in self.services.items()
        }
        return yaml.safe_dump(services, sort_keys=False)


class ResolvedVersion(BaseModel):
    version: str
    image: str
    deprecated: bool
    flavor: str | None = None


class VersionRefused(ValueError):
    """The resource asks for a version the catalog does not offer."""


def resolve(catalog: Catalog, service: str, requested: str | None) -> ResolvedVersion:
    entries = catalog.services.get(service)
    if entries is None:
        raise VersionRefused(f"the version catalog offers no versions of {service}")
    version = requested or entries.default
    entry = entries.versions.get(version)
    offered = ", ".join(entries.offered())
    if entry is None:
        raise VersionRefused(f"spec.version: {version!r} is not offered; offered versions: {offered}")
    if entry.state == VersionState.DISABLED:
        raise VersionRefused(f"spec.version: {version!r} is disabled; offered versions: {offered}")
    return ResolvedVersion(
        version=version,
        image=entry.image,
        deprecated=entry.state == VersionState.DEPRECATED,
        flavor=entry.flavor,
    )


def _version_key(version: str) -> tuple:
    return tuple(int(p) if p.isdigit() else p for p in version.split("."))
