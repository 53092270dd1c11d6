"""Optional NetworkPolicies (the chart's `networkPolicies` value): each instance's pods take
connections only from the operator's pods, the instance's own pods (replication, clustering),
the Jobs the operator runs against the instance (backups, restores, a service's CLI), the pods
of the applications bound to it (`ServiceBinding.spec.workload.selector`) and the peers the
platform team adds (`networkPolicies.extraIngressFrom`, e.g. Prometheus). Ingress only: what
the pods reach (S3 for WAL and backups, the DNS) is left open.

Pure: the policy of one instance from the settings and the bindings that name it. The
instance plan renders it as one of the instance's children (owned by it, pruned when the
value is turned off).
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Annotated, Any

from pydantic import ConfigDict, Field, ValidationError, model_validator

from framework.kube.meta import LABEL_INSTANCE, LABEL_NAME
from framework.kube.model import ApiModel

NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"  # every namespace carries its own name
POLICY_SUFFIX = "ingress"

LabelValue = Annotated[str, Field(max_length=63)]


class SelectorOperator(StrEnum):
    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"


VALUES_RULE = {
    "rule": "(self.operator == 'In' || self.operator == 'NotIn') ? "
    "(has(self.values) && size(self.values) > 0) : (!has(self.values) || size(self.values) == 0)",
    "message": "In and NotIn take values, Exists and DoesNotExist none",
}


class SelectorRequirement(ApiModel):
    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [VALUES_RULE]})
    key: str = Field(min_length=1, max_length=317)
    operator: SelectorOperator
    values: list[LabelValue] | None = Field(default=None, max_length=64)

    @model_validator(mode="after")
    def values_fit_the_operator(self) -> SelectorRequirement:
        takes_values = self.operator in (SelectorOperator.IN, SelectorOperator.NOT_IN)
        if takes_values != bool(self.values):
            raise ValueError(VALUES_RULE["message"])
        return self


class LabelSelector(ApiModel):
    """A Kubernetes label selector: every label of `matchLabels` and every expression."""

    match_labels: dict[str, LabelValue] | None = Field(default=None, max_length=64)
    match_expressions: list[SelectorRequirement] | None = Field(default=None, max_length=16)

    def empty(self) -> bool:
        return not self.match_labels and not self.match_expressions


class IpBlock(ApiModel):
    cidr: str
    except_: list[str] | None = Field(default=None, alias="except")

    @model_validator(mode="after")
    def networks(self) -> IpBlock:
        for network in (self.cidr, *(self.except_ or [])):
            ipaddress.ip_network(network, strict=False)  # ValueError names it
        return self


class NetworkPolicyPeer(ApiModel):
    """A peer as a NetworkPolicy's `from` takes it (what `extraIngressFrom` lists)."""

    pod_selector: LabelSelector | None = None
    namespace_selector: LabelSelector | None = None
    ip_block: IpBlock | None = None

    @model_validator(mode="after")
    def one_kind(self) -> NetworkPolicyPeer:
        if self.ip_block is not None and (self.pod_selector or self.namespace_selector):
            raise ValueError("ipBlock goes alone, without podSelector or namespaceSelector")
        if self.ip_block is None and self.pod_selector is None and self.namespace_selector is None:
            raise ValueError("a peer needs podSelector, namespaceSelector or ipBlock")
        return self


EMPTY_SELECTOR = "selector must name labels: an empty one would let in every pod of the namespace"


class Workload(ApiModel):
    """The application a `ServiceBinding` binds (servicebinding.io's `workload`, here by the
    labels of its pods)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "(has(self.selector.matchLabels) && size(self.selector.matchLabels) > 0) || "
                    "(has(self.selector.matchExpressions) && size(self.selector.matchExpressions) > 0)",
                    "message": f"workload.{EMPTY_SELECTOR}",
                }
            ]
        }
    )
    selector: LabelSelector = Field(
        description="The labels of the application's pods (its pod template's): with the operator's "
        "NetworkPolicies on, these pods of the binding's namespace may connect to the instance."
    )

    @model_validator(mode="after")
    def not_empty(self) -> Workload:
        if self.selector.empty():
            raise ValueError(EMPTY_SELECTOR)
        return self


class SettingsError(ValueError):
    """The operator's NetworkPolicy settings cannot be used (says which and why)."""


