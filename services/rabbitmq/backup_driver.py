"""The RabbitMQ backup driver, run inside the backup Job: the cluster's definitions (users,
vhosts, permissions, queues, exchanges, bindings, policies, parameters) through the
management API, restored into a new cluster. Messages are not part of them.

The cluster's own default user (the Job's credentials) is left out of the backup: a cluster
restored from it keeps its own administrator, and the old one's password opens nothing there.
"""

from __future__ import annotations

import json
import os
import ssl
from typing import Any

import httpx2

from backup.driver import CheckFailed, Driver, Sink, Source, Taken, WalArchive
from backup.manifest import Manifest

DEFINITIONS = "definitions.json"
TIMEOUT = 300.0  # an import of many queues takes a while: the API answers when it is done
# What a restored cluster must hold, each entry named by these fields.
CHECKED = {
    "vhosts": ("name",),
    "users": ("name",),
    "permissions": ("user", "vhost"),
    "policies": ("vhost", "name"),
    "queues": ("vhost", "name"),
    "exchanges": ("vhost", "name"),
    "bindings": ("vhost", "source", "destination", "destination_type", "routing_key"),
}


class DefinitionsRefused(Exception):
    pass


def api(method: str, path: str, body: bytes | None = None) -> httpx2.Response:
    """Over HTTPS to the client Service, whose name the certificate holds, verified with the
    instance's CA (RABBITMQ_CA)."""
    url = f"{os.environ['RABBITMQ_MANAGEMENT_URL'].rstrip('/')}/api/{path}"
    auth = (os.environ["RABBITMQ_USERNAME"], os.environ["RABBITMQ_PASSWORD"])
    headers = {"content-type": "application/json"} if body is not None else {}
    ca = os.environ.get("RABBITMQ_CA")
    verify = ssl.create_default_context(cadata=ca) if ca else True
    response = httpx2.request(
        method, url, auth=auth, content=body, headers=headers, timeout=TIMEOUT, verify=verify
    )
    if response.status_code // 100 != 2:
        raise DefinitionsRefused(f"{method} /api/{path}: HTTP {response.status_code}: {response.text[:500]}")
    return response


def without_user(definitions: dict[str, Any], user: str) -> dict[str, Any]:
    """The definitions less one user and what was granted to it, and less the cluster's own
    identity (`global_parameters`: its name and internal id), which a copy must not take."""
    kept = {k: v for k, v in definitions.items() if k != "global_parameters"}
    kept["users"] = [u for u in definitions.get("users") or [] if u.get("name") != user]
    for key in ("permissions", "topic_permissions"):
        kept[key] = [p for p in definitions.get(key) or [] if p.get("user") != user]
    return kept


def counts(definitions: dict[str, Any]) -> dict[str, int]:
    return {kind: len(definitions.get(kind) or []) for kind in CHECKED}


def entries(definitions: dict[str, Any], kind: str) -> set[tuple[str, ...]]:
    fields = CHECKED[kind]
    return {tuple(str(item.get(f, "")) for f in fields) for item in definitions.get(kind) or []}


def missing(backup: dict[str, Any], cluster: dict[str, Any]) -> dict[str, list[str]]:
    """What the backup defines that the cluster lacks, by kind (pure)."""
    gaps = {}
    for kind in CHECKED:
        absent = sorted(entries(backup, kind) - entries(cluster, kind))
        if absent:
            gaps[kind] = ["/".join(entry) for entry in absent]
    return gaps


class RabbitMQDriver(Driver):
    """No capability beyond the core: definitions are imported into a new cluster, once it runs."""

    methods = ("definitions",)

    def backup(self, method: str, sink: Sink, archive: WalArchive | None = None) -> Taken:
        if method != "definitions":
            raise DefinitionsRefused(f"spec.method: RabbitMQ backs up its definitions, not {method}")
        version = api("GET", "overview").json().get("rabbitmq_version", "")
        definitions = without_user(api("GET", "definitions").json(), os.environ["RABBITMQ_USERNAME"])
        sink.write_object(DEFINITIONS, iter([json.dumps(definitions).encode()]))
        return Taken(version, details={"definitions": counts(definitions)})

    def restore(self, manifest: Manifest, source: Source) -> dict[str, Any]:
        raw = b"".join(source(DEFINITIONS))
        api("POST", "definitions", raw)
        backed_up = json.loads(raw)
        raise_if_missing(backed_up, api("GET", "definitions").json())  # each one, by name
        return {"definitions": counts(backed_up)}

    def check(self, manifest: Manifest, query: str | None, database: str | None) -> dict[str, Any]:
        """At least as many of each kind as the backup had (the restore itself checked each
        one by name)."""
        if query:
            raise CheckFailed("spec.check.query: a RabbitMQ restore is checked against its definitions only")
        found = counts(api("GET", "definitions").json())
        expected = manifest.details.get("definitions") or {}
        short = {
            kind: f"{found.get(kind, 0)} of {n}" for kind, n in expected.items() if found.get(kind, 0) < n
        }
        if short:
            raise CheckFailed(f"the cluster holds fewer definitions than the backup: {short}")
        return {"definitions": found}


def raise_if_missing(backup: dict[str, Any], cluster: dict[str, Any]) -> None:
    gaps = missing(backup, cluster)
    if gaps:
        listed = "; ".join(f"{kind}: {', '.join(names[:10])}" for kind, names in sorted(gaps.items()))
        raise CheckFailed(f"the cluster lacks what the backup defines: {listed}")


DRIVER = RabbitMQDriver()
