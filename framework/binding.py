"""`ServiceBinding`: an application's own credentials for any service, in a Secret laid out as
servicebinding.io expects (https://servicebinding.io/spec/core/1.1.0/).

Two levels: the binding creates the service's user resource (e.g. `<Kind>User`), whose own
controller makes the user inside the service; once that user is ready, the binding writes the
Secret from the plugin's `bindings.secret_data`. Both are owned by the binding, so deleting it removes
them, and the user resource's finalizer removes the user from the service. The binding's
status carries `binding.name`, the Provisioned Service duck type: a servicebinding.io
implementation can project the Secret into workloads. `spec.workload.selector` names the
application's pods (servicebinding.io's workload, by the labels of its pods): with the operator's
NetworkPolicies on, the instance's policy lets them in (`framework.network_policy`).
"""

from __future__ import annotations

import base64
from typing import Any

from lightkube import AsyncClient, codecs
from lightkube.core.exceptions import ApiError
from lightkube.resources.core_v1 import Secret
from pydantic import Field

from framework.kube import conditions
from framework.kube.api import get_or_none
from framework.kube.meta import API_VERSION, LABEL_MANAGED_BY, LABEL_PART_OF, MANAGER, owner_reference
from framework.kube.model import ApiModel, StatusModel
from framework.kube.secrets import decoded
from framework.network_policy import Workload
from framework.object_controller import ObjectKind, Outcome, Ref
from framework.plugin import TLS_SERVER, ServicePlugin

BINDING_LABEL = "statefleet.dev/binding"
NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


class ServiceRef(ApiModel):
    kind: str = Field(min_length=1, description="The kind of the service instance to bind to.")
    name: str = Field(min_length=1, description="The instance, in the binding's namespace.")


class ServiceBindingSpec(ApiModel):
    service: ServiceRef
    secret_name: str | None = Field(
        default=None,
        max_length=253,
        pattern=NAME_PATTERN,
        description="The Secret the application mounts; the binding's name when empty.",
    )
    workload: Workload | None = Field(
        default=None,
        description="The application bound, by its pods' labels. With the operator's NetworkPolicies "
        "on, the instance lets these pods of the binding's namespace in (besides the operator's, its "
        "own and the operator's Jobs); without a workload, the binding lets no pod in.",
    )


def owned_by(body: dict[str, Any] | None, uid: str) -> bool:
    return any(ref.get("uid") == uid for ref in (body or {}).get("metadata", {}).get("ownerReferences") or [])


def build_user(binding: dict[str, Any], kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    meta = binding["metadata"]
    return {
        "apiVersion": API_VERSION,
        "kind": kind,
        "metadata": {
            "name": meta["name"],
            "namespace": meta["namespace"],
            "labels": {LABEL_MANAGED_BY: MANAGER, LABEL_PART_OF: "statefleet", BINDING_LABEL: meta["name"]},
            "ownerReferences": [owner_reference("ServiceBinding", binding)],
        },
        "spec": spec,
    }


def build_secret(binding: dict[str, Any], name: str, data: dict[str, str]) -> dict[str, Any]:
    meta = binding["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": f"servicebinding.io/{data['type']}",
        "metadata": {
            "name": name,
            "namespace": meta["namespace"],
            "labels": {LABEL_MANAGED_BY: MANAGER, LABEL_PART_OF: "statefleet", BINDING_LABEL: meta["name"]},
            "ownerReferences": [owner_reference("ServiceBinding", binding)],
        },
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in sorted(data.items())},
    }


class ProvisionedSecret(StatusModel):
    name: str | None = None


class ServiceBindingStatus(StatusModel):
    binding: ProvisionedSecret | None = Field(
        default=None, description="servicebinding.io Provisioned Service: the Secret to project"
    )
    user: str | None = Field(default=None, description="the user resource this binding created")


