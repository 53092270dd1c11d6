"""Objects that live inside a service instance (a user, a database, a virtual host) and the
bindings that hand them to applications: one controller for all of their kinds.

Kubernetes and a service share no transactions, so every pass is idempotent and the
controller retries until the two agree. A pass returns an `Outcome` (ready or why not, extra
status fields, the objects whose changes call for another pass, when to look again anyway);
an exception is shown in the Ready condition and retried with backoff. Kinds that
`finalizes` carry a finalizer: deleting one runs `finalize` until the service agrees (or its
instance is gone), and only then lets the object go.
"""

from __future__ import annotations

import logging
import secrets
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

import kopf
from lightkube import AsyncClient
from lightkube.core.exceptions import ApiError
from lightkube.generic_resource import create_namespaced_resource
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Secret
from lightkube.types import PatchType
from pydantic import BaseModel, Field, ValidationError

from framework.kube import conditions, crd
from framework.kube.api import EventNote, about, get_or_none, post_event
from framework.kube.conditions import Condition
from framework.kube.meta import GROUP, LABEL_MANAGED_BY, LABEL_PART_OF, MANAGER, VERSION, owner_reference
from framework.kube.model import StatusModel, describe_validation_error
from framework.kube.queue import WorkQueue
from framework.kube.runtime import StatusWriter, resync_forever
from framework.kube.secrets import decoded

log = logging.getLogger("statefleet")

FINALIZER = "statefleet.dev/in-service"
# Seconds: what no event announces (a role dropped by hand, a password Secret edited). Secrets
# are not watched: kopf filters labels on its side, so a watch would stream every Secret.
RESYNC = 60.0


@dataclass(frozen=True)
class Ref:
    """An object in the same namespace whose changes call for a pass."""

    kind: str
    name: str


@dataclass(frozen=True)
class Outcome:
    ready: bool
    reason: str
    message: str
    fields: dict[str, Any] = field(default_factory=dict)  # extra status fields
    depends_on: frozenset[Ref] = frozenset()
    retry_in: float | None = None  # seconds; None: the next event or resync
    events: tuple[EventNote, ...] = ()


class ObjectKind(ABC):
    """One kind of object inside a service (a plugin's user kind) or around it (bindings)."""

    kind: ClassVar[str]
    plural: ClassVar[str]
    short_names: ClassVar[tuple[str, ...]] = ()
    spec_model: ClassVar[type[BaseModel]]
    finalizes: ClassVar[bool] = True  # False: nothing inside a service to undo on deletion
    deleted_by_operator: ClassVar[bool] = False  # the operator deletes some itself (its RBAC says so)
    # Its status fields besides conditions and observedGeneration: the CRD's status schema.
    status_model: ClassVar[type[BaseModel] | None] = None

    @abstractmethod
    async def reconcile(self, client: AsyncClient, body: dict[str, Any], spec: Any) -> Outcome:
        """One pass: what the object wants made, made; where it stands."""

    async def finalize(self, client: AsyncClient, body: dict[str, Any], spec: Any) -> Outcome:
        """Undoes what `reconcile` made; `ready` True lets the object go."""
        return Outcome(True, "Finalized", "nothing to undo")

    def status_properties(self) -> dict[str, Any]:
        return crd.status_properties(self.status_model)

    def printer_columns(self) -> list[dict[str, Any]]:
        return [
            {"name": "Ready", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].status'},
            {
                "name": "Reason",
                "type": "string",
                "jsonPath": '.status.conditions[?(@.type=="Ready")].reason',
            },
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ]

    def crd(self) -> dict[str, Any]:
        status = {
            "type": "object",
            "properties": {
                "observedGeneration": {"type": "integer", "format": "int64"},
                "conditions": conditions.SCHEMA,
                **self.status_properties(),
            },
        }
        return crd.build_crd(
            self.kind, self.plural, self.spec_model, status, self.short_names, self.printer_columns()
        )

    @classmethod
    def resource(cls) -> Any:
        return create_namespaced_resource(GROUP, VERSION, cls.kind, cls.plural)


Key = tuple[str, str, str]  # kind, namespace, name


