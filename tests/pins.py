"""A pytest plugin: under CI (CI=true), a run in which no test marked `pin` passed fails.

The pins (test_pins.py on every machine, test_golden.py on the CPUs it has constants for) are
the only tests of *what* training computes; a CI machine on which they were all skipped or
deselected would otherwise pass without checking a number. Under pytest-xdist the controller
sees every worker's test reports, and decides."""

from __future__ import annotations

import os

import pytest


class PinCheck:
    def __init__(self) -> None:
        self.passed = 0

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call" and report.passed and "pin" in report.keywords:
            self.passed += 1

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if os.environ.get("CI") != "true" or hasattr(session.config, "workerinput") or self.passed:
            return
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line("CI: no pin of what training computes passed (tests marked `pin`): the run fails")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(PinCheck(), "pin-check")
