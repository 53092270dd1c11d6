"""Client-side encryption of backups (`spec.s3.encryption`): every piece of a backup and every
archived WAL file is sealed before it leaves the pod, and a backup's manifest is authenticated,
so that what a storage holds reveals nothing and a piece tampered with, moved or swapped is
refused before anything is restored. Pure: no Kubernetes, no storage.

Sealed object: MAGIC + the key's id (16 hex characters) + a 12-byte random nonce + AES-256-GCM
of the content (ciphertext and 16-byte tag). The associated data is that header and the
object's own S3 key: a piece copied under another key (another backup, another place in the
same object) fails to open. The key id is a fingerprint, not the key: a backup says which key
sealed it, so a keyring of several (a rotation) opens old and new backups alike.

Keys come from a Secret (`EncryptionSpec.keys_secret`): each entry a base64 32-byte key. Jobs
get them as variables `STATEFLEET_BACKUP_KEY_<entry>` (envFrom with a prefix, `keyring_of`);
the WAL archiver reads them from a Secret volume each time (`Keyring.from_directory`), so new
keys reach it without a restart.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from backup.storage import EncryptionSpec, S3Spec, StorageError

MAGIC = b"SFS1"
CIPHER = "AES-256-GCM"
KEY_SIZE = 32
KEY_ID_SIZE = 16  # hex characters
NONCE_SIZE = 12
TAG_SIZE = 16
HEADER_SIZE = len(MAGIC) + KEY_ID_SIZE + NONCE_SIZE
OVERHEAD = HEADER_SIZE + TAG_SIZE  # bytes a sealed object has beyond its content
ENV_PREFIX = "STATEFLEET_BACKUP_KEY_"
# The keys Secret's entries as JSON ({entry: base64 key}), where a pod reads them from its
# bootstrap Secret's request (`backup.restore.write_bootstrap_secret`) rather than by envFrom.
REQUEST_FIELD = "sealingKeys"
HMAC_PREFIX = "hmac-sha256:"
MANIFEST_LABEL = b"statefleet-manifest-hmac"


class SealError(StorageError):
    """A key missing or malformed, or an object that does not open: `reason` is KeyMissing,
    KeyInvalid, NotSealed, SealBroken, ManifestUnsigned or ManifestForged."""


def key_id(key: bytes) -> str:
    """A fingerprint of the key that says which key sealed an object without revealing it."""
    return hashlib.sha256(b"statefleet-key-id" + key).hexdigest()[:KEY_ID_SIZE]


@dataclass(frozen=True)
class Keyring:
    """Named keys (`entries`): `current` seals, every one opens. `source` names where they
    came from, for messages (the Secret)."""

    entries: dict[str, bytes]
    current: str
    source: str = "the keyring"

    def by_id(self) -> dict[str, bytes]:
        return {key_id(key): key for key in self.entries.values()}

    def sealing_key(self) -> bytes:
        """The key new objects are sealed with; KeyMissing naming the Secret and the entry."""
        if self.current not in self.entries:
            held = ", ".join(sorted(self.entries)) or "none: it is missing or empty"
            raise SealError(
                "KeyMissing",
                f"spec.s3.encryption.key: {self.source} has no entry {self.current} (it holds: {held})",
            )
        return self.entries[self.current]

    def current_id(self) -> str:
        return key_id(self.sealing_key())

    def seal(self, object_key: str, plain: bytes) -> bytes:
        return seal(self.sealing_key(), object_key, plain)

    @classmethod
    def from_directory(cls, path: Path, current: str, source: str | None = None) -> Keyring:
        """The keys of a mounted Secret volume: one file per entry (the kubelet's own `..data`
        links left out). Read afresh by whoever must follow a rotation without a restart."""
        where = source or f"the keys in {path}"
        entries: dict[str, str] = {}
        if path.is_dir():
            for item in sorted(path.iterdir()):
                if not item.name.startswith(".") and item.is_file():
                    entries[item.name] = item.read_text()
        return keyring_from(entries, current, where)


def decode_key(entry: str, value: str, source: str) -> bytes:
    """A base64 32-byte key; KeyInvalid naming the entry otherwise."""
    try:
        key = base64.b64decode(value.strip(), validate=True)
    except (binascii.Error, ValueError) as error:
        raise SealError("KeyInvalid", f"{source}: entry {entry} is not base64: {error}") from error
    if len(key) != KEY_SIZE:
        raise SealError(
            "KeyInvalid",
            f"{source}: entry {entry} holds {len(key)} bytes, not a {KEY_SIZE}-byte key "
            "(make one with: openssl rand -base64 32)",
        )
    return key


def keyring_from(entries: Mapping[str, str], current: str, source: str) -> Keyring:
    """A keyring from a Secret's entries (base64 text): every entry must be a key."""
    keys = {name: decode_key(name, value, source) for name, value in entries.items()}
    return Keyring(keys, current, source)


def secret_source(encryption: EncryptionSpec) -> str:
    return f"Secret {encryption.keys_secret} (spec.s3.encryption.keysSecret)"


def keyring_of(
    spec: S3Spec, environ: Mapping[str, str], carried: Mapping[str, str] | None = None
) -> Keyring | None:
    """The keyring a pod was given for the storage `spec` (None: it does not encrypt): the
    variables STATEFLEET_BACKUP_KEY_<entry>, and the entries `carried` in its request (a
    bootstrap Secret's)."""
    if spec.encryption is None:
        return None
    entries = {
        name.removeprefix(ENV_PREFIX): value for name, value in environ.items() if name.startswith(ENV_PREFIX)
    }
    entries.update(carried or {})
    return keyring_from(entries, spec.encryption.key, secret_source(spec.encryption))


