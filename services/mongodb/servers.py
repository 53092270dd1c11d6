"""Talking to the servers of one `MongoDB` with pymongo's asyncio client: each on its pod's IP
(`directConnection`, so a secondary answers for itself), as the root user whose Secret the
framework generated. A server that does not answer within a few seconds counts as not
answering: a frozen member must not hold the operator up. A login refused (AuthenticationFailed,
code 18) is tried with the other password of a credentials rotation under way
(`framework.kube.secrets.Passwords`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from lightkube import AsyncClient
from pymongo import AsyncMongoClient
from pymongo.errors import OperationFailure, PyMongoError

from framework.kube.secrets import Passwords, SecretValues
from services.mongodb.replicaset import PORT, Hello, parse_hello

PROBE_TIMEOUT_MS = 3000
AUTHENTICATION_FAILED = 18
CHANGE_TIMEOUT_MS = 60000  # a reconfiguration waits for a majority to take it


def client_of(host: str, timeout_ms: int, **credentials: Any) -> AsyncMongoClient:
    """A client of the one server at `host` (no discovery of the rest of its set)."""
    return AsyncMongoClient(
        host=host,
        port=PORT,
        directConnection=True,
        serverSelectionTimeoutMS=timeout_ms,
        connectTimeoutMS=timeout_ms,
        socketTimeoutMS=timeout_ms,
        appname="statefleet-operator",
        **credentials,
    )


def refused_login(error: Exception) -> bool:
    return isinstance(error, OperationFailure) and error.code == AUTHENTICATION_FAILED


class Servers:
    def __init__(self, root_secret: str) -> None:
        self.usernames = SecretValues(root_secret, "username")
        self.passwords = Passwords(root_secret)  # `password`, then `next-password`

    @asynccontextmanager
    async def connect(
        self,
        client: AsyncClient,
        namespace: str,
        name: str,
        host: str,
        timeout_ms: int = PROBE_TIMEOUT_MS,
        authenticated: bool = True,
    ) -> AsyncIterator[AsyncMongoClient]:
        if not authenticated:
            mongo = client_of(host, timeout_ms)
        else:
            username = await self.usernames.get(client, namespace, name)

            async def attempt(password: str) -> AsyncMongoClient:
                # The login is on the first use: a ping, so that a refused password shows here.
                attempted = client_of(
                    host, timeout_ms, username=username, password=password, authSource="admin"
                )
                try:
                    await attempted.admin.command("ping")
                except BaseException:
                    await attempted.close()
                    raise
                return attempted

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

    async def hello(self, client: AsyncClient, namespace: str, name: str, ip: str) -> Hello | None:
        """The server's `hello` (no credentials needed), None when it does not answer in time."""
        try:
            async with self.connect(client, namespace, name, ip, authenticated=False) as mongo:
                return parse_hello(await mongo.admin.command("hello"))
        except PyMongoError:
            return None

    async def logs_in(self, host: str, username: str, password: str, database: str) -> bool:
        """Whether these credentials open a session (False when refused, or no answer)."""
        mongo = client_of(host, PROBE_TIMEOUT_MS, username=username, password=password, authSource=database)
        try:
            await mongo.admin.command("ping")
        except PyMongoError:
            return False
        finally:
            await mongo.close()
        return True

    async def command(
        self,
        client: AsyncClient,
        namespace: str,
        name: str,
        ip: str,
        command: dict[str, Any],
        timeout_ms: int = PROBE_TIMEOUT_MS,
    ) -> dict[str, Any]:
        """An admin command as root; raises PyMongoError."""
        async with self.connect(client, namespace, name, ip, timeout_ms) as mongo:
            return await mongo.admin.command(command)
