"""The plugin contract: what a data service gives the framework.

A service is a folder `services/<name>/` with a spec model and a `ServicePlugin` subclass,
and `templates/<name>/` with jinja2 templates of its children. The framework does the rest:
kopf registration, the reconcile loop, children applied with server-side apply and owned
by the resource, generated Secrets, status conditions, Events, the version catalog.
See docs/adding-a-service.md.
"""

from __future__ import annotations

import secrets
import string
import sys
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar

import yaml
from lightkube import AsyncClient
from lightkube.generic_resource import create_namespaced_resource
from pydantic import BaseModel, Field

from framework import credentials
from framework.catalog import ResolvedVersion, ServiceCatalog
from framework.kube import conditions, crd
from framework.kube.api import EventNote
from framework.kube.conditions import Condition
from framework.kube.meta import (
    GROUP,
    LABEL_INSTANCE,
    LABEL_MANAGED_BY,
    LABEL_NAME,
    LABEL_PART_OF,
    MANAGER,
    VERSION,
)
from framework.kube.model import StatusModel
from framework.rollout.hooks import InProcess

TLS_CA, TLS_SERVER = "ca", "tls"  # suffixes of the Secrets of an instance's TLS


def random_text(length: int) -> str:
    """A random password of ASCII letters and digits (nothing a passfile, a URI or SASLprep changes)."""
    alphabet = string.ascii_letters + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(length))


@dataclass(frozen=True)
class GeneratedSecret:
    """A Secret the framework creates once and never regenerates (credentials)."""

    suffix: str  # the Secret is named <resource>-<suffix>
    fixed: dict[str, str] = field(default_factory=dict)  # e.g. {"username": "admin"}
    random: tuple[str, ...] = ()  # keys that get a fresh random value, once
    length: int = 32

    def name(self, resource: str) -> str:
        return f"{resource}-{self.suffix}"

    def env(self, variable: str, resource: str, key: str) -> dict[str, Any]:
        """A container `env` entry with `key` of this Secret of instance `resource`."""
        return {"name": variable, "valueFrom": {"secretKeyRef": {"name": self.name(resource), "key": key}}}

    def initial_data(self) -> dict[str, str]:
        return {**self.fixed, **{key: random_text(self.length) for key in self.random}}


@dataclass(frozen=True)
class Inspection:
    """What a plugin's servers said when last asked (see `ServicePlugin.inspect`)."""

    at: float  # the event loop's clock
    facts: Any  # the plugin's own reading
    answered: bool  # at least one server answered (the framework backs off when none does)


class UnknownAction(TypeError):
    """A plugin was handed an action it does not carry out: a bug, never skipped in silence."""

    def __init__(self, plugin: ServicePlugin, action: Any) -> None:
        super().__init__(f"{plugin.kind} does not carry out {action!r}")


@dataclass
class Operations:
    """What a plugin wants done inside its service this pass (see `ServicePlugin.plan`)."""

    pod_labels: dict[str, dict[str, str]] = field(default_factory=dict)  # pod name -> labels to set
    actions: list[Any] = field(default_factory=list)  # handed to `perform`, in order, after the apply
    status: dict[str, Any] = field(default_factory=dict)  # status fields the plugin owns
    events: list[EventNote] = field(default_factory=list)
    inspect_in: float | None = None  # seconds until the servers should be asked again


@dataclass
class Observed:
    """What the cluster shows of one resource and its children, read once per reconcile."""

    name: str
    namespace: str
    generation: int
    spec: dict[str, Any]
    status: dict[str, Any]
    annotations: dict[str, str] = field(default_factory=dict)  # the resource's own
    statefulset: dict[str, Any] | None = None
    pods: list[dict[str, Any]] = field(default_factory=list)
    secrets: dict[str, dict[str, Any]] = field(default_factory=dict)  # by suffix
    inspection: Inspection | None = None  # the servers' last answers, None before the first
    clock: float = 0.0  # the event loop's clock when observed (to age `inspection`)
    cert_manager: bool = False  # cert-manager's API is served in the cluster
    certificate: dict[str, Any] | None = None  # the server Certificate, when cert-manager makes it
    ca_certificate: dict[str, Any] | None = None  # and the CA's
    # The objects the spec names (`ServicePlugin.references`), by key; None: it does not exist.
    references: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    # Why the API refuses the StatefulSet's missing pods (admission, a quota), when it does.
    pods_refused: str | None = None
    # The ServiceBindings that name the instance (read only when the operator makes
    # NetworkPolicies: their workloads are let in).
    bindings: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class Reference:
    """An object in the instance's namespace that its spec names (a storage, say)."""

    resource: Any  # the lightkube resource class
    name: str


