"""The suite's own machinery: what `make test` relies on to stay fast."""

import pytest


def test_xdist_groups_reach_the_scheduler(request):
    """`--dist loadgroup` sends the tests of one `xdist_group` (those sharing tiny_run, the DVC
    module) to one worker by a suffix pytest-xdist puts on their node ids. pytest 9 ignores that
    suffix (its node ids moved), and every worker then built each shared fixture again."""
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("not run by pytest-xdist with --dist loadgroup (make test does)")
    grouped = [item for item in request.session.items if item.get_closest_marker("xdist_group")]
    if not grouped and request.config.option.markexpr:  # they all train (slow): make test-fast leaves them out
        pytest.skip(f"no test of an xdist_group selected by -m {request.config.option.markexpr!r}")
    assert grouped, "no test carries an xdist_group"
    for item in grouped:
        assert item.nodeid.endswith("@" + item.get_closest_marker("xdist_group").args[0]), item.nodeid