def credentials_secret(kind: str, body: dict[str, Any], name: str, username: str) -> Secret:
    """A user's Secret the operator generates (`username`, a random `password`), owned by the
    user resource `body` of `kind`."""
    meta = body["metadata"]
    return Secret(
        metadata=ObjectMeta(
            name=name,
            namespace=meta["namespace"],
            labels={LABEL_MANAGED_BY: MANAGER, LABEL_PART_OF: "statefleet"},
            ownerReferences=[owner_reference(kind, body)],
        ),
        stringData={"username": username, "password": secrets.token_urlsafe(24)},
    )


@dataclass(frozen=True)
class UserPassword:
    secret: str  # the Secret's name
    password: str
    version: str  # the Secret's uid/resourceVersion: a new one means the password may have changed


def password_secret_field(of_what: str = "user") -> Any:
    """`spec.passwordSecret` of a user resource (read by `user_password`)."""
    return Field(
        default=None,
        description=f"A Secret whose `password` entry is the {of_what}'s password; when empty the operator "
        "generates <name>-credentials. Edit the Secret to change the password.",
    )


class CredentialsStatus(StatusModel):
    """The status of a user resource's password (what `user_password` read, last applied)."""

    secret: str | None = Field(default=None, description="the Secret with the password")
    password_version: str | None = Field(default=None, description="the Secret's version last applied")


async def user_password(
    client: AsyncClient,
    kind: str,
    body: dict[str, Any],
    password_secret: str | None,
    username: str,
    depends: frozenset[Ref],
) -> UserPassword | Outcome:
    """The password of user resource `body` of `kind`: from the Secret the user named
    (`spec.passwordSecret`), else from `<name>-credentials`, generated once; or the Outcome that
    says why there is none."""
    meta = body["metadata"]
    namespace = meta["namespace"]
    name = password_secret or f"{meta['name']}-credentials"
    secret = await get_or_none(client, Secret, name, namespace)
    if secret is None and password_secret:
        return Outcome(
            False,
            "SecretNotFound",
            f"spec.passwordSecret: Secret {name} does not exist in namespace {namespace}",
            depends_on=depends,
            retry_in=10,  # Secrets are not watched
        )
    if secret is None:
        secret = (await client.create(credentials_secret(kind, body, name, username))).to_dict()
    password = decoded(secret).get("password", "")
    if not password:
        return Outcome(
            False,
            "SecretInvalid",
            f"spec.passwordSecret: Secret {name} has no `password` entry, or an empty one",
            depends_on=depends,
            retry_in=10,
        )
    return UserPassword(
        name, password, f"{secret['metadata']['uid']}/{secret['metadata']['resourceVersion']}"
    )


def plan_status(body: dict[str, Any], outcome: Outcome) -> dict[str, Any]:
    """The status after a pass: the outcome's fields (None removes one), Ready, the generation
    it saw."""
    current = {k: v for k, v in (body.get("status") or {}).items() if k != "kopf"}
    generation = body["metadata"].get("generation", 0)
    ready = Condition(conditions.READY, outcome.ready, outcome.reason, outcome.message)
    kept = {k: v for k, v in {**current, **outcome.fields}.items() if v is not None}
    return {
        **kept,
        "observedGeneration": generation,
        "conditions": conditions.merge_conditions(current.get("conditions"), [ready], generation),
    }


def transition_events(body: dict[str, Any], outcome: Outcome) -> list[EventNote]:
    """An Event when Ready changes or its reason does: one per transition, never repeated."""
    previous = conditions.find((body.get("status") or {}).get("conditions"), conditions.READY)
    same = previous and previous.get("status") == ("True" if outcome.ready else "False")
    if same and previous.get("reason") == outcome.reason:
        return []
    return [EventNote("Normal" if outcome.ready else "Warning", outcome.reason, outcome.message)]


