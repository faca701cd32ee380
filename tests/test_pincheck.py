"""tests/pins.py: under CI=true a pytest run in which no `pin` test passed fails; with one that
passed, or outside CI, it does not (an inner pytest run with the plugin, in a temporary folder)."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

TESTS = """
import pytest

@pytest.mark.pin
def test_pin():
    assert {pin_passes}

def test_other():
    pass
"""


@pytest.mark.parametrize(
    ("ci", "pin_passes", "code"), [("true", False, 1), ("true", True, 0), ("", False, 1), ("", True, 0)]
)
def test_ci_fails_when_no_pin_passed(pytester, monkeypatch, ci, pin_passes, code):
    monkeypatch.setenv("CI", ci)
    pytester.makepyfile(TESTS.format(pin_passes=pin_passes))
    assert pytester.runpytest_inprocess("-p", "pins", "-k", "other").ret == (1 if ci else 0)  # no pin ran
    assert pytester.runpytest_inprocess("-p", "pins", "-W", "ignore::pytest.PytestUnknownMarkWarning").ret == code
