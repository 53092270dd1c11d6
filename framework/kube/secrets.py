"""Reading Secrets: their decoded values, and the generated credentials the operator uses to
talk to its servers (read once: the framework never regenerates them)."""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from lightkube import AsyncClient
from lightkube.resources.core_v1 import Secret

T = TypeVar("T")
PASSWORD, NEXT_PASSWORD = "password", "next-password"  # the second while a rotation is under way


def decoded(secret: dict[str, Any] | None) -> dict[str, str]:
    """A Secret's `data`, decoded (empty for no Secret)."""
    return {k: base64.b64decode(v).decode() for k, v in ((secret or {}).get("data") or {}).items()}


class SecretValues:
    """One key of a Secret named after each instance (`{name}-superuser`), cached per instance."""

    def __init__(self, secret_name: str, key: str) -> None:
        self.secret_name = secret_name  # with {name} in it
        self.key = key
        self._values: dict[tuple[str, str], str] = {}

    async def get(self, client: AsyncClient, namespace: str, name: str) -> str:
        cached = (namespace, name)
        if cached not in self._values:
            secret = await client.get(Secret, self.secret_name.format(name=name), namespace=namespace)
            self._values[cached] = base64.b64decode((secret.data or {})[self.key]).decode()
        return self._values[cached]

    def forget(self, namespace: str, name: str) -> None:
        self._values.pop((namespace, name), None)


class Credentials:
    """The `username` and `password` of a Secret named after each instance (`{name}-root`),
    cached per instance until `forget` (a refused login: the instance was made anew)."""

    def __init__(self, secret_name: str) -> None:
        self.usernames = SecretValues(secret_name, "username")
        self.passwords = SecretValues(secret_name, "password")

    async def get(self, client: AsyncClient, namespace: str, name: str) -> tuple[str, str]:
        return (
            await self.usernames.get(client, namespace, name),
            await self.passwords.get(client, namespace, name),
        )

    def forget(self, namespace: str, name: str) -> None:
        self.usernames.forget(namespace, name)
        self.passwords.forget(namespace, name)


class Passwords:
    """The passwords an instance's servers may take for one user, from a Secret named after the
    instance: its `password` and, while a credentials rotation is under way
    (`framework.credentials`), its `next-password`. Cached per instance, the one that last worked
    first; read again when none is taken (a rotation moved on, or the instance was made anew)."""

    def __init__(self, secret_name: str) -> None:
        self.secret_name = secret_name  # with {name} in it
        self._values: dict[tuple[str, str], list[str]] = {}

    async def candidates(self, client: AsyncClient, namespace: str, name: str) -> list[str]:
        cached = (namespace, name)
        if cached not in self._values:
            secret = await client.get(Secret, self.secret_name.format(name=name), namespace=namespace)
            data = secret.data or {}
            values = [base64.b64decode(data[PASSWORD]).decode()]
            if data.get(NEXT_PASSWORD):
                values.append(base64.b64decode(data[NEXT_PASSWORD]).decode())
            self._values[cached] = values
        return list(self._values[cached])

    def forget(self, namespace: str, name: str) -> None:
        self._values.pop((namespace, name), None)

    async def first_taken(
        self,
        client: AsyncClient,
        namespace: str,
        name: str,
        attempt: Callable[[str], Awaitable[T]],
        refused: Callable[[Exception], bool],
    ) -> T:
        """`attempt(password)` with each password until one is not `refused` (a failed login): the
        cached ones first, then those of the Secret read again. Any other error is raised at once."""
        tried: list[str] = []
        last: Exception | None = None
        for reread in (False, True):
            if reread:
                self.forget(namespace, name)
            for password in await self.candidates(client, namespace, name):
                if password in tried:
                    continue
                tried.append(password)
                try:
                    result = await attempt(password)
                except Exception as error:
                    if not refused(error):
                        raise
                    last = error
                    continue
                values = self._values.get((namespace, name))
                if values and values[0] != password and password in values:
                    values.remove(password)
                    values.insert(0, password)
                return result
        assert last is not None
        raise last
