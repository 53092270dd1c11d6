"""A backup's client programs when the instance's Service leads nowhere for a moment."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.postgres import backup_connection, backup_driver
from services.postgres.backup_driver import CommandFailed, CommandOutput

pytestmark = pytest.mark.unit

REFUSED = (
    'pg_dump: error: connection to server at "demo-rw" (10.96.0.9), port 5432 failed: Connection refused'
)


def command(tmp_path: Path, *attempts: str) -> list[str]:
    """A program that plays one attempt per run, in order: `ok` dumps, `refused` cannot connect,
    `denied` is refused its login, `half` writes some of a dump, then loses the server."""
    (tmp_path / "attempts").write_text("\n".join(attempts) + "\n")
    script = tmp_path / "client.sh"
    script.write_text(
        f"""#!/usr/bin/env bash
attempt=$(head -1 {tmp_path}/attempts); sed -i 1d {tmp_path}/attempts
case $attempt in
  ok) printf dump ;;
  refused) echo '{REFUSED}' >&2; exit 1 ;;
  denied) echo 'FATAL: password authentication failed for user "backup"' >&2; exit 1 ;;
  half) printf du; echo '{REFUSED}' >&2; exit 1 ;;
esac
"""
    )
    script.chmod(0o755)
    return [str(script)]


@pytest.fixture(autouse=True)
def no_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backup_driver.time, "sleep", lambda _: None)


def test_a_client_that_could_not_connect_is_started_again_until_it_can(tmp_path: Path) -> None:
    assert b"".join(CommandOutput(command(tmp_path, "refused", "refused", "ok"))) == b"dump"


def test_a_refused_login_fails_at_once_naming_the_program(tmp_path: Path) -> None:
    with pytest.raises(
        CommandFailed, match=r"client\.sh exited with 1: FATAL: password authentication failed"
    ):
        b"".join(CommandOutput(command(tmp_path, "denied", "ok")))


def test_a_client_that_wrote_part_of_its_output_is_never_started_again(tmp_path: Path) -> None:
    with pytest.raises(CommandFailed, match="Connection refused"):
        b"".join(CommandOutput(command(tmp_path, "half", "ok")))


def test_a_server_that_never_answers_fails_the_command_once_the_wait_is_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(backup_driver, "SETTLE_SECONDS", 0.0)
    with pytest.raises(CommandFailed, match="Connection refused"):
        b"".join(CommandOutput(command(tmp_path, "refused", "ok")))


def test_only_an_unanswered_connection_is_worth_another_try() -> None:
    assert backup_connection.unreachable(REFUSED)
    assert backup_connection.unreachable("connection to server failed: timeout expired")
    assert not backup_connection.unreachable('FATAL: role "backup" does not exist')
