"""Talking to the servers of one `MongoDB` with pymongo's asyncio client: each on its pod's IP
(`directConnection`, so a secondary answers for itself), over TLS verified with the instance's
CA (the chain, not the host name: the certificate names the Services and pods, not their IPs),
as the root user whose Secret the framework generated. A server that does not answer within a
few seconds counts as not answering: a frozen member must not hold the operator up. A login
refused (AuthenticationFailed, code 18) is tried with the other password of a credentials
rotation under way (`framework.kube.secrets.Passwords`)."""

from __future__ import annotations

import asyncio
import hashlib
import os
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from lightkube import AsyncClient
from pymongo import AsyncMongoClient
from pymongo.errors import AutoReconnect, OperationFailure, PyMongoError, ServerSelectionTimeoutError

from framework.kube.secrets import Passwords, SecretValues
from services.mongodb.replicaset import PORT, Hello, parse_hello

PROBE_TIMEOUT_MS = 3000
AUTHENTICATION_FAILED = 18
CHANGE_TIMEOUT_MS = 60000  # a reconfiguration waits for a majority to take it

# The two servers that can serve a MongoDB (the version catalog's `flavor`). mongod takes TLS
# and, unless spec.tls.required, plaintext on one port; FerretDB has a listener for each.
FERRETDB, MONGOD = "ferretdb", "mongod"
FERRETDB_TLS_PORT = 27018


def tls_port(flavor: str | None) -> int:
    return FERRETDB_TLS_PORT if flavor == FERRETDB else PORT


def tls_address(ip: str, flavor: str | None) -> str:
    """`ip:port` of a pod's TLS listener, as pymongo takes a host."""
    return f"[{ip}]:{tls_port(flavor)}" if ":" in ip else f"{ip}:{tls_port(flavor)}"


def write_ca_file(pem: str) -> str:
    """A file holding `pem` (pymongo reads a CA only from a file), one per content, in the
    temporary directory (an emptyDir in the operator's pod, /tmp in a Job)."""
    path = Path(tempfile.gettempdir()) / "statefleet-ca" / f"{hashlib.sha256(pem.encode()).hexdigest()}.pem"
    if not path.exists():
        path.parent.mkdir(mode=0o700, exist_ok=True)
        descriptor, partial = tempfile.mkstemp(dir=path.parent, suffix=".partial")  # one per writer
        with os.fdopen(descriptor, "w") as out:
            out.write(pem)
        os.replace(partial, path)  # whole or absent: never half a certificate
    return str(path)


def client_of(address: str, timeout_ms: int, ca: str | None, **credentials: Any) -> AsyncMongoClient:
    """A client of the one server at `address` (no discovery of the rest of its set), over TLS
    verified with the CA in file `ca` (None: in clear)."""
    tls: dict[str, Any] = {"tls": True, "tlsCAFile": ca, "tlsAllowInvalidHostnames": True} if ca else {}
    return AsyncMongoClient(
        host=address,
        directConnection=True,
        serverSelectionTimeoutMS=timeout_ms,
        connectTimeoutMS=timeout_ms,
        socketTimeoutMS=timeout_ms,
        appname="statefleet-operator",
        **tls,
        **credentials,
    )


def certificate_refused(error: BaseException) -> bool:
    return "CERTIFICATE_VERIFY_FAILED" in str(error)


def refused_login(error: Exception) -> bool:
    return isinstance(error, OperationFailure) and error.code == AUTHENTICATION_FAILED


class Servers:
    """Each method's `address` is a pod's TLS listener (`tls_address`)."""

    def __init__(self, root_secret: str, tls_secret: str) -> None:
        self.usernames = SecretValues(root_secret, "username")
        self.passwords = Passwords(root_secret)  # `password`, then `next-password`
        self.ca = SecretValues(tls_secret, "ca.crt")
        self._ca_files: dict[str, str] = {}  # by content

    async def ca_file(self, client: AsyncClient, namespace: str, name: str) -> str:
        pem = await self.ca.get(client, namespace, name)
        if pem not in self._ca_files:
            self._ca_files[pem] = await asyncio.to_thread(write_ca_file, pem)
        return self._ca_files[pem]

    async def reach(
        self,
        client: AsyncClient,
        namespace: str,
        name: str,
        address: str,
        timeout_ms: int,
        **credentials: Any,
    ) -> AsyncMongoClient:
        """A client whose first command (a ping: it needs no login, and proves one) answered. Over
        TLS; mongod's port (27017) is asked in clear too when TLS is not taken there: a member
        started before the instance had TLS (it is rolled onto it one member at a time).
        A certificate refused makes the CA be read again (an instance made anew, a new CA)."""
        ca = await self.ca_file(client, namespace, name)
        attempts: list[str | None] = [ca, None] if address.endswith(f":{PORT}") else [ca]
        for attempt, ca_file in enumerate(attempts, 1):
            mongo = client_of(address, timeout_ms, ca_file, **credentials)
            try:
                await mongo.admin.command("ping")
                return mongo
            except BaseException as error:
                await mongo.close()
                if certificate_refused(error):
                    self.ca.forget(namespace, name)
                    raise
                if attempt == len(attempts) or not isinstance(
                    error, (AutoReconnect, ServerSelectionTimeoutError)
                ):
                    raise
        raise AssertionError("unreachable")  # the loop returns or raises

    @asynccontextmanager
    async def connect(
        self,
        client: AsyncClient,
        namespace: str,
        name: str,
        address: str,
        timeout_ms: int = PROBE_TIMEOUT_MS,
        authenticated: bool = True,
    ) -> AsyncIterator[AsyncMongoClient]:
        if not authenticated:
            mongo = await self.reach(client, namespace, name, address, timeout_ms)
        else:
            username = await self.usernames.get(client, namespace, name)

            async def attempt(password: str) -> AsyncMongoClient:
                return await self.reach(
                    client,
                    namespace,
                    name,
                    address,
                    timeout_ms,
                    username=username,
                    password=password,
                    authSource="admin",
                )

            try:
                mongo = await self.passwords.first_taken(client, namespace, name, attempt, refused_login)
            except OperationFailure as error:
                if refused_login(error):  # neither password, even read again: a new user name?
                    self.usernames.forget(namespace, name)
                raise
        try:
            yield mongo
        finally:
            await mongo.close()

    async def hello(self, client: AsyncClient, namespace: str, name: str, address: str) -> Hello | None:
        """The server's `hello` (no credentials needed), None when it does not answer in time."""
        try:
            async with self.connect(client, namespace, name, address, authenticated=False) as mongo:
                return parse_hello(await mongo.admin.command("hello"))
        except PyMongoError:
            return None

    async def logs_in(
        self,
        client: AsyncClient,
        namespace: str,
        name: str,
        address: str,
        username: str,
        password: str,
        database: str,
    ) -> bool:
        """Whether these credentials open a session (False when refused, or no answer)."""
        try:
            mongo = await self.reach(
                client,
                namespace,
                name,
                address,
                PROBE_TIMEOUT_MS,
                username=username,
                password=password,
                authSource=database,
            )
        except PyMongoError:
            return False
        await mongo.close()
        return True

    async def command(
        self,
        client: AsyncClient,
        namespace: str,
        name: str,
        address: str,
        command: dict[str, Any],
        timeout_ms: int = PROBE_TIMEOUT_MS,
    ) -> dict[str, Any]:
        """An admin command as root; raises PyMongoError."""
        async with self.connect(client, namespace, name, address, timeout_ms) as mongo:
            return await mongo.admin.command(command)
