"""Kubernetes resource quantities (1Gi, 500M, 0.5) as numbers, to compare sizes."""

from __future__ import annotations

import re
from decimal import Decimal

_SUFFIXES = {
    "": 1,
    "m": Decimal("0.001"),
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}
_PATTERN = re.compile(r"^([0-9]+(?:\.[0-9]+)?)([a-zA-Z]*)$")


def parse_quantity(text: str) -> Decimal:
    match = _PATTERN.match(str(text).strip())
    if not match or match.group(2) not in _SUFFIXES:
        raise ValueError(f"not a quantity: {text!r}")
    return Decimal(match.group(1)) * Decimal(_SUFFIXES[match.group(2)])