@dataclass(frozen=True)
class ServiceStatus:
    """A plugin's reading of its service: the framework turns it into conditions."""

    ready_instances: int
    instances: int
    ready: bool
    message: str
    degraded: bool = False  # running, but with fewer healthy instances than asked for
    fields: dict[str, Any] = field(default_factory=dict)  # extra status fields (primary, endpoints)
    # The plugin's own conditions (beside Ready, Progressing, Degraded): each change of status
    # is also an Event, Normal when it turns True, Warning when it turns False.
    conditions: tuple[Condition, ...] = ()
    withdrawn_conditions: tuple[str, ...] = ()  # the plugin's conditions that no longer apply


class TlsStatus(StatusModel):
    secret: str | None = None
    not_after: str | None = None
    issued_at_seconds: float | None = None
    provider: str | None = Field(default=None, description="operator or cert-manager, chosen once")
    resources_hash: str | None = Field(default=None, description="cert-manager objects last applied")
    waiting: str | None = Field(default=None, description="why cert-manager has not issued it yet")


class InstanceStatus(StatusModel):
    """The status fields of every instance the framework writes (besides conditions)."""

    observed_generation: int | None = Field(default=None, json_schema_extra={"format": "int64"})
    instances: str | None = Field(default=None, description="ready/desired")
    ready_instances: int | None = None
    version: str | None = None
    image: str | None = None
    children_hash: str | None = Field(default=None, description="what the operator last applied")
    tools_image: str | None = Field(
        default=None, description="the operator image its init containers run, kept from its creation"
    )
    tls: TlsStatus | None = Field(default=None, description="the server certificate (TLS in transit)")


class RotationStatus(StatusModel):
    """The status field of an instance whose plugin has the `Rotation` capability."""

    credentials_rotation: credentials.CredentialsRotationStatus | None = Field(
        default=None,
        description="the last credentials rotation (spec.rotateCredentials), or the one under way",
    )


INVALID_SPEC = "InvalidSpec"  # the spec cannot be served: nothing is applied, nothing operated
CHANGE_REFUSED = "ChangeRefused"  # applying the spec would lose data: not applied, still operated
RENDER_FAILED = "RenderFailed"  # the templates could not take the spec: not applied, still operated


@dataclass(frozen=True)
class Refusal:
    reason: str  # INVALID_SPEC or CHANGE_REFUSED
    message: str  # names the field


@dataclass
class ServicePlan:
    """A plugin's decision for one pass (`ServicePlugin.plan`), made from one reading."""

    reading: ServiceStatus | None  # None only with a refusal
    operations: Operations = field(default_factory=Operations)
    context: dict[str, Any] = field(default_factory=dict)  # the templates' own variables
    refusal: Refusal | None = None


def refused_spec(message: str) -> ServicePlan:
    """A spec the service cannot serve at all: nothing is operated either."""
    return ServicePlan(reading=None, refusal=Refusal(INVALID_SPEC, message))


def decided(observed: Observed, operations: Operations) -> Observed:
    """`observed` with the status fields `operations` decided (None removes one): what the
    service's reading is made from, since what was just decided (a new primary) is true now."""
    if not operations.status:
        return observed
    merged = {**observed.status, **operations.status}
    return replace(observed, status={k: v for k, v in merged.items() if v is not None})


class Tls(ABC):
    """Instances that serve TLS: the framework keeps a CA (`<name>-ca`) and a server
    certificate (`<name>-tls`: tls.crt, tls.key, ca.crt) for each, renewed before they expire
    (`framework.certificates`), made by cert-manager when it is installed."""

    @abstractmethod
    def hosts(self, name: str, namespace: str) -> list[str]:
        """The DNS names the server certificate of instance `name` carries."""


class Bindings(ABC):
    """A service applications bind to with a `ServiceBinding`: the binding makes a user
    resource of `user_kind` (one of the plugin's `in_service_kinds`), then a Secret."""

    user_kind: ClassVar[str]

    @abstractmethod
    def user_spec(self, binding: str, instance: str) -> dict[str, Any]:
        """The spec of the user resource a ServiceBinding named `binding` creates."""

    @abstractmethod
    def secret_data(
        self, service: dict[str, Any], user: dict[str, Any], credentials: dict[str, str], ca: str | None
    ) -> dict[str, str]:
        """The binding Secret's entries as servicebinding.io lays them out (type, provider,
        host, port, username, password, database, uri ...), from the service resource, the
        ready user resource, its credentials Secret and the instance's CA (PEM, None without
        TLS). Pure."""


