"""The order the suite's test files start in: the longest first.

pytest-xdist hands whole files (``--dist loadfile``) to its workers in collection order (``dev.py test`` turns off
its own reordering, which puts files with many tests first and so left the long single-test end-to-end files to
start last and run alone at the end). Here the files are sorted by the seconds each took in a recorded run,
``tests/durations.json``, longest first (a file not recorded counts as a median one); the tests inside a file keep
their order. ``python3 dev.py test --store-durations`` records a new table (the whole suite: every file's setup,
call and teardown time, summed; a part of the suite updates its own files' entries).
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path

import pytest

DURATIONS = Path(__file__).resolve().parents[1] / "durations.json"


def _file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--store-durations",
        action="store_true",
        help=f"write every test file's total seconds to {DURATIONS.name} (the order the next runs start files in)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not DURATIONS.exists():
        return
    seconds: dict[str, float] = json.loads(DURATIONS.read_text())
    if not seconds:
        return
    unknown = statistics.median(seconds.values())
    first_seen = {name: i for i, name in enumerate(dict.fromkeys(_file_of(item.nodeid) for item in items))}
    items.sort(key=lambda item: (-seconds.get(_file_of(item.nodeid), unknown), first_seen[_file_of(item.nodeid)]))


class _Recorder:
    """Sums every report's duration per test file (on the controller, which receives every worker's reports)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[_file_of(report.nodeid)] += report.duration

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.seconds:  # a part of the suite updates its files' entries and keeps the others
            table: dict[str, float] = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
            table.update((name, round(s, 1)) for name, s in self.seconds.items())
            root = DURATIONS.parents[1]
            table = {name: s for name, s in table.items() if (root / name).exists()}  # not files deleted since
            ordered = sorted(table.items(), key=lambda kv: -kv[1])
            DURATIONS.write_text(json.dumps(dict(ordered), indent=1) + "\n")


def pytest_configure(config: pytest.Config) -> None:
    # only the controller (or a run without workers) sees every file's reports
    if config.getoption("--store-durations") and not hasattr(config, "workerinput"):
        config.pluginmanager.register(_Recorder(), "gymckpt-durations")