class ServiceBindingKind(ObjectKind):
    kind = "ServiceBinding"
    plural = "servicebindings"
    spec_model = ServiceBindingSpec
    status_model = ServiceBindingStatus
    finalizes = False  # what it made is owned by it: garbage collection removes it

    def __init__(self, plugins: list[ServicePlugin]) -> None:
        self.plugins = {p.kind: p for p in plugins}

    async def reconcile(self, client: AsyncClient, body: dict[str, Any], spec: ServiceBindingSpec) -> Outcome:
        meta = body["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        secret_name = spec.secret_name or name
        plugin = self.plugins.get(spec.service.kind)
        bindable = sorted(p.kind for p in self.plugins.values() if p.bindings)
        if plugin is None or plugin.bindings is None:
            return Outcome(
                False,
                "UnknownService",
                f"spec.service.kind: {spec.service.kind} cannot be bound; one of {', '.join(bindable)}",
            )
        service_ref = Ref(plugin.kind, spec.service.name)
        service = await get_or_none(client, plugin.resource(), spec.service.name, namespace)
        if service is None:
            return Outcome(
                False,
                "ServiceNotFound",
                f"spec.service.name: {plugin.kind} {spec.service.name} does not exist in namespace "
                f"{namespace}; the binding completes once it does",
                depends_on=frozenset({service_ref}),
            )
        bindings = plugin.bindings
        user_kind = next(k for k in plugin.in_service_kinds() if k.kind == bindings.user_kind)
        user_ref = Ref(user_kind.kind, name)
        waiting = frozenset({service_ref, user_ref})
        existing = await get_or_none(client, user_kind.resource(), name, namespace)
        if existing is not None and not owned_by(existing, meta["uid"]):
            return Outcome(
                False,
                "Conflict",
                f"{user_kind.kind} {name} exists and does not belong to this binding: rename one of them",
                depends_on=waiting,
            )
        desired = build_user(body, user_kind.kind, bindings.user_spec(name, spec.service.name))
        user = (await client.apply(codecs.from_dict(desired), field_manager=MANAGER, force=True)).to_dict()
        ready = conditions.find((user.get("status") or {}).get("conditions"), conditions.READY)
        if not ready or ready.get("status") != "True":
            why = ready.get("message") if ready else "not reconciled yet"
            return Outcome(False, "UserNotReady", f"{user_kind.kind} {name}: {why}", depends_on=waiting)
        credentials_name = user["status"].get("secret", "")
        credentials = await get_or_none(client, Secret, credentials_name, namespace)
        depends = frozenset({service_ref, user_ref})
        if credentials is None:
            return Outcome(
                False,
                "CredentialsMissing",
                f"Secret {credentials_name} of {user_kind.kind} {name} is missing",
                depends_on=depends,
                retry_in=10,
            )
        current = await get_or_none(client, Secret, secret_name, namespace)
        if current is not None and not owned_by(current, meta["uid"]):
            return Outcome(
                False,
                "Conflict",
                f"spec.secretName: Secret {secret_name} exists and does not belong to this binding",
                depends_on=depends,
            )
        ca = None
        if plugin.tls is not None:
            tls_name = f"{spec.service.name}-{TLS_SERVER}"
            tls = await get_or_none(client, Secret, tls_name, namespace)
            if tls is None:
                return Outcome(
                    False,
                    "CertificateMissing",
                    f"Secret {tls_name} of {plugin.kind} {spec.service.name} is missing",
                    depends_on=depends,
                    retry_in=10,
                )
            ca = decoded(tls).get("ca.crt")
        data = bindings.secret_data(service, user, decoded(credentials), ca)
        await client.apply(
            codecs.from_dict(build_secret(body, secret_name, data)), field_manager=MANAGER, force=True
        )
        previous = ((body.get("status") or {}).get("binding") or {}).get("name")
        if previous and previous != secret_name:
            await self._delete_own_secret(client, namespace, previous, meta["uid"])
        return Outcome(
            True,
            "Bound",
            f"Secret {secret_name} holds the credentials of {data.get('username', name)} for "
            f"{plugin.kind} {spec.service.name}",
            fields={"binding": {"name": secret_name}, "user": name},
            depends_on=depends,
        )

    async def _delete_own_secret(self, client: AsyncClient, namespace: str, name: str, uid: str) -> None:
        """The Secret of an earlier `secretName`: gone, so no stale copy of the credentials stays."""
        if owned_by(await get_or_none(client, Secret, name, namespace), uid):
            try:
                await client.delete(Secret, name, namespace=namespace)
            except ApiError as error:
                if error.status.code != 404:
                    raise

    def printer_columns(self) -> list[dict[str, Any]]:
        columns = super().printer_columns()
        columns[1:1] = [
            {"name": "Service", "type": "string", "jsonPath": ".spec.service.name"},
            {"name": "Secret", "type": "string", "jsonPath": ".status.binding.name"},
        ]
        return columns
