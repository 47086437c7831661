"""The order test modules are handed to pytest-xdist's workers: the longest first.

``make test`` runs ``--dist loadfile``: a module goes whole to one worker, and a worker takes
the next module when it runs dry. Handed over in collection order, a long module (the
benchmarks' smoke runs, the two-process trainings) that comes late leaves one worker
busy for minutes while the other idles. Longest first bounds that tail by the shortest
modules. The lengths are the ones measured by the last ``make test-durations``
(``durations.json`` beside this file); a module not measured yet is taken for a long one.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

DURATIONS = Path(__file__).with_name("durations.json")


def _module(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def addoption(parser: pytest.Parser) -> None:
    parser.addoption("--record-durations", action="store_true",
                     help=f"write each test module's seconds to {DURATIONS.name}")


def order(items: list[pytest.Item]) -> None:
    """Sorts ``items`` in place, module by module, longest module first; a module's own
    tests keep their order."""
    known: dict[str, float] = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    unmeasured = max(known.values(), default=0.0)
    first_seen: dict[str, int] = {}
    for item in items:
        first_seen.setdefault(_module(item.nodeid), len(first_seen))
    items.sort(key=lambda it: (-known.get(_module(it.nodeid), unmeasured),
                               first_seen[_module(it.nodeid)]))


class Recorder:
    """Sums the setup, call and teardown seconds of each module's tests (on the xdist
    controller, which sees every worker's reports) and writes them at the end."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[_module(report.nodeid)] += report.duration

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        # Merged into what was there: a run of a few modules measures those only.
        known = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
        known.update({k: round(v, 1) for k, v in self.seconds.items()})
        DURATIONS.write_text(json.dumps(dict(sorted(known.items())), indent=1) + "\n")


def configure(config: pytest.Config) -> None:
    is_worker = hasattr(config, "workerinput")
    if config.getoption("--record-durations") and not is_worker:
        config.pluginmanager.register(Recorder(), "record-durations")
