"""The chaos test's history checker (porcupine under our list model) refuses what it must: a
lost acknowledged append, a read of the past; and takes unknown outcomes as either."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from e2e.history import Operation

pytestmark = pytest.mark.unit

MODULE = Path(__file__).resolve().parents[2] / "testbed" / "gomod" / "linearizability"


@pytest.fixture(scope="module")
def checker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    go = shutil.which("go") or "/usr/local/go/bin/go"
    out = tmp_path_factory.mktemp("checker") / "linearizability"
    subprocess.run([go, "build", "-o", str(out), "."], cwd=MODULE, check=True, timeout=600)
    return out


def check(checker: Path, *ops: Operation) -> tuple[int, str]:
    lines = "".join(json.dumps(op.record()) + "\n" for op in ops)
    result = subprocess.run([str(checker)], input=lines, capture_output=True, text=True, timeout=60)
    return result.returncode, result.stdout


def append(value: int, call: int, ret: int | None, key: str = "k") -> Operation:
    return Operation(client=0, key=key, kind="append", call=call, value=value, ret=ret)


def read(values: list[int], call: int, ret: int, key: str = "k", client: int = 1) -> Operation:
    return Operation(client=client, key=key, kind="read", call=call, values=values, ret=ret)


def test_a_history_of_one_client_after_another_is_linearizable(checker: Path) -> None:
    code, out = check(checker, append(1, 0, 1), read([1], 2, 3), append(2, 4, 5), read([1, 2], 6, 7))
    assert code == 0, out
    assert out.startswith("Ok: 4 records, 4 operations checked over 1 keys")


def test_an_acknowledged_append_lost_is_refused(checker: Path) -> None:
    code, out = check(checker, append(1, 0, 1), append(2, 2, 3), read([1], 4, 5))
    assert code == 1
    assert out.startswith("Illegal")


def test_a_read_of_the_past_is_refused(checker: Path) -> None:
    # A second client read the new value, then a third the old one: a stale server answered.
    history = (append(1, 0, 1), append(2, 2, 10), read([1, 2], 3, 4), read([1], 5, 6, client=2))
    code, out = check(checker, *history)
    assert code == 1
    assert out.startswith("Illegal")


def test_an_append_of_unknown_outcome_may_or_may_not_have_happened(checker: Path) -> None:
    seen: list[Any] = [append(1, 0, 1), append(2, 2, None), read([1], 3, 4), read([1, 2], 5, 6)]
    assert check(checker, *seen)[0] == 0
    never_seen = [append(1, 0, 1), append(2, 2, None), read([1], 3, 4)]
    code, out = check(checker, *never_seen)
    assert code == 0
    assert "2 operations checked" in out  # the unseen unknown append is left out
    # Unknown does not mean anything goes: once seen, it cannot vanish.
    assert check(checker, append(2, 0, None), read([2], 1, 2), read([], 3, 4))[0] == 1


def test_an_unknown_append_may_take_effect_after_a_later_one_of_the_same_client(checker: Path) -> None:
    # Its backend committed after the client gave up and appended the next value.
    history = (append(1, 0, None), append(2, 2, 3), read([2], 4, 5), read([1, 2], 6, 7))
    assert check(checker, *history)[0] == 0