def seal(key: bytes, object_key: str, plain: bytes) -> bytes:
    """`plain` encrypted and authenticated for the object `object_key` alone."""
    header = MAGIC + key_id(key).encode() + os.urandom(NONCE_SIZE)
    return header + AESGCM(key).encrypt(header[-NONCE_SIZE:], plain, header + object_key.encode())


def is_sealed(data: bytes) -> bool:
    return data[: len(MAGIC)] == MAGIC


def sealed_key_id(data: bytes) -> str | None:
    return data[len(MAGIC) : len(MAGIC) + KEY_ID_SIZE].decode(errors="replace") if is_sealed(data) else None


def open_sealed(keyring: Keyring, object_key: str, data: bytes) -> bytes:
    """The content of a sealed object read from `object_key`; SealError naming the object when
    it is not sealed, its key is not in the keyring, or it fails authentication."""
    if not is_sealed(data) or len(data) < OVERHEAD:
        raise SealError(
            "NotSealed",
            f"object {object_key} is not sealed, yet its storage encrypts (spec.s3.encryption): refused",
        )
    header, body = data[:HEADER_SIZE], data[HEADER_SIZE:]
    found = sealed_key_id(data)
    key = keyring.by_id().get(found or "")
    if key is None:
        raise SealError(
            "KeyMissing",
            f"object {object_key} is sealed with key id {found}, which the keyring does not hold "
            f"({keyring.source}: {describe(keyring)}): add back the entry it was sealed with",
        )
    try:
        return AESGCM(key).decrypt(header[-NONCE_SIZE:], body, header + object_key.encode())
    except InvalidTag as error:
        raise SealError(
            "SealBroken", f"object {object_key} fails authentication: tampered with or moved"
        ) from error


def describe(keyring: Keyring) -> str:
    """Its entries and their ids, e.g. `k1 (3f2a...), k2 (9b1c...)`."""
    return ", ".join(f"{name} ({key_id(key)})" for name, key in sorted(keyring.entries.items())) or "no entry"


def refuse_sealed(object_key: str, data: bytes) -> None:
    """A storage without encryption meets a sealed object: say so rather than fail to parse it."""
    if is_sealed(data):
        raise SealError(
            "KeyMissing",
            f"object {object_key} is sealed with key id {sealed_key_id(data)}, but its storage has no "
            "spec.s3.encryption to open it with",
        )


# -- the manifest ----------------------------------------------------------------------------


def canonical(document: Mapping[str, Any]) -> bytes:
    """The manifest as signed: its JSON without `authentication`, keys sorted, no spaces (the
    raw document, so fields a reader does not know are covered too)."""
    signed = {k: v for k, v in document.items() if k != "authentication"}
    return json.dumps(signed, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def manifest_mac(key: bytes, manifest_key: str, document: Mapping[str, Any]) -> str:
    """HMAC-SHA256 of the manifest and its own key (a manifest copied over another backup's
    fails), with a key derived from the sealing key (never used as is for two purposes)."""
    mac_key = hmac.new(key, MANIFEST_LABEL, hashlib.sha256).digest()
    digest = hmac.new(mac_key, manifest_key.encode() + b"\n" + canonical(document), hashlib.sha256)
    return HMAC_PREFIX + digest.hexdigest()


def sealing_record(keyring: Keyring) -> dict[str, str]:
    """What a sealed manifest says of its sealing (`Manifest.sealing`)."""
    return {"keyId": keyring.current_id(), "cipher": CIPHER}


def sign_manifest(keyring: Keyring, manifest_key: str, document: dict[str, Any]) -> dict[str, Any]:
    """The manifest document with its `authentication`, by the current key."""
    return {**document, "authentication": manifest_mac(keyring.sealing_key(), manifest_key, document)}


def check_manifest(
    spec: S3Spec, keyring: Keyring | None, manifest_key: str, document: Mapping[str, Any]
) -> None:
    """Before anything of a backup is read: a storage that encrypts takes only a manifest
    signed by a key of its keyring; one that does not takes only an unsealed one."""
    sealing = document.get("sealing") or {}
    authentication = document.get("authentication")
    if spec.encryption is None:
        if sealing or authentication:
            raise SealError(
                "KeyMissing",
                f"{manifest_key} is sealed with key id {sealing.get('keyId')}, but its storage has no "
                "spec.s3.encryption to open it with",
            )
        return
    if keyring is None:  # a caller that did not read the storage's keys
        raise SealError("KeyMissing", f"{manifest_key}: the storage encrypts but no keys were read")
    if not authentication or not sealing:
        raise SealError(
            "ManifestUnsigned",
            f"{manifest_key} is not signed, yet its storage encrypts (spec.s3.encryption): refused, as a "
            "manifest put there by someone without the keys would be",
        )
    found = str(sealing.get("keyId"))
    key = keyring.by_id().get(found)
    if key is None:
        raise SealError(
            "KeyMissing",
            f"{manifest_key} is sealed with key id {found}, which the keyring does not hold "
            f"({keyring.source}: {describe(keyring)}): add back the entry it was sealed with",
        )
    if not hmac.compare_digest(str(authentication), manifest_mac(key, manifest_key, document)):
        raise SealError(
            "ManifestForged",
            f"{manifest_key} fails authentication: tampered with, or another backup's manifest",
        )
