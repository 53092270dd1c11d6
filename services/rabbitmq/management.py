"""Talking to the nodes of one `RabbitMQ` through their management API, as the default user
(whose Secret the framework generated): each node on its pod's IP (what it says of the
cluster, whether it is quorum-critical), the cluster's users, vhosts and permissions through
the client Service. A node that does not answer within a few seconds counts as not
answering: a frozen node must not hold the operator up."""

from __future__ import annotations

import ssl
from typing import Any

import httpx2
from lightkube import AsyncClient
from lightkube.core.exceptions import ApiError
from lightkube.resources.core_v1 import Service

from framework.kube.secrets import Credentials, SecretValues
from services.rabbitmq.cluster import NodeAnswer, parse_nodes

AMQPS_PORT = 5671
MANAGEMENT_TLS_PORT = 15671  # always on (the plaintext one may be off: spec.tls.required)
PROBE_TIMEOUT = 3.0  # the management API answers /api/nodes from the node's own caches
CHANGE_TIMEOUT = 30.0  # a vhost is created on every node before the API answers


class ManagementError(Exception):
    """The management API refused a change (the message names the request and its reason)."""


class NodeRefused(Exception):
    """The node answered, and said no (the message is its reason)."""


class Management:
    """Over HTTPS, verified with the instance's CA. By the pod's IP, which the certificate does
    not name: the chain is checked, the host name is not (the CA signs this instance only)."""

    def __init__(self, default_user_secret: str, tls_secret: str) -> None:
        self.credentials = Credentials(default_user_secret)
        self.ca = SecretValues(tls_secret, "ca.crt")

    async def _verify(self, client: AsyncClient, namespace: str, name: str) -> ssl.SSLContext:
        context = ssl.create_default_context(cadata=await self.ca.get(client, namespace, name))
        context.check_hostname = False
        return context

    async def request(
        self,
        client: AsyncClient,
        namespace: str,
        name: str,
        ip: str,
        method: str,
        path: str,
        body: Any = None,
        seconds: float = PROBE_TIMEOUT,
    ) -> httpx2.Response:
        auth = await self.credentials.get(client, namespace, name)
        verify = await self._verify(client, namespace, name)
        try:
            async with httpx2.AsyncClient(timeout=seconds, verify=verify) as http:
                response = await http.request(
                    method, f"https://{ip}:{MANAGEMENT_TLS_PORT}/api/{path}", auth=auth, json=body
                )
        except httpx2.ConnectError as error:
            if isinstance(error.__cause__, ssl.SSLCertVerificationError) or "CERTIFICATE_VERIFY" in str(
                error
            ):
                self.ca.forget(namespace, name)  # a new CA (the instance made anew): read again
            raise
        if response.status_code == 401:  # a resource made anew under the same name: a new Secret
            self.credentials.forget(namespace, name)
        return response

    async def cluster(self, client: AsyncClient, namespace: str, name: str, ip: str) -> NodeAnswer | None:
        """The cluster as this node sees it; None when it does not answer (in time)."""
        try:
            response = await self.request(
                client, namespace, name, ip, "GET", "nodes?columns=name,running,partitions"
            )
        except (httpx2.HTTPError, OSError, ApiError):
            return None
        if response.status_code != 200:
            return None
        return parse_nodes(response.json())

    async def not_quorum_critical(self, client: AsyncClient, namespace: str, name: str, ip: str) -> None:
        """Raises NodeRefused, naming the queues, while stopping this node would leave a quorum
        queue without its majority."""
        response = await self.request(
            client, namespace, name, ip, "GET", "health/checks/node-is-quorum-critical"
        )
        if response.status_code == 200:
            return
        reply = (
            response.json() if response.headers.get("content-type", "").startswith("application/json") else {}
        )
        queues = [f"{q.get('virtual_host', '/')}/{q.get('name')}" for q in reply.get("queues") or []]
        reason = reply.get("reason") or f"HTTP {response.status_code}"
        raise NodeRefused(f"{reason}{': ' + ', '.join(queues) if queues else ''}")

    async def service_address(self, client: AsyncClient, namespace: str, name: str) -> str:
        """The client Service's IP: any ready node answers for the whole cluster."""
        service = await client.get(Service, name, namespace=namespace)
        return service.spec.clusterIP

    async def read(self, client: AsyncClient, namespace: str, name: str, ip: str, path: str) -> Any:
        """`GET /api/<path>`, None when there is no such object."""
        response = await self.request(client, namespace, name, ip, "GET", path, seconds=CHANGE_TIMEOUT)
        if response.status_code == 404:
            return None
        checked(response, "GET", path)
        return response.json()

    async def change(
        self,
        client: AsyncClient,
        namespace: str,
        name: str,
        ip: str,
        method: str,
        path: str,
        body: Any = None,
    ) -> None:
        """PUT or DELETE `/api/<path>`; a DELETE of what is already gone succeeds."""
        response = await self.request(client, namespace, name, ip, method, path, body, seconds=CHANGE_TIMEOUT)
        if method == "DELETE" and response.status_code == 404:
            return
        checked(response, method, path)


def checked(response: httpx2.Response, method: str, path: str) -> None:
    if response.status_code // 100 == 2:
        return
    try:
        reason = response.json().get("reason") or response.text
    except ValueError:
        reason = response.text
    raise ManagementError(f"{method} /api/{path.split('?')[0]}: HTTP {response.status_code}: {reason}")
