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


def test_every_test_the_docs_name_exists():
    """docs/federation.md's threat table (and every other page) names the tests that show each defence:
    a name that no longer exists (issue 57 found two) is a claim nothing checks."""
    import ast
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    named = set()
    for page in [root / "README.md", *(root / "docs").glob("*.md")]:
        named |= {(page.name, *m) for m in re.findall(r"(test_\w+\.py)::(test_\w+)", page.read_text())}
    defined: dict[str, set[str]] = {}
    for file in {module for _, module, _ in named}:
        tree = ast.parse((root / "tests" / file).read_text()) if (root / "tests" / file).exists() else None
        defined[file] = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)} if tree else set()
    missing = sorted(f"{page}: {file}::{test}" for page, file, test in named if test not in defined[file])
    assert len(named) > 10 and not missing, missing
