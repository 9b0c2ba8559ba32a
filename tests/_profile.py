"""``--profile-suite``: where the suite's time goes, per test file and per fixture.

Sums each test's setup + call + teardown by file, and each fixture's own setup time by
fixture name (a session fixture once, a function fixture at every use), and prints both at
the end of the run; under pytest-xdist the controller sums the test reports the workers
send it, and each worker's fixture sums are sent to it and added up there."""

from __future__ import annotations

import time
from collections import Counter

import pytest


def pytest_addoption(parser) -> None:
    parser.addoption(
        "--profile-suite",
        action="store_true",
        help="print the seconds spent per test file and per fixture setup at the end",
    )


class _Profile:
    def __init__(self) -> None:
        self.files: Counter = Counter()
        self.fixtures: Counter = Counter()
        self.fixture_calls: Counter = Counter()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_fixture_setup(self, fixturedef, request):
        start = time.perf_counter()
        yield
        name = fixturedef.argname
        if fixturedef.scope != "function":
            name = f"{name} ({fixturedef.scope})"
        self.fixtures[name] += time.perf_counter() - start
        self.fixture_calls[name] += 1

    def pytest_runtest_logreport(self, report) -> None:
        self.files[report.nodeid.split("::")[0]] += report.duration

    def pytest_sessionfinish(self, session) -> None:
        output = getattr(session.config, "workeroutput", None)
        if output is not None:  # an xdist worker: hand the fixtures' sums to the controller
            output["ngraph_profile"] = (dict(self.fixtures), dict(self.fixture_calls))

    def pytest_testnodedown(self, node, error) -> None:
        # the controller gets every worker's test reports itself (its own sums per file
        # are whole: the workers' added to them counted each second twice); the fixtures
        # are set up in the workers alone
        sums = getattr(node, "workeroutput", {}).get("ngraph_profile")
        if sums:
            self.fixtures.update(sums[0])
            self.fixture_calls.update(sums[1])

    def pytest_terminal_summary(self, terminalreporter) -> None:
        write = terminalreporter.write_line
        terminalreporter.section("seconds per test file (setup + call + teardown)")
        for name, seconds in self.files.most_common(25):
            write(f"{seconds:8.1f}  {name}")
        write(f"{sum(self.files.values()):8.1f}  all {len(self.files)} files")
        terminalreporter.section("seconds per fixture setup (own time)")
        for name, seconds in self.fixtures.most_common(25):
            write(f"{seconds:8.1f}  {self.fixture_calls[name]:4d}x  {name}")


def pytest_configure(config) -> None:
    if config.getoption("--profile-suite"):
        config.pluginmanager.register(_Profile(), "ngraph-profile")
