"""Talking to the nodes of one `RabbitMQ` through their management API, as the default user
(whose Secret the framework generated): each node on its pod's IP (what it says of the
cluster, whether it is quorum-critical), the cluster's users, vhosts and permissions through
the client Service. A node that does not answer within a few seconds counts as not
answering: a frozen node must not hold the operator up. A login refused (401) is tried with the
other password of a credentials rotation under way (`framework.kube.secrets.Passwords`)."""

from __future__ import annotations

import base64
import hashlib
import os
import ssl
from typing import Any
from urllib.parse import quote

import httpx2
from lightkube import AsyncClient
from lightkube.core.exceptions import ApiError
from lightkube.resources.core_v1 import Service

from framework.kube.secrets import Passwords, SecretValues
from services.rabbitmq.cluster import NodeAnswer, parse_nodes

AMQPS_PORT = 5671
MANAGEMENT_TLS_PORT = 15671  # always on (the plaintext one may be off: spec.tls.required)
PROBE_TIMEOUT = 3.0  # the management API answers /api/nodes from the node's own caches
CHANGE_TIMEOUT = 30.0  # a vhost is created on every node before the API answers
HASHING = "rabbit_password_hashing_sha256"  # RabbitMQ's default since 3.6


def password_hash(password: str, salt: bytes | None = None) -> str:
    """RabbitMQ's `rabbit_password_hashing_sha256` of `password`, as its management API's
    `password_hash` takes it: base64(salt + sha256(salt + UTF-8 password)), a fresh 4-byte salt."""
    salt = os.urandom(4) if salt is None else salt
    return base64.b64encode(salt + hashlib.sha256(salt + password.encode()).digest()).decode()


class ManagementError(Exception):
    """The management API refused a change (the message names the request and its reason)."""


class NodeRefused(Exception):
    """The node answered, and said no (the message is its reason)."""


class LoginRefused(Exception):
    """401: the password is not (or no longer) the user's."""

    def __init__(self, response: httpx2.Response) -> None:
        super().__init__(f"HTTP {response.status_code}")
        self.response = response


class Management:
    """Over HTTPS, verified with the instance's CA. By the pod's IP, which the certificate does
    not name: the chain is checked, the host name is not (the CA signs this instance only)."""

    def __init__(self, default_user_secret: str, tls_secret: str) -> None:
        self.usernames = SecretValues(default_user_secret, "username")
        self.passwords = Passwords(default_user_secret)  # `password`, then `next-password`
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
        username = await self.usernames.get(client, namespace, name)
        verify = await self._verify(client, namespace, name)

        async def attempt(password: str) -> httpx2.Response:
            response = await self._send(
                namespace, name, ip, method, path, body, seconds, (username, password), verify
            )
            if response.status_code == 401:
                raise LoginRefused(response)
            return response

        try:
            return await self.passwords.first_taken(
                client, namespace, name, attempt, lambda error: isinstance(error, LoginRefused)
            )
        except LoginRefused as refused:  # neither password, even read again: a new user name?
            self.usernames.forget(namespace, name)
            return refused.response

    async def _send(
        self,
        namespace: str,
        name: str,
        ip: str,
        method: str,
        path: str,
        body: Any,
        seconds: float,
        auth: tuple[str, str],
        verify: ssl.SSLContext,
    ) -> httpx2.Response:
        try:
            async with httpx2.AsyncClient(timeout=seconds, verify=verify) as http:
                return await http.request(
                    method, f"https://{ip}:{MANAGEMENT_TLS_PORT}/api/{path}", auth=auth, json=body
                )
        except httpx2.ConnectError as error:
            if isinstance(error.__cause__, ssl.SSLCertVerificationError) or "CERTIFICATE_VERIFY" in str(
                error
            ):
                self.ca.forget(namespace, name)  # a new CA (the instance made anew): read again
            raise

    async def logs_in(
        self, client: AsyncClient, namespace: str, name: str, ip: str, username: str, password: str
    ) -> bool:
        """Whether the management API takes these credentials (`GET /api/whoami`)."""
        verify = await self._verify(client, namespace, name)
        response = await self._send(
            namespace, name, ip, "GET", "whoami", None, CHANGE_TIMEOUT, (username, password), verify
        )
        if response.status_code == 401:
            return False
        checked(response, "GET", "whoami")
        return True

    async def set_password(
        self, client: AsyncClient, namespace: str, name: str, ip: str, username: str, password: str
    ) -> None:
        """`username`'s password made `password` (its tags kept), then checked to log in."""
        path = f"users/{quote(username, safe='')}"
        user = await self.read(client, namespace, name, ip, path)
        if user is None:
            raise ManagementError(f"GET /api/{path}: the user {username} is gone")
        tags = user.get("tags") or []
        body = {
            "password_hash": password_hash(password),
            "hashing_algorithm": HASHING,
            "tags": ",".join(tags) if isinstance(tags, list) else str(tags),
        }
        await self.change(client, namespace, name, ip, "PUT", path, body)
        if not await self.logs_in(client, namespace, name, ip, username, password):
            raise ManagementError(f"the new password of {username} does not log in (GET /api/whoami)")

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
