"""Where the e2e tests spend their time: every `wait_until` and every fixture phase, by test,
written per pytest process and merged into one breakdown (`python -m e2e.timing`).

The waits are classified by what they waited for (the label each `wait_until` is given), so a
new test that waits on something slow shows up in the report under a phase, not as a lump."""

from __future__ import annotations

import argparse
import json
import os
import re
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

LOG_DIR = Path(__file__).resolve().parent.parent / ".testbed" / "logs"
# The e2e run's share of `make test` (35 min, less lint, unit tests and a warm test bed's start):
# the budget every change is measured against.
E2E_BUDGET_SECONDS = 30 * 60
MAKE_TEST_BUDGET_SECONDS = 35 * 60
# A fresh machine builds the test bed first (Kubernetes, images: about half an hour).
FRESH_MAKE_TEST_BUDGET_SECONDS = 60 * 60
# A build longer than this in the same run means the machine was fresh, not merely a changed image.
FRESH_BUILD_SECONDS = 10 * 60
TESTBED_BUILD = LOG_DIR / "testbed-build.json"

# First match wins: what a wait's label says -> the phase it belongs to.
PHASES: list[tuple[str, re.Pattern[str]]] = [
    ("namespace deletion", re.compile(r"namespace .* deleted|namespaces .* gone")),
    ("operator start", re.compile(r"liveness endpoint|operator watching")),
    ("certificates issued and taken up", re.compile(r"certificate", re.I)),
    ("Secrets read again (each minute)", re.compile(r"password")),
    ("failover and switchover", re.compile(r"primary|Recloning|rejoin|frozen|settled", re.I)),
    ("instance ready", re.compile(r"Ready|formed|answering|answers|streaming|\binstances\b|nodes in one")),
    ("backup and restore Jobs", re.compile(r"Completed|Failed|verified|uploading|checking|backup|restore")),
    ("rollout steps", re.compile(r"rollout phase|pods at|updated|native|replaced|back\b")),
    ("pods and Jobs finishing", re.compile(r"finish|gone|deleted|garbage|finalized", re.I)),
]


def phase_of(what: str) -> str:
    return next((phase for phase, pattern in PHASES if pattern.search(what)), "other conditions")


@dataclass
class TestTiming:
    nodeid: str
    worker: str
    setup: float = 0.0
    call: float = 0.0
    teardown: float = 0.0
    outcome: str = "passed"
    waits: list[tuple[str, float]] = field(default_factory=list)  # (label, seconds)


class Recorder:
    """One per pytest process; `wait_until` reports to it."""

    def __init__(self) -> None:
        self.worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        self.tests: dict[str, TestTiming] = {}
        self.current: TestTiming | None = None
        self.started = time.time()

    def begin(self, nodeid: str) -> None:
        self.current = self.tests.setdefault(nodeid, TestTiming(nodeid, self.worker))

    def wait(self, what: str, seconds: float) -> None:
        if self.current is not None:
            self.current.waits.append((what, round(seconds, 2)))

    def phase(self, nodeid: str, when: str, seconds: float, outcome: str) -> None:
        timing = self.tests.setdefault(nodeid, TestTiming(nodeid, self.worker))
        setattr(timing, when, round(getattr(timing, when) + seconds, 2))
        if outcome != "passed":
            timing.outcome = outcome

    def write(self, tier: str) -> Path:
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        path = LOG_DIR / f"e2e-timing-{tier}-{self.worker}.json"
        body = {
            "tier": tier,
            "worker": self.worker,
            "started": self.started,
            "ended": time.time(),
            "tests": [asdict(t) for t in self.tests.values()],
        }
        path.write_text(json.dumps(body, indent=1))
        return path


RECORDER = Recorder()


def load(paths: list[Path]) -> tuple[list[dict], float]:
    """Every test of the reports, and the wall time from the first start to the last end."""
    bodies = [json.loads(p.read_text()) for p in paths]
    if not bodies:
        return [], 0.0
    wall = max(b["ended"] for b in bodies) - min(b["started"] for b in bodies)
    return [t for b in bodies for t in b["tests"]], wall


