"""The reconcile loop every service shares: observe, plan (pure), apply, write status.

`plan` is a pure function of what was observed: the tests reach every decision through it.
`reconcile` does the I/O: it reads the children, creates missing generated Secrets, applies
the children with server-side apply under one field manager, deletes children the
templates no longer render, labels pods, writes status only when it changed, and posts an
Event only on a transition. Reconciling twice changes nothing.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from framework import credentials
from framework.catalog import Catalog, ResolvedVersion, VersionRefused, resolve
from framework.certificates import (
    CERT_MANAGER,
    build_cert_manager_resources,
    certificate_not_ready,
    choose_tls_provider,
    plan_tls,
    read_issued,
)
from framework.kube import conditions
from framework.kube.api import EventNote
from framework.kube.conditions import Condition
from framework.kube.meta import LABEL_INSTANCE, LABEL_NAME, content_hash, decorate, owner_reference
from framework.kube.model import describe_validation_error
from framework.kube.pod_security import restricted_workload
from framework.kube.pods import has_run
from framework.kube.secrets import decoded
from framework.kube.status import without_kopf
from framework.kube.times import format_time
from framework.network_policy import NetworkPolicies, build_network_policy
from framework.plugin import (
    INVALID_SPEC,
    RENDER_FAILED,
    TLS_CA,
    TLS_SERVER,
    Observed,
    Operations,
    Rotation,
    ServicePlugin,
    ServiceStatus,
    UnknownAction,
    decided,
)
from framework.render import RenderFailed, render_children


@dataclass
class Plan:
    status: dict[str, Any]
    children: list[dict[str, Any]] = field(default_factory=list)
    secrets_to_create: list[dict[str, Any]] = field(default_factory=list)
    secrets_to_apply: list[dict[str, Any]] = field(default_factory=list)  # replaced when they differ
    events: list[EventNote] = field(default_factory=list)
    apply: bool = True  # False: leave the children exactly as they are (pods are still labelled)
    operations: Operations = field(default_factory=Operations)  # inside the service: labels, actions
    tls_resources: list[dict[str, Any]] = field(default_factory=list)  # cert-manager's objects


def _invalid(observed: Observed, reason: str, message: str, operations: Operations | None = None) -> Plan:
    """Nothing is applied; the service is still operated (`operations`, when the spec could be
    read): a change refused must not stop a failover."""
    operations = operations or Operations()
    merged = {**observed.status, **operations.status}
    status = {k: v for k, v in merged.items() if v is not None}
    status["observedGeneration"] = observed.generation
    status["conditions"] = conditions.merge_conditions(
        observed.status.get("conditions"),
        [
            Condition(conditions.READY, False, reason, message),
            Condition(conditions.PROGRESSING, False, reason, message),
        ],
        observed.generation,
    )
    events = []
    previous = conditions.find(observed.status.get("conditions"), conditions.READY)
    if not previous or previous.get("reason") != reason or previous.get("message") != message:
        events.append(EventNote("Warning", reason, message))
    return Plan(
        status=without_kopf(status), events=events + operations.events, apply=False, operations=operations
    )


def children_hash(children: list[dict[str, Any]]) -> str:
    return content_hash(children)


def plan(
    plugin: ServicePlugin,
    observed: Observed,
    catalog: Catalog,
    uid: str,
    force_apply: bool = False,
    now: float = 0.0,
    tools_image: str = "",
    network_policies: NetworkPolicies | None = None,
) -> Plan:
    """What to do about one resource. Children are applied when what the templates render
    changed since the last apply (`status.childrenHash`), when the StatefulSet is missing, or
    when `force_apply` (the periodic resync, which also repairs hand edits). With
    `network_policies`, the instance's NetworkPolicy is the first of its children (its pods are
    fenced before they start); without, none is rendered, so the apply prunes one made before."""
    try:
        spec = plugin.spec_model.model_validate(observed.spec)
    except ValidationError as error:
        return _invalid(observed, INVALID_SPEC, describe_validation_error(error))
    try:
        version = resolve(catalog, plugin.service, getattr(spec, "version", None))
    except VersionRefused as error:
        return _invalid(observed, INVALID_SPEC, str(error))
    service = plugin.plan(spec, version, observed, now)
    operations = service.operations
    for action in operations.actions:
        if not isinstance(action, plugin.actions):
            raise UnknownAction(plugin, action)
    if plugin.rotation is not None:
        rotate(plugin, plugin.rotation, observed, operations, now)
    if service.refusal:
        return _invalid(observed, service.refusal.reason, service.refusal.message, operations)
    assert service.reading is not None, f"{plugin.kind}'s plan has neither a reading nor a refusal"

    labels = plugin.labels(observed.name)
    owner = owner_reference(plugin.kind, {"metadata": {"name": observed.name, "uid": uid}})
    secrets_to_create = [
        decorate(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": secret.name(observed.name)},
                "type": "Opaque",
                "stringData": secret.initial_data(),
            },
            labels,
            owner,
            observed.namespace,
        )
        for secret in plugin.generated_secrets
        if secret.suffix not in observed.secrets
    ]
    tls = plan_instance_tls(plugin, observed, labels, owner, now)
    # The image an instance was made with stays its own: an operator upgrade must not roll
    # every instance whose init containers run our code.
    tools_image = observed.status.get("toolsImage") or tools_image
    context = {
        "name": observed.name,
        "namespace": observed.namespace,
        "spec": spec,
        "image": version.image,
        "version": version.version,
        "labels": labels,
        "selector": {LABEL_NAME: plugin.service, LABEL_INSTANCE: observed.name},  # an instance's pods
        "tools_image": tools_image,  # Statefleet's own image, for init containers that run our code
        # When the server certificate in use expires: changes with each certificate issued, so a
        # template whose servers read their certificate only at start restarts them with it.
        "certificate_not_after": (tls.status or observed.status.get("tls") or {}).get("notAfter"),
        **service.context,
    }
    try:
        rendered_children = render_children(plugin.service, context)
    except RenderFailed as error:  # never let it stop the probes, labels and failover
        return _invalid(
            observed, RENDER_FAILED, f"the templates could not render this spec: {error}", operations
        )
    if network_policies is not None:
        policy = build_network_policy(
            network_policies, plugin.service, plugin.kind, observed.name, observed.bindings
        )
        rendered_children = [policy, *rendered_children]
    children = [
        decorate(restricted_workload(child), labels, owner, observed.namespace) for child in rendered_children
    ]

    observed = decided(observed, operations)  # what the plugin decided (a new primary) is true now
    reading = service.reading
    rendered = children_hash(children)
    status = _status(observed, version, reading)
    status["childrenHash"] = rendered
    if tools_image:
        status["toolsImage"] = tools_image
    if tls.status:
        status["tls"] = tls.status
    unchanged = observed.status.get("childrenHash") == rendered and observed.statefulset is not None
    return Plan(
        status=status,
        apply=force_apply or not unchanged,
        children=children,
        secrets_to_create=secrets_to_create,
        secrets_to_apply=tls.secrets,
        events=_transition_events(observed, version, reading) + operations.events + tls.events,
        operations=operations,
        tls_resources=tls.resources,
    )


def rotate(
    plugin: ServicePlugin, rotation: Rotation, observed: Observed, operations: Operations, now: float
) -> None:
    """The credentials rotation's step (`framework.credentials`), added to the plugin's operations:
    its actions after the plugin's own, in order (stage, the plugin's apply, swap)."""
    suffixes = tuple(secret.suffix for secret in rotation.secrets)
    step = credentials.plan_rotation(
        observed.spec.get(credentials.SPEC_FIELD),
        observed.status.get(credentials.STATUS_FIELD),
        credentials.staged_in(observed.secrets, suffixes),
        format_time(now),
        waiting=rotation.waiting(observed),
        fresh=not observed.status.get("childrenHash"),
    )
    names = tuple(secret.name(observed.name) for secret in rotation.secrets)
    if step.stage:
        operations.actions.append(credentials.StageCredentials(names))
    if step.apply:
        action = rotation.apply(observed)
        if not isinstance(action, plugin.actions):
            raise UnknownAction(plugin, action)
        operations.actions.append(action)
    if step.swap:
        operations.actions.append(credentials.SwapCredentials(names))
    if step.status is not None:
        operations.status[credentials.STATUS_FIELD] = step.status
    operations.events.extend(step.events)


@dataclass
class InstanceTls:
    secrets: list[dict[str, Any]] = field(default_factory=list)
    status: dict[str, Any] = field(default_factory=dict)
    events: list[EventNote] = field(default_factory=list)
    resources: list[dict[str, Any]] = field(default_factory=list)  # cert-manager's, to apply


def plan_instance_tls(
    plugin: ServicePlugin, observed: Observed, labels: dict[str, str], owner: dict[str, Any], now: float
) -> InstanceTls:
    """The CA and server certificate Secrets to (re)write, when they were read and need it."""
    if plugin.tls is None:
        return InstanceTls()
    hosts = plugin.tls.hosts(observed.name, observed.namespace)
    ca, server = observed.secrets.get(TLS_CA), observed.secrets.get(TLS_SERVER)
    tls_status = observed.status.get("tls") or {}
    if choose_tls_provider(tls_status, server, observed.cert_manager) == CERT_MANAGER:
        return plan_cert_manager_tls(observed, hosts, labels, owner, now)
    if ca == {} and server == {}:  # not read on this pass
        return InstanceTls()
    result = InstanceTls()
    try:
        planned = plan_tls(
            (decoded(ca) if ca else None),
            (decoded(server) if server else None),
            hosts,
            datetime.fromtimestamp(now, UTC),
        )
    except Exception as error:  # never let certificates stop the rest (a failover) of the pass
        message = f"the certificates could not be checked or issued: {type(error).__name__}: {error}"
        result.events.append(EventNote("Warning", "CertificateFailed", message))
        return result
    for suffix, data, type_ in (
        (TLS_CA, planned.ca, "Opaque"),
        (TLS_SERVER, planned.server, "kubernetes.io/tls"),
    ):
        if data is None:
            continue
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": f"{observed.name}-{suffix}"},
            "type": type_,
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
        }
        result.secrets.append(decorate(secret, labels, owner, observed.namespace))
    not_after = format_time(planned.not_after) if planned.not_after else None
    result.status = {
        **(observed.status.get("tls") or {}),
        "notAfter": not_after,
        "secret": f"{observed.name}-tls",
        "provider": "operator",
    }
    if planned.server:
        if servers_read_certificates(observed):
            result.status["issuedAtSeconds"] = now
        result.events.append(
            EventNote(
                "Normal",
                "CertificateIssued",
                f"{planned.reason}: a server certificate valid until {not_after}",
            )
        )
    return result


def servers_read_certificates(observed: Observed) -> bool:
    """Whether a server of the instance has read its certificate files already: a new
    certificate then reaches it only by a reload (`status.tls.issuedAtSeconds` schedules them).
    Servers that have not started yet (the instance's first certificate) read the new one."""
    return any(has_run(pod) for pod in observed.pods)


def plan_cert_manager_tls(
    observed: Observed, hosts: list[str], labels: dict[str, str], owner: dict[str, Any], now: float
) -> InstanceTls:
    """cert-manager issues and renews the Secrets; the operator keeps its objects applied, makes
    each Secret owned by its Certificate (which the instance owns: they go with it, and a Secret
    the garbage collector deleted first is never written again by a Certificate still there),
    and notes each new certificate so the servers reload it (`status.tls.issuedAtSeconds`)."""
    name, namespace = observed.name, observed.namespace
    resources = [decorate(r, labels, owner, namespace) for r in build_cert_manager_resources(name, hosts)]
    digest = children_hash(resources)
    previous = observed.status.get("tls") or {}
    status = {**previous, "provider": CERT_MANAGER, "secret": f"{name}-tls", "resourcesHash": digest}
    result = InstanceTls(status=status)
    server = observed.secrets.get(TLS_SERVER)
    read = server != {}  # {}: not read on this pass (steady state between resyncs)
    if previous.get("resourcesHash") != digest or (read and observed.certificate is None):
        result.resources = resources
    if not read:
        return result
    for suffix, certificate in ((TLS_CA, observed.ca_certificate), (TLS_SERVER, observed.certificate)):
        secret = observed.secrets.get(suffix)
        uid = ((certificate or {}).get("metadata") or {}).get("uid")
        owners = ((secret or {}).get("metadata") or {}).get("ownerReferences") or []
        if secret and uid and [o.get("uid") for o in owners] != [uid]:
            adopted = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": f"{name}-{suffix}"}}
            by_certificate = {
                "apiVersion": "cert-manager.io/v1",
                "kind": "Certificate",
                "name": f"{name}-{suffix}",
                "uid": uid,
            }
            result.secrets.append(decorate(adopted, labels, by_certificate, namespace))
    not_after = read_issued(decoded(server) if server else None)
    if not_after is None:
        waiting = f"cert-manager has not issued {name}-tls: {certificate_not_ready(observed.certificate)}"
        if previous.get("waiting") != waiting:
            result.events.append(EventNote("Warning", "CertificatePending", waiting))
        status.update(waiting=waiting, notAfter=None)
        return result
    stamp = format_time(not_after)
    status.pop("waiting", None)
    if previous.get("notAfter") != stamp:
        status["notAfter"] = stamp
        if servers_read_certificates(observed):
            status["issuedAtSeconds"] = now
        result.events.append(
            EventNote(
                "Normal", "CertificateIssued", f"cert-manager issued a server certificate valid until {stamp}"
            )
        )
    return result


PODS_NOT_CREATED = "PodsNotCreated"


def degraded(observed: Observed, reading: ServiceStatus) -> Condition:
    """Degraded: pods the API refuses to create (admission, a quota) first, since nothing the
    operator does can start them; then fewer healthy instances than asked for."""
    if observed.pods_refused:
        message = f"the instance's pods cannot be created: {observed.pods_refused}"
        return Condition(conditions.DEGRADED, True, PODS_NOT_CREATED, message)
    if reading.degraded:
        return Condition(conditions.DEGRADED, True, "InstancesNotReady", reading.message)
    return Condition(conditions.DEGRADED, False, "AsExpected", "")


def _status(observed: Observed, version: ResolvedVersion, reading: ServiceStatus) -> dict[str, Any]:
    progressing = not reading.ready
    updates = [
        Condition(conditions.READY, reading.ready, "Ready" if reading.ready else "NotReady", reading.message),
        Condition(
            conditions.PROGRESSING,
            progressing,
            "Reconciling" if progressing else "Reconciled",
            reading.message if progressing else "",
        ),
        degraded(observed, reading),
        *reading.conditions,
    ]
    status = {
        **without_kopf(observed.status),
        "observedGeneration": observed.generation,
        "instances": f"{reading.ready_instances}/{reading.instances}",
        "readyInstances": reading.ready_instances,
        "version": version.version,
        "image": version.image,
        **reading.fields,
    }
    kept = [
        c
        for c in observed.status.get("conditions") or []
        if c.get("type") not in reading.withdrawn_conditions
    ]
    status["conditions"] = conditions.merge_conditions(kept, updates, observed.generation)
    return status


def _transition_events(
    observed: Observed, version: ResolvedVersion, reading: ServiceStatus
) -> list[EventNote]:
    events = []
    previous = conditions.find(observed.status.get("conditions"), conditions.READY)
    was_ready = bool(previous and previous.get("status") == "True")
    if reading.ready and not was_ready:
        events.append(EventNote("Normal", "Ready", reading.message))
    now_degraded = degraded(observed, reading)
    before = conditions.find(observed.status.get("conditions"), conditions.DEGRADED) or {}
    if now_degraded.reason == PODS_NOT_CREATED and (
        before.get("reason") != PODS_NOT_CREATED or before.get("message") != now_degraded.message
    ):
        events.append(EventNote("Warning", PODS_NOT_CREATED, now_degraded.message))
    if not reading.ready and was_ready:
        events.append(EventNote("Warning", "NotReady", reading.message))
    for condition in reading.conditions:
        before = conditions.find(observed.status.get("conditions"), condition.type)
        was = before.get("status") if before else None
        if condition.status is None:
            continue  # not known now (e.g. a server not answering): nothing to tell yet
        if condition.status and was in (None, "Unknown"):
            continue  # new, or back from not known, as it should be: nothing happened
        if was != condition.as_status():
            events.append(
                EventNote("Normal" if condition.status else "Warning", condition.reason, condition.message)
            )
    if version.deprecated and observed.status.get("version") != version.version:
        events.append(
            EventNote(
                "Warning", "DeprecatedVersion", f"version {version.version} is deprecated in the catalog"
            )
        )
    return events