class Backups(ABC):
    """A service with backups (`Backup`, `BackupPlan`, `Restore`): the Jobs run its driver."""

    # The module of the driver the backup Jobs run (`backup.driver.Driver`, exposed as `DRIVER`,
    # in the service's own folder), and its methods, the default first.
    driver: ClassVar[str]
    methods: ClassVar[tuple[str, ...]]
    # Methods whose backup becomes a new instance's data before its server starts (an init
    # container runs the driver's `bootstrap`, e.g. physical; the driver is then a
    # `backup.driver.BootstrapsPhysical`). Any other method is restored by a Job into the
    # running instance.
    bootstrap_methods: ClassVar[tuple[str, ...]] = ()
    # Methods a Restore may restore over an existing instance by a Job (`target.replace`: the
    # driver's `restore` with a token, `roll_back` and `commit`, e.g. logical; the driver is
    # then a `backup.driver.ReplacesOnline`).
    replaces_online: ClassVar[tuple[str, ...]] = ()
    # A physical backup restored over a running instance (`backup.in_place`): the plugin
    # stops the instance, takes the backup in an init container and answers in status (the
    # driver is then a `backup.driver.ReplacesInPlace`).
    restores_in_place: ClassVar[bool] = False
    # The module of the service's continuous archive (`backup.point_in_time.Archive`, exposed
    # as `ARCHIVE`): a Restore may then take `spec.pointInTime`, a bootstrap method's backup
    # recovered to that point by the new instance's first pod. None: no point-in-time recovery.
    point_in_time: ClassVar[str | None] = None
    # The spec fields of the smallest instance (a BackupPlan's restore tests make throwaways).
    throwaway_spec: ClassVar[dict[str, Any]]

    @abstractmethod
    def job_env(self, name: str) -> list[dict[str, Any]]:
        """The environment (container `env` entries) with which a backup or restore Job reaches
        instance `name` in its namespace: host, port, credentials from the instance's Secrets."""

    def restored_spec(self, recorded: dict[str, Any], version: str, method: str) -> dict[str, Any]:
        """The spec of a new instance made from a backup: the spec the backup recorded (with the
        Restore's changes over it), the server `version` and `method` of the backup. Raises
        ValueError (naming the field) when that backup cannot start such an instance. As
        recorded, unless the service says otherwise."""
        return recorded

    def in_place_methods(self) -> tuple[str, ...]:
        """The methods restored over an existing instance in place (stopped), not by a Job."""
        return self.bootstrap_methods if self.restores_in_place else ()


class Rotation(ABC):
    """A service whose own generated passwords rotate on request (`spec.rotateCredentials`, see
    `framework.credentials`): the framework stages a `next-password` in each of `secrets`, has the
    plugin's action `apply` set them on the servers, and swaps them in. The spec model declares
    the field (`framework.credentials.rotate_credentials_field`); the CRD's status gets
    `credentialsRotation`; a spec restored from a backup drops the request."""

    secrets: ClassVar[tuple[GeneratedSecret, ...]]  # each with a `password` that rotates

    @abstractmethod
    def waiting(self, observed: Observed) -> str | None:
        """Pure: why the servers cannot take new passwords now (a change of primary under way, a
        primary that does not answer), or None when they can."""

    @abstractmethod
    def apply(self, observed: Observed) -> Any:
        """Pure: the plugin's action (one of its `actions`) that makes its servers take the
        passwords the Secrets stage (`next-password`, else `password`: one swapped already), and
        their own clients (a standby's replication) use them; idempotent, and carried out
        again just before the swap. It raises until every server that answers has them."""


