"""SCRAM-SHA-256 verifiers as PostgreSQL stores them (`pg_authid.rolpassword`), computed here:
`ALTER ROLE ... PASSWORD '<verifier>'` sets a password whose plaintext never reaches the server,
its logs or its statistics (RFC 5802 and RFC 7677; PostgreSQL's `scram_build_secret`)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os

ITERATIONS = 4096  # PostgreSQL's default (scram_iterations)
SALT_BYTES = 16  # as libpq's PQencryptPasswordConn


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def salted_password(password: str, salt: bytes, iterations: int) -> bytes:
    """Hi(Normalize(password), salt, i) of RFC 5802. PostgreSQL normalizes with SASLprep, which
    leaves printable ASCII as it is: only such passwords are taken here (every generated one)."""
    if not password or not all(" " <= c <= "~" for c in password):
        raise ValueError("a SCRAM verifier is computed here only for printable ASCII passwords")
    return hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)


def keys(salted: bytes) -> tuple[bytes, bytes, bytes]:
    """ClientKey, StoredKey and ServerKey of a salted password."""
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    server_key = hmac.new(salted, b"Server Key", hashlib.sha256).digest()
    return client_key, hashlib.sha256(client_key).digest(), server_key


def verifier(password: str, salt: bytes | None = None, iterations: int = ITERATIONS) -> str:
    """`SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>` (base64), a fresh random salt
    unless one is given."""
    salt = os.urandom(SALT_BYTES) if salt is None else salt
    _, stored_key, server_key = keys(salted_password(password, salt, iterations))
    return f"SCRAM-SHA-256${iterations}:{_b64(salt)}${_b64(stored_key)}:{_b64(server_key)}"


def parse(stored: str) -> tuple[int, bytes, bytes, bytes]:
    """Iterations, salt, StoredKey and ServerKey of a stored verifier; ValueError if it is none."""
    try:
        method, rest = stored.split("$", 1)
        head, tail = rest.split("$", 1)
        iterations, salt = head.split(":", 1)
        stored_key, server_key = tail.split(":", 1)
        if method != "SCRAM-SHA-256":
            raise ValueError(method)
        return (
            int(iterations),
            base64.b64decode(salt, validate=True),
            base64.b64decode(stored_key, validate=True),
            base64.b64decode(server_key, validate=True),
        )
    except ValueError as error:
        raise ValueError(f"not a SCRAM-SHA-256 verifier: {error}") from None


def verifies(stored: str, password: str) -> bool:
    """Whether `stored` (a verifier) is of `password`, whatever its salt."""
    iterations, salt, stored_key, server_key = parse(stored)
    _, expected_stored, expected_server = keys(salted_password(password, salt, iterations))
    return hmac.compare_digest(stored_key, expected_stored) and hmac.compare_digest(
        server_key, expected_server
    )
