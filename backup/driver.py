"""One backup driver per service, run inside the backup Job: it streams the service's data
into the storage (`backup`) and back (`restore`). A plugin names its driver module
(`ServicePlugin.backups.driver`); the module exposes `DRIVER`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from backup.manifest import Manifest, PhysicalPosition
from backup.storage import StoredObject


@dataclass
class Taken:
    """What a driver reports of a backup it took."""

    version: str
    physical: PhysicalPosition | None = None
    details: dict[str, Any] = field(default_factory=dict)


class Sink(Protocol):
    def write_object(self, name: str, chunks: Iterator[bytes]) -> StoredObject: ...


# name -> the object's bytes, checked against the manifest's sha256 as they are read
Source = Callable[[str], Iterator[bytes]]


class Driver(Protocol):
    methods: tuple[str, ...]

    def backup(self, method: str, sink: Sink) -> Taken: ...

    def restore(self, manifest: Manifest, source: Source, replace: str | None = None) -> dict[str, Any]:
        """Into the running instance. With `replace` (a token of the Restore), what the instance
        holds of the backup's data is set aside first, under names made from the token."""
        ...

    def roll_back(self, replace: str) -> dict[str, Any]:
        """Undoes a replacing restore that failed, from what the instance recorded: its own data
        back in place; idempotent; {"committed": True} when the restore had succeeded."""
        ...

    def commit(self, replace: str) -> dict[str, Any]:
        """A replacing restore succeeded: what was set aside goes."""
        ...

    def check(self, manifest: Manifest, query: str | None, database: str | None) -> dict[str, Any]:
        """After a restore: the instance holds the backup's data (it reads everything restored,
        and runs the user's query, whose first value must be true or non-zero); raises
        `CheckFailed` otherwise. Returns what it saw."""
        ...

    def bootstrap_wanted(self) -> str | None:
        """In a new instance's pod, before its server starts: why it must not take a physical
        backup's data, or None when it must."""
        ...

    def bootstrap(self, manifest: Manifest, source: Source) -> dict[str, Any]:
        """Puts a physical backup in place of the pod's empty data."""
        ...

    def replace_in_place(
        self, mode: str, token: str, fetch: Callable[[], tuple[Manifest, Source]]
    ) -> dict[str, Any]:
        """In a pod of a stopped instance, before its server starts (`backup.in_place`): with
        mode restore, the pod that was the primary keeps its data aside and takes the backup
        (`fetch` checks every object first), the others drop their copies; with mode rollback,
        the data kept aside goes back. Idempotent per token."""
        ...

    def commit_in_place(self, token: str) -> dict[str, Any]:
        """The check of a physical restore in place passed: what was kept aside goes."""
        ...


class CheckFailed(Exception):
    pass


def load_driver(module: str) -> Driver:
    return importlib.import_module(module).DRIVER
