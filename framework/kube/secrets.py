"""Reading Secrets: their decoded values, and the generated credentials the operator uses to
talk to its servers (read once: the framework never regenerates them)."""

from __future__ import annotations

import base64
from typing import Any

from lightkube import AsyncClient
from lightkube.resources.core_v1 import Secret


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
