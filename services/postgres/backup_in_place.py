"""A physical backup restored over a running instance, on the pod's side (see `backup.in_place`):
what the restore init container does to one pod's volume, and how the check Job commits.

Each pod's volume remembers what it did for a token in a marker file next to the data
(`statefleet-restore-<token>`: restored, rolled-back, committed), so a restarted pod never does
it twice, and a rollback never puts old data back over a restore that was checked.
The pod that takes the backup moves its data to `<PGDATA>.before-<token>` (a rename: no copy;
the volume needs room for the backup beside it); the check Job removes that once it passed.
"""

from __future__ import annotations

import os
import shlex
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from psycopg import sql

from backup import in_place
from backup.driver import CheckFailed, Source
from backup.manifest import Manifest
from services.postgres.backup_connection import connect

RESTORED, ROLLED_BACK, COMMITTED = "restored", "rolled-back", "committed"
# What the init container does to one pod's volume.
SKIP, TAKE_BACKUP, DROP_COPY, PUT_BACK, NOTHING_MOVED = (
    "skip",
    "take-backup",
    "drop-copy",
    "put-back",
    "nothing-moved",
)


def plan_volume(mode: str, restoring_pod: bool, marker: str, has_data: bool, has_aside: bool) -> str:
    """Pure: what this pod's init container does, from the mode, whether it is the pod that
    takes the backup, its marker and what its volume holds."""
    if marker in (COMMITTED, ROLLED_BACK):
        return SKIP  # the restore was checked, or undone: never again under this token
    if mode == in_place.RESTORE:
        if marker == RESTORED:
            return SKIP
        if restoring_pod:
            # The primary always has data; an empty volume here is a claim made anew after the
            # restore (an earlier pod's marker went with the old claim): it must not become a
            # second primary, it clones the one there is.
            return TAKE_BACKUP if has_data or has_aside else SKIP
        return DROP_COPY  # a copy of the data being replaced: it clones the new primary
    if restoring_pod:
        return PUT_BACK if has_aside else NOTHING_MOVED
    # Every other copy goes, even one that never took the restore: until the old primary
    # serves again, no standby may exist that the planning could promote in its place.
    return DROP_COPY


class Volume:
    """One pod's data directory, its aside copy and its marker."""

    def __init__(self, pgdata: Path, token: str) -> None:
        self.pgdata = pgdata
        self.aside = pgdata.with_name(f"{pgdata.name}.before-{token}")
        self.partial = pgdata.with_name(pgdata.name + ".restoring")
        self.marker = pgdata.parent / f"statefleet-restore-{token}"

    def marked(self) -> str:
        return self.marker.read_text().strip() if self.marker.exists() else ""

    def mark(self, state: str) -> None:
        self.marker.write_text(state + "\n")


def replace_in_place(
    mode: str,
    token: str,
    fetch: Callable[[], tuple[Manifest, Source]],
    bootstrap: Callable[[Manifest, Source], dict[str, Any]],
) -> dict[str, Any]:
    """The init container's work for one pod; `fetch` reads the manifest (and checks every
    object, unless a Job did before the instance stopped), `bootstrap` puts the backup in place
    of PGDATA, checking it again as it streams: a mismatch then leaves the old data aside."""
    volume = Volume(Path(os.environ["PGDATA"]), token)
    restoring_pod = os.environ.get("POD_NAME") == os.environ.get("RESTORE_POD")
    marker = volume.marked()
    step = plan_volume(
        mode, restoring_pod, marker, (volume.pgdata / "PG_VERSION").exists(), volume.aside.exists()
    )
    result: dict[str, Any] = {"step": step, "mode": mode, "token": token}
    if step == SKIP:
        if marker == COMMITTED and volume.aside.exists():  # the commit stopped half-way
            shutil.rmtree(volume.aside)
        return {**result, "committed": marker == COMMITTED, "marker": marker}
    if step == TAKE_BACKUP:
        manifest, source = fetch()  # nothing was moved before this
        if not volume.aside.exists():
            volume.pgdata.rename(volume.aside)
        # A PGDATA beside the aside copy is an earlier attempt's: bootstrap replaces it.
        result.update(bootstrap(manifest, source))
        volume.mark(RESTORED)
    elif step == PUT_BACK:
        for leftover in (volume.pgdata, volume.partial):
            shutil.rmtree(leftover, ignore_errors=True)
        volume.aside.rename(volume.pgdata)
        volume.mark(ROLLED_BACK)
    elif step == DROP_COPY:
        shutil.rmtree(volume.pgdata, ignore_errors=True)
        volume.mark(RESTORED if mode == in_place.RESTORE else ROLLED_BACK)
    else:
        volume.mark(ROLLED_BACK)  # NOTHING_MOVED
    return result


def commit_in_place(token: str) -> dict[str, Any]:
    """The check passed: the primary's server (the pod that took the backup) marks its volume
    committed, then removes the data it kept aside. Raises `CheckFailed` when the primary is
    not that pod (the aside copy is elsewhere: nothing is removed). Idempotent."""
    with connect() as conn:
        data_directory = Path(str(conn.execute("SHOW data_directory").fetchone()[0]))
        volume = Volume(data_directory, token)
        marker, aside = conn.execute(
            # (isdir: a whole pg_stat_file row is never NOT NULL, its creation time is null on Linux)
            "SELECT pg_read_file(%s, 0, 64, true), (pg_stat_file(%s, true)).isdir IS TRUE",
            [str(volume.marker), str(volume.aside)],
        ).fetchone()
        committed = (marker or "").strip() == COMMITTED  # an earlier attempt got that far
        if not aside and not committed:
            listed = conn.execute(
                "SELECT string_agg(f, ', ' ORDER BY f) FROM pg_ls_dir(%s) f", [str(volume.marker.parent)]
            )
            raise CheckFailed(
                f"the primary holds no {volume.aside.name} (its volume holds {listed.fetchone()[0]}; "
                f"{volume.marker.name}: {(marker or '').strip() or 'none'}): it is not the pod that took "
                "the backup, so what was kept aside cannot be removed from here"
            )
        if not committed:
            conn.execute(
                sql.SQL("COPY (SELECT {}) TO {}").format(
                    sql.Literal(COMMITTED), sql.Literal(str(volume.marker))
                )
            )
        command = f"rm -rf -- {shlex.quote(str(volume.aside))}"
        conn.execute(sql.SQL("COPY (SELECT 1) TO PROGRAM {}").format(sql.Literal(command)))
    return {"committed": True, "removed": str(volume.aside)}