def breakdown(tests: list[dict]) -> dict[str, float]:
    """Seconds per phase over all tests; what is not a named wait is 'working'."""
    phases: dict[str, float] = defaultdict(float)
    for test in tests:
        waited = 0.0
        for what, seconds in test["waits"]:
            phases[phase_of(what)] += seconds
            waited += seconds
        total = test["setup"] + test["call"] + test["teardown"]
        phases["between waits (requests, clients, sleeps)"] += max(0.0, total - waited)
    return dict(sorted(phases.items(), key=lambda item: -item[1]))


def report(paths: list[Path], top: int) -> str:
    tests, wall = load(paths)
    lines = []
    total = sum(t["setup"] + t["call"] + t["teardown"] for t in tests)
    lines.append(f"{len(tests)} tests, {total:.0f} s of test time, {wall:.0f} s wall")
    lines.append("where the time goes (seconds, all tests):")
    for phase, seconds in breakdown(tests).items():
        lines.append(f"  {seconds:8.0f}  {phase}")
    lines.append(f"slowest {top} tests (setup / call / teardown, seconds):")
    ranked = sorted(tests, key=lambda t: -(t["setup"] + t["call"] + t["teardown"]))
    for test in ranked[:top]:
        spent = test["setup"] + test["call"] + test["teardown"]
        lines.append(
            f"  {spent:6.0f}  {test['setup']:5.0f} {test['call']:6.0f} {test['teardown']:5.0f}  "
            f"{test['worker']:>5}  {test['nodeid']}"
        )
    failed = [t["nodeid"] for t in tests if t["outcome"] != "passed"]
    if failed:
        lines.append("not passed: " + ", ".join(failed))
    return "\n".join(lines)


def save_durations(paths: list[Path]) -> None:
    """What the parallel workers' scheduler expects of each test (e2e/scheduling.py): the
    measured times, merged over the ones recorded before (a test not run keeps its figure)."""
    from e2e.scheduling import DURATIONS, read_durations

    tests, _ = load(paths)
    durations = read_durations()
    for test in tests:
        durations[test["nodeid"]] = round(test["setup"] + test["call"] + test["teardown"], 1)
    DURATIONS.write_text(json.dumps(dict(sorted(durations.items())), indent=1) + "\n")


def budget_line(label: str, seconds: float, budget: float) -> str:
    share = seconds / budget
    verdict = "within" if seconds <= budget else "OVER"
    return f"{label}: {seconds / 60:.1f} min of a {budget / 60:.0f} min budget ({share:.0%}, {verdict})"


def make_test_budget(started: float, build: dict | None) -> tuple[float, str]:
    """The budget `make test` started at `started` is held to, and why: the fresh-machine one
    when the test bed was built from source during this run."""
    if build and build["finished_at"] >= started and build["seconds"] >= FRESH_BUILD_SECONDS:
        return (
            FRESH_MAKE_TEST_BUDGET_SECONDS,
            f"fresh machine: the test bed built in {build['seconds'] / 60:.1f} min",
        )
    return MAKE_TEST_BUDGET_SECONDS, "warm machine"


def read_testbed_build() -> dict | None:
    try:
        return json.loads(TESTBED_BUILD.read_text())
    except (OSError, ValueError):
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description="the e2e time breakdown and the budget")
    parser.add_argument("--tier", default="*", help="controller, e2e, serial (default: all)")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--make-test-started", type=float, help="epoch seconds `make test` started")
    parser.add_argument(
        "--save-durations", action="store_true", help="write each test's time to e2e/durations.json"
    )
    args = parser.parse_args()
    paths = sorted(LOG_DIR.glob(f"e2e-timing-{args.tier}-*.json"))
    if args.save_durations:
        save_durations(paths)
    print(report(paths, args.top))
    _, wall = load(paths)
    print(budget_line("e2e wall time", wall, E2E_BUDGET_SECONDS))
    if args.make_test_started:
        budget, why = make_test_budget(args.make_test_started, read_testbed_build())
        print(budget_line(f"make test so far ({why})", time.time() - args.make_test_started, budget))


if __name__ == "__main__":
    main()
