"""What the test tiers share: the cluster client and the deleted test namespaces of the tiers
that run on the test bed, their time breakdown (e2e/timing.py), and the order in which parallel
workers take their tests (e2e/scheduling.py)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from lightkube import Client

from e2e import kube as kube_helpers
from e2e.namespaces import FAILURES, DeletedNamespaces, worker_name
from e2e.scheduling import GROUPS_FILE, LongestFirstScheduling, write_groups
from e2e.timing import RECORDER

TIMED = ("e2e/", "tests/controller/")
# A failed test's report ends with what its worker's operators (the worker's own, and any the
# test started) wrote while it ran: a CI run keeps no files.
OPERATOR_LOG_LINES = 80
_operator_log_offsets: dict[str, dict[Path, int]] = {}


def _operator_logs() -> list[Path]:
    logs = kube_helpers.REPO / ".testbed" / "logs"
    return sorted(logs.glob(f"operator-*-{worker_name()}.log")) + sorted(
        logs.glob(f"operator-*-{worker_name()}-*.log")
    )


@pytest.fixture(scope="session")
def kube() -> Client:
    return kube_helpers.client()


@pytest.fixture(scope="session")
def deleted_namespaces(kube: Client) -> Iterator[DeletedNamespaces]:
    """Every operator of the session calls `settle` before it stops: the finalizers of the
    deleted namespaces' objects are theirs."""
    tracker = DeletedNamespaces(kube)
    yield tracker
    tracker.settle()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    RECORDER.begin(item.nodeid)
    _operator_log_offsets[item.nodeid] = {log: log.stat().st_size for log in _operator_logs()}
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if not (report.failed and item.nodeid.startswith(TIMED)):
        return
    offsets = _operator_log_offsets.get(item.nodeid, {})
    for log in _operator_logs():
        with log.open("rb") as lines:
            lines.seek(offsets.get(log, 0))
            written = lines.read().decode(errors="replace").splitlines()[-OPERATOR_LOG_LINES:]
        if written:
            report.sections.append(
                (f"{log.name}, its last {len(written)} lines while the test ran", "\n".join(written))
            )


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # Under xdist the main process sees every worker's reports too (`node` set): each worker
    # records its own.
    if report.nodeid.startswith(TIMED) and getattr(report, "node", None) is None:
        RECORDER.phase(report.nodeid, report.when, report.duration, report.outcome)
        if report.failed:
            FAILURES.append(report.nodeid)  # its namespaces keep their evidence when deleted


def pytest_sessionfinish(session: pytest.Session) -> None:
    if RECORDER.tests:
        RECORDER.write(os.environ.get("STATEFLEET_TIER", "e2e"))


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("dist", "no") != "no" and not os.environ.get("PYTEST_XDIST_WORKER"):
        # The main process, before it starts its workers: they inherit where to write the groups.
        os.environ[GROUPS_FILE] = str(Path(tempfile.mkdtemp(prefix="statefleet-xdist-")) / "groups.json")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):
        write_groups(items)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    if config.getvalue("dist") != "loadgroup":
        return None
    return LongestFirstScheduling(config, log)
