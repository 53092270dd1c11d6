"""One backup driver per service, run inside the backup Job: it streams the service's data
into the storage (`backup`) and back (`restore`). A plugin names its driver module
(`ServicePlugin.backups.driver`); the module exposes `DRIVER`.

Every driver is a `Driver`. What more it does is a capability, a class of its own the driver
declares as a base and implements in full (no stub that raises: Python refuses to make a
driver with a method left out): `ReplacesOnline`, `BootstrapsPhysical`, `ReplacesInPlace`.
The plugin's `Backups` says which the operator asks of its driver; the backup Job checks the
driver has the one an action needs (`capability`) and refuses the request otherwise.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, TypeVar

from backup.manifest import Manifest, PhysicalPosition
from backup.sealing import Keyring
from backup.storage import S3Spec, StoredObject


@dataclass
class Taken:
    """What a driver reports of a backup it took."""

    version: str
    physical: PhysicalPosition | None = None
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class WalArchive:
    """The instance's continuous archive, in the backup's own storage: a physical backup may
    leave the WAL it needs there (and check it is there) rather than carry it."""

    client: Any
    storage: S3Spec
    prefix: str
    keyring: Keyring | None = None  # the storage encrypts: its WAL files are sealed

    @property
    def location(self) -> str:
        return f"s3://{self.storage.bucket}/{self.prefix}"


class Sink(Protocol):
    def write_object(self, name: str, chunks: Iterator[bytes]) -> StoredObject: ...


# name -> the object's bytes, checked against the manifest's sha256 as they are read
Source = Callable[[str], Iterator[bytes]]


class Driver(ABC):
    """What every driver does: back up by one of its `methods`, restore into an instance that
    runs and does not hold the backup's data yet, check an instance after a restore."""

    methods: ClassVar[tuple[str, ...]]

    @abstractmethod
    def backup(self, method: str, sink: Sink, archive: WalArchive | None = None) -> Taken:
        """Streams a backup into `sink`. `archive`: the instance archives its WAL continuously
        into this storage (a driver that has no use for it ignores it)."""

    @abstractmethod
    def restore(self, manifest: Manifest, source: Source) -> dict[str, Any]:
        """Into the running instance (a new one, or one that does not hold the backup's data)."""

    @abstractmethod
    def check(self, manifest: Manifest, query: str | None, database: str | None) -> dict[str, Any]:
        """After a restore: the instance holds the backup's data (it reads everything restored,
        and runs the user's query, whose first value must be true or non-zero); raises
        `CheckFailed` otherwise. Returns what it saw."""


class ReplacesOnline(Driver):
    """Restores over a running instance's own data, by a Job (`Backups.replaces_online`,
    a Restore's `target.replace`), and undoes or ends that restore."""

    @abstractmethod
    def restore(self, manifest: Manifest, source: Source, replace: str | None = None) -> dict[str, Any]:
        """Into the running instance. With `replace` (a token of the Restore), what the instance
        holds of the backup's data is set aside first, under names made from the token."""

    @abstractmethod
    def roll_back(self, replace: str) -> dict[str, Any]:
        """Undoes a replacing restore that failed, from what the instance recorded: its own data
        back in place; idempotent; {"committed": True} when the restore had succeeded."""

    @abstractmethod
    def commit(self, replace: str) -> dict[str, Any]:
        """A replacing restore succeeded: what was set aside goes."""


class BootstrapsPhysical(Driver):
    """A physical backup becomes a new instance's data before its server starts, in an init
    container of its pods (`Backups.bootstrap_methods`)."""

    @abstractmethod
    def bootstrap_wanted(self) -> str | None:
        """In a new instance's pod, before its server starts: why it must not take a physical
        backup's data, or None when it must."""

    @abstractmethod
    def bootstrap(
        self, manifest: Manifest, source: Source, point_in_time: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Puts a physical backup in place of the pod's empty data. With `point_in_time`
        ({archive: s3://bucket/prefix, target: a `framework.spec.RecoveryTarget`}), the server
        then recovers to that point from the archive before it serves."""


class ReplacesInPlace(Driver):
    """A physical backup restored over a running instance, stopped for it
    (`Backups.restores_in_place`, `backup.in_place`)."""

    @abstractmethod
    def replace_in_place(
        self,
        mode: str,
        token: str,
        fetch: Callable[[], tuple[Manifest, Source]],
        point_in_time: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """In a pod of a stopped instance, before its server starts (`backup.in_place`): with
        mode restore, the pod that was the primary keeps its data aside and takes the backup
        (`fetch` checks every object first), then recovers to `point_in_time` as `bootstrap`
        says; the others drop their copies; with mode rollback, the data kept aside goes back.
        Idempotent per token."""

    @abstractmethod
    def commit_in_place(self, token: str) -> dict[str, Any]:
        """The check of a physical restore in place passed: what was kept aside goes."""


class CheckFailed(Exception):
    pass


class MissingCapability(Exception):
    """A request asked a driver for what it does not declare (the plugin and its driver
    disagree): refused before anything is done."""


Capable = TypeVar("Capable", bound=Driver)


def capability(driver: Driver, kind: type[Capable], action: str) -> Capable:
    """The driver as the capability `kind` the request's `action` needs; `MissingCapability`
    naming both when it does not declare it."""
    if not isinstance(driver, kind):
        named = f"{type(driver).__module__}.{type(driver).__name__}"
        raise MissingCapability(
            f"{action} needs the driver capability {kind.__name__}, which the driver {named} does not declare"
        )
    return driver


def load_driver(module: str) -> Driver:
    return importlib.import_module(module).DRIVER