class ObjectController:
    def __init__(self, client: AsyncClient, kinds: list[ObjectKind], watched: dict[str, Any]) -> None:
        """`watched`: kind -> lightkube resource class of the kinds `Ref`s may name."""
        self.client = client
        self.kinds = {k.kind: k for k in kinds}
        self.resources = {k.kind: k.resource() for k in kinds}
        self.watched = watched
        self.queue = WorkQueue(self._pass, self._describe, workers=8)
        self._depends: dict[Key, frozenset[Ref]] = {}
        self.status = StatusWriter[Key](client)

    def _describe(self, key: Key) -> dict[str, Any]:
        return about(key[0], key[1], key[2])

    def register(self) -> None:
        for kind in self.kinds.values():

            async def changed(body: dict[str, Any], kind: str = kind.kind, **_: Any) -> None:
                meta = body["metadata"]
                key = (kind, meta["namespace"], meta["name"])
                # Its own status write may be news to others (a binding waits for its user).
                await self._dependency_changed(kind, meta["namespace"], meta["name"])
                if self.status.is_echo(key, body):
                    return  # the echo of our own status write: nothing new for this object
                await self.queue.process(key)

            kopf.on.event(GROUP, VERSION, kind.plural, id=f"object-{kind.plural}")(changed)
        for kind, resource in self.watched.items():
            if kind in self.kinds:
                continue

            async def other_changed(body: dict[str, Any], kind: str = kind, **_: Any) -> None:
                await self._dependency_changed(kind, body["metadata"]["namespace"], body["metadata"]["name"])

            info = resource._api_info
            api, plural = info.resource, info.plural
            kopf.on.event(api.group, api.version, plural, id=f"object-dependency-{plural}")(other_changed)

    async def _dependency_changed(self, kind: str, namespace: str, name: str) -> None:
        ref = Ref(kind, name)
        for key, refs in list(self._depends.items()):
            if key[1] == namespace and ref in refs:
                self.queue.soon(key)

    async def resync_forever(self, namespaces: list[str]) -> None:
        def again(kind: str, namespace: str, name: str) -> None:
            self.queue.soon((kind, namespace, name))

        await resync_forever(self.client, self.resources, namespaces, RESYNC, again)

    async def _pass(self, key: Key, thorough: bool) -> float | None:
        kind_name, namespace, name = key
        kind, resource = self.kinds[kind_name], self.resources[kind_name]
        try:
            body = (await self.client.get(resource, name, namespace=namespace)).to_dict()
        except ApiError as error:
            if error.status.code == 404:
                self._depends.pop(key, None)
                self.status.forget(key)
                self.queue.forget(key)
                return None
            raise
        meta = body["metadata"]
        finalizers = list(meta.get("finalizers") or [])
        try:
            spec = kind.spec_model.model_validate(body.get("spec") or {})
        except ValidationError as error:
            if meta.get("deletionTimestamp") and FINALIZER in finalizers:
                await self._remove_finalizer(key, finalizers)  # nothing valid was ever made of it
                return None
            await self._record(key, body, Outcome(False, "InvalidSpec", describe_validation_error(error)))
            return None
        try:
            if meta.get("deletionTimestamp"):
                if FINALIZER not in finalizers:
                    return None
                outcome = await kind.finalize(self.client, body, spec)
                if outcome.ready:
                    log.info("%s", outcome.message, extra=self._describe(key))
                    for note in outcome.events:  # what the deletion did, said before it goes
                        await post_event(self.client, kind_name, body, note)
                    await self._remove_finalizer(key, finalizers)
                    return None
            else:
                if kind.finalizes and FINALIZER not in finalizers:
                    # A JSON patch: a finalizer another controller adds meanwhile stays.
                    add = (
                        {"op": "add", "path": "/metadata/finalizers/-", "value": FINALIZER}
                        if finalizers
                        else {"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]}
                    )
                    await self.client.patch(
                        resource, name, [add], namespace=namespace, patch_type=PatchType.JSON
                    )
                outcome = await kind.reconcile(self.client, body, spec)
        except Exception as error:
            await self._record(key, body, Outcome(False, "Error", f"{type(error).__name__}: {error}"))
            raise
        self._depends[key] = outcome.depends_on
        await self._record(key, body, outcome)
        return outcome.retry_in

    async def _remove_finalizer(self, key: Key, finalizers: list[str]) -> None:
        kind, namespace, name = key
        # A JSON patch with a test: never drop a finalizer another controller added meanwhile.
        index = finalizers.index(FINALIZER)
        await self.client.patch(
            self.resources[kind],
            name,
            [
                {"op": "test", "path": f"/metadata/finalizers/{index}", "value": FINALIZER},
                {"op": "remove", "path": f"/metadata/finalizers/{index}"},
            ],
            namespace=namespace,
            patch_type=PatchType.JSON,
        )
        self._depends.pop(key, None)

    async def _record(self, key: Key, body: dict[str, Any], outcome: Outcome) -> None:
        kind = key[0]
        desired = plan_status(body, outcome)
        current = body.get("status") or {}
        await self.status.write(key, self.resources[kind], body, current, desired, gone_ok=True)
        for note in [*transition_events(body, outcome), *outcome.events]:
            await post_event(self.client, kind, body, note)