@dataclass(frozen=True)
class NetworkPolicies:
    """The operator's settings, when it makes NetworkPolicies. `operator_namespace` and
    `operator_labels` name its own pods (None: it runs outside the cluster, where it reaches
    the pods from a node, and no peer names it)."""

    operator_namespace: str | None = None
    operator_labels: Mapping[str, str] = field(default_factory=dict)
    extra_from: tuple[dict[str, Any], ...] = ()

    @classmethod
    def from_settings(
        cls, operator_namespace: str | None, operator_labels: str | None, extra_from: str | None
    ) -> NetworkPolicies:
        """From the operator's options: `operator_labels` a JSON object or `k=v,k=v`,
        `extra_from` a JSON list of NetworkPolicyPeers. Raises SettingsError naming the option."""
        labels = parse_labels(operator_labels or "")
        if bool(labels) != bool(operator_namespace):
            raise SettingsError(
                "the operator's pods are named by its namespace and its labels together: "
                f"namespace {operator_namespace or '(none)'}, labels {labels or '(none)'}"
            )
        try:
            listed = json.loads(extra_from) if extra_from and extra_from.strip() else []
        except ValueError as error:
            raise SettingsError(f"extraIngressFrom is not JSON: {error}") from None
        if not isinstance(listed, list):
            raise SettingsError("extraIngressFrom must be a list of NetworkPolicyPeers")
        peers = []
        for index, peer in enumerate(listed):
            try:
                peers.append(NetworkPolicyPeer.model_validate(peer).to_api())
            except ValidationError as error:
                problems = "; ".join(
                    ".".join(str(p) for p in (f"extraIngressFrom[{index}]", *e["loc"])) + f": {e['msg']}"
                    for e in error.errors()
                )
                raise SettingsError(problems) from None
        return cls(operator_namespace or None, labels, tuple(peers))


def parse_labels(text: str) -> dict[str, str]:
    """`{"k": "v"}` or `k=v,k=v` ("": none)."""
    text = text.strip()
    if not text:
        return {}
    if text.startswith("{"):
        try:
            labels = json.loads(text)
        except ValueError as error:
            raise SettingsError(f"the operator's pod labels are not JSON: {error}") from None
        if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
            raise SettingsError("the operator's pod labels must be an object of strings")
        return dict(labels)
    labels = {}
    for pair in text.split(","):
        key, equals, value = pair.partition("=")
        if not equals or not key.strip():
            raise SettingsError(f"the operator's pod labels: {pair!r} is not key=value")
        labels[key.strip()] = value.strip()
    return labels


def client_label(service: str) -> str:
    """The label a pod carries to reach instances of `service` as the operator's Job."""
    return f"statefleet.dev/{service}-client"


def client_labels(service: str, instance: str) -> dict[str, str]:
    """What the Jobs the operator runs against an instance carry (backups, restores, a
    service's CLI): the instance's policy lets them in."""
    return {client_label(service): instance}


def policy_name(instance: str) -> str:
    return f"{instance}-{POLICY_SUFFIX}"


def bound_selectors(bindings: Iterable[Mapping[str, Any]], kind: str, instance: str) -> list[dict[str, Any]]:
    """The workload selectors of the ServiceBindings bound to instance `instance` of `kind`, in
    the order of their names, each once. A binding without one (or with an empty one, which
    admission refuses) lets nobody in."""
    found: list[dict[str, Any]] = []
    for binding in sorted(bindings, key=lambda b: (b.get("metadata") or {}).get("name") or ""):
        spec = binding.get("spec") or {}
        service = spec.get("service") or {}
        if service.get("kind") != kind or service.get("name") != instance:
            continue
        if (binding.get("metadata") or {}).get("deletionTimestamp"):
            continue
        try:
            workload = Workload.model_validate(spec.get("workload")) if spec.get("workload") else None
        except ValidationError:
            continue  # stored before the rule: the binding's own pass says what is wrong
        if workload is None:
            continue
        selector = workload.selector.to_api()
        if selector not in found:
            found.append(selector)
    return found


def ingress_peers(
    settings: NetworkPolicies,
    service: str,
    instance: str,
    selector: Mapping[str, str],
    workloads: Iterable[Mapping[str, Any]],
) -> list[dict[str, Any]]:
    """Who may connect to an instance's pods (`selector`): the operator's pods, the instance's
    own, the operator's Jobs for it, the bound applications' pods (`workloads`, label
    selectors in the instance's namespace), then the platform team's peers."""
    peers: list[dict[str, Any]] = []
    if settings.operator_namespace:
        peers.append(
            {
                "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: settings.operator_namespace}},
                "podSelector": {"matchLabels": dict(settings.operator_labels)},
            }
        )
    peers.append({"podSelector": {"matchLabels": dict(selector)}})
    peers.append({"podSelector": {"matchLabels": client_labels(service, instance)}})
    peers.extend({"podSelector": dict(workload)} for workload in workloads)
    peers.extend(dict(peer) for peer in settings.extra_from)
    return peers


def build_network_policy(
    settings: NetworkPolicies,
    service: str,
    kind: str,
    instance: str,
    bindings: Iterable[Mapping[str, Any]],
) -> dict[str, Any]:
    """The instance's NetworkPolicy `<instance>-ingress` (namespace, labels and owner are the
    instance plan's, as for every child)."""
    selector = {LABEL_NAME: service, LABEL_INSTANCE: instance}
    workloads = bound_selectors(bindings, kind, instance)
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": policy_name(instance)},
        "spec": {
            "podSelector": {"matchLabels": selector},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": ingress_peers(settings, service, instance, selector, workloads)}],
        },
    }