class ServicePlugin(ABC):
    kind: ClassVar[str]
    plural: ClassVar[str]
    short_names: ClassVar[tuple[str, ...]] = ()
    service: ClassVar[str]  # catalog key, template folder, app.kubernetes.io/name
    spec_model: ClassVar[type[BaseModel]]
    generated_secrets: ClassVar[tuple[GeneratedSecret, ...]] = ()
    # The plugin's `statefleet` verbs: a module with `add(subparsers)` that returns its group's
    # subparsers (the framework's verbs join them: `rotate-credentials` with `rotation`), whose
    # parsers set `handler(args, kube) -> exit code` (e.g. `statefleet pg promote`). None: no
    # verbs of its own (a plugin with `rotation` gets a group named after its service).
    commands: ClassVar[Any] = None
    # What the plugin's own code does in the cluster beyond the framework's (RBAC rules, as in a
    # ClusterRole), e.g. reading EndpointSlices; the chart's RBAC is generated with them.
    rbac_rules: ClassVar[tuple[dict[str, Any], ...]] = ()
    # Kinds the templates render, in apply order; children of these kinds that the templates
    # no longer render are deleted.
    child_kinds: ClassVar[tuple[str, ...]] = ("ConfigMap", "Service", "PodDisruptionBudget", "StatefulSet")

    def __init__(self, rollout_hooks: Mapping[str, InProcess] | None = None) -> None:
        # In-process rollout hooks by name (`framework.rollout.hooks`), which the service's
        # templates name in their StatefulsetRollouts' strategy.
        self.rollout_hooks: Mapping[str, InProcess] = MappingProxyType(dict(rollout_hooks or {}))

    def offered_versions(self) -> ServiceCatalog:
        """The versions the service offers unless a platform team names its own: `catalog.yaml`
        beside the plugin's module (its default and, for each version, the image)."""
        module = sys.modules[type(self).__module__].__file__ or ""
        path = Path(module).parent / "catalog.yaml"
        return ServiceCatalog.model_validate(yaml.safe_load(path.read_text()))

    # The kinds of action `plan` decides and `perform` carries out: a closed set, checked on
    # every pass (any other is a bug: `UnknownAction`).
    actions: ClassVar[tuple[type, ...]] = ()
    # The status fields the plugin owns (beside the framework's `InstanceStatus`): the CRD's schema.
    status_model: ClassVar[type[BaseModel] | None] = None
    # Status fields whose change is a decision of who serves (a new primary): a pass that changes
    # them writes its status only over the one it read (a resourceVersion precondition), so of
    # two operators acting on the same state only one decision lands; the other plans again.
    decisive_status: ClassVar[tuple[str, ...]] = ()
    # Optional capabilities: each one a plugin has, it implements entirely; None: it has not.
    tls: Tls | None = None
    bindings: Bindings | None = None
    backups: Backups | None = None
    rotation: Rotation | None = None
    # Spec fields that ask for something once (a switchover): a spec restored from a backup, or
    # copied into a new instance, drops them (`one_shot_fields()` adds the rotation's request).
    one_shot: ClassVar[tuple[str, ...]] = ()

    def one_shot_fields(self) -> tuple[str, ...]:
        return self.one_shot + ((credentials.SPEC_FIELD,) if self.rotation else ())

    def references(self, spec: dict[str, Any]) -> dict[str, Reference]:
        """The objects the spec names that planning needs (`Observed.references`), by key."""
        return {}

    def in_service_kinds(self) -> list[Any]:
        """The plugin's kinds of objects inside an instance (`framework.object_controller.ObjectKind`):
        users, databases, vhosts. Their controller is the framework's."""
        return []

    @abstractmethod
    def plan(self, spec: BaseModel, version: ResolvedVersion, observed: Observed, now: float) -> ServicePlan:
        """Pure: the pass's one decision from what was observed (`now`: wall-clock seconds):
        what to do inside the service (labels for individual pods such as the primary's role,
        actions such as a promotion, status fields, Events, when to ask the servers again), the
        templates' variables, the service's reading (from the status with what it decided merged
        in: `decided`), or why the spec is refused."""

    async def inspect(
        self, client: AsyncClient, observed: Observed, previous: Inspection | None
    ) -> Inspection | None:
        """Asks the servers how they are (the framework calls it in the background, never
        inside a reconcile, when `plan` asked for it). None: nothing to ask."""
        return None

    async def perform(self, client: AsyncClient, observed: Observed, action: Any) -> None:
        """Carries out one of the actions `plan` decided (one of `actions`)."""
        raise UnknownAction(self, action)

    def status_properties(self) -> dict[str, Any]:
        """OpenAPI properties of the plugin's own status fields."""
        return crd.status_properties(self.status_model)

    def printer_columns(self) -> list[dict[str, Any]]:
        return [
            {"name": "Ready", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].status'},
            {"name": "Instances", "type": "string", "jsonPath": ".status.instances"},
            {"name": "Version", "type": "string", "jsonPath": ".status.version"},
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ]

    def labels(self, name: str) -> dict[str, str]:
        return {
            LABEL_NAME: self.service,
            LABEL_INSTANCE: name,
            LABEL_MANAGED_BY: MANAGER,
            LABEL_PART_OF: "statefleet",
        }

    @classmethod
    def resource(cls) -> Any:
        """The lightkube class of the service's resource (and `.Status` of its status)."""
        return create_namespaced_resource(GROUP, VERSION, cls.kind, cls.plural)

    def crd(self) -> dict[str, Any]:
        status = {
            "type": "object",
            "properties": {
                **crd.status_properties(InstanceStatus),
                "conditions": conditions.SCHEMA,
                **(crd.status_properties(RotationStatus) if self.rotation else {}),
                **self.status_properties(),
            },
            "x-kubernetes-preserve-unknown-fields": True,  # kopf keeps its progress here
        }
        return crd.build_crd(
            self.kind, self.plural, self.spec_model, status, self.short_names, self.printer_columns()
        )
