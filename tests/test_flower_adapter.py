"""The Flower adapter (src/incofl/deploy/flower): each behaviour of Flower's that it relies on,
pinned by a test named after it, so that a Flower release that changes one fails here by name
(the gate's reliance on Flower's Fleet router and answers: test_federation_gate.py's
`test_the_gates_routes_are_flowers_fleet_routes_each_with_its_request_and_cap` and
`test_a_push_is_answered_only_once_the_gate_holds_its_budget`); and that no other module of incofl
reaches past Flower's public API. Fast: nothing is started."""

from __future__ import annotations

import ast
import inspect
import os
import time
import tomllib
from pathlib import Path

import pytest

if not os.environ.get("CI"):
    pytest.importorskip("flwr", reason="the flower extra is not installed (pip install -e '.[flower]')")

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "src" / "incofl" / "deploy"
PUBLIC = ("flwr.app", "flwr.serverapp", "flwr.clientapp")  # Flower's public API, as the adapter's docstring names it


def flower_imports(path: Path) -> set[str]:
    """Every Flower module a source file imports: import statements, and `importlib.import_module`
    of a literal name."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module" and node.args:
            if isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                found.add(node.args[0].value)
    return {name for name in found if name == "flwr" or name.startswith("flwr.")}


def test_only_the_adapter_reaches_past_flowers_public_api():
    outside = [p for p in (REPO / "src" / "incofl").rglob("*.py") if DEPLOY / "flower" not in p.parents]
    past = {str(p.relative_to(REPO)): sorted(n for n in flower_imports(p) if not n.startswith(PUBLIC)) for p in outside}
    assert {path: names for path, names in past.items() if names} == {}


def test_the_import_contract_names_every_module_and_package_of_the_deployment_but_the_adapter():
    """The contract keeping the adapter off the deployment's own modules and packages lists them by
    hand (pyproject.toml): every one, so that a new one is covered."""
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (contract,) = [c for c in contracts if c.get("source_modules") == ["incofl.deploy.flower"]]
    modules = {p.stem for p in DEPLOY.glob("*.py") if p.stem != "__init__"}
    packages = {p.parent.name for p in DEPLOY.glob("*/__init__.py") if p.parent.name != "flower"}
    own = {f"incofl.deploy.{name}" for name in modules | packages}
    assert set(contract["forbidden_modules"]) == own


def test_flower_is_the_release_the_adapter_was_written_for():
    from importlib.metadata import version

    from incofl.deploy.flower import RELEASE, mismatch

    assert version("flwr") == RELEASE and mismatch() == ""


def test_flower_supernode_loop_sleeps_3s_after_an_empty_pull_and_half_a_second_between_looks():
    """What flower/node.py cuts short: the loop module's own `time` and `pull_objects` names."""
    import flwr.supernode.start_client_internal as loop

    source = inspect.getsource(loop)
    assert source.count("time.sleep(3)") == 1 and source.count("time.sleep(0.5)") == 2
    assert loop.time.__name__ == "time" and callable(loop.pull_objects)


def test_the_node_adapter_caps_the_node_loops_sleeps_and_keeps_the_rest_of_time():
    from incofl.deploy.flower.node import capped_time

    shim = capped_time(0.05, 0.001)
    start = time.monotonic()
    shim.sleep(3)
    waited = time.monotonic() - start
    for _ in range(10):
        shim.sleep(0.5)
    assert 0.04 < waited < 1 and time.monotonic() - start - waited < 0.3 and shim.monotonic is time.monotonic


def test_flower_pull_objects_takes_its_backoff_and_bounds_as_keywords():
    """QUICK_PULL's keywords, as `pull_objects` (the node's, the ServerApp's inbox) and
    `pull_and_inflate_object_from_tree` (the executor's) take them."""
    from flwr.supercore.inflatable import inflatable_utils

    from incofl.deploy.flower import QUICK_PULL

    for function in (inflatable_utils.pull_objects, inflatable_utils.pull_and_inflate_object_from_tree):
        parameters = inspect.signature(function).parameters
        assert set(QUICK_PULL) | {"max_time"} <= set(parameters), function.__name__


def test_flower_node_builds_its_fleet_client_from_the_connection_modules_name():
    """What flower/node.py replaces to show a site's certificate: the name `FleetHttpClient` in the
    connection module, read when the node connects, whose `verify` takes an SSL context."""
    import flwr.supernode.fleet_http_connection as connection

    assert "FleetHttpClient.from_server_address(" in inspect.getsource(connection)
    assert "verify" in inspect.signature(connection.FleetHttpClient.__init__).parameters


def test_flower_http_grid_keeps_its_runtime_client_node_and_run():
    """The HttpGrid attributes flower/inbox.py makes its Runtime API calls with."""
    from flwr.superlink.grid.http_grid import HttpGrid

    source = inspect.getsource(HttpGrid)
    for attribute in ("self._runtime_client.PullMessages(", "self._runtime_client.PullObject", "self.node = "):
        assert attribute in source, attribute
    assert "self._run: Run | None" in source


def test_flower_superlink_cli_serves_its_app_with_its_modules_uvicorn_run():
    """What flower/link.py replaces to serve the app twice: `uvicorn.run`, called through the CLI
    module's own name `uvicorn`."""
    import importlib

    cli = importlib.import_module("flwr.superlink.cli.flower_superlink")
    assert cli.uvicorn.__name__ == "uvicorn" and "uvicorn.run(" in inspect.getsource(cli)


def test_flower_linkstate_cleans_up_a_finished_run_by_its_id():
    """What flower/link.py's prune calls (`cleanup_run`) on each run `get_run_info` lists as finished."""
    from flwr.superlink.main import create_app

    state = create_app().state.linkstate_factory.state()
    assert callable(state.cleanup_run) and "statuses" in inspect.signature(state.get_run_info).parameters


def test_flower_clientapp_helpers_the_executor_calls_are_there():
    """flower/superexec.py rebuilds flwr-clientapp's loop from its helpers and SuperExec's reading of
    its poll interval."""
    from flwr.supercore.superexec import run_superexec
    from flwr.supernode.runtime import run_clientapp

    for name in ("pull_task_input", "push_message", "push_task_output", "pull_and_inflate_object_from_tree"):
        assert callable(getattr(run_clientapp, name)), name
    assert "pull_and_inflate_object_from_tree(" in inspect.getsource(run_clientapp.pull_task_input)
    assert callable(run_superexec._get_task_poll_interval)


def test_flower_rejects_a_run_no_longer_running_with_403_which_its_node_takes_as_run_not_running():
    """Why a gate refusal of a push loses the reply (docs/testing.md, the race in the gate): Flower's
    HTTP retry raises RunNotRunningException on a 403, and its node drops the reply on it."""
    import flwr.supernode.start_client_internal as loop
    from flwr.supercore.retry import http_retry

    assert "raise RunNotRunningException" in inspect.getsource(http_retry.make_simple_http_retry_invoker)
    assert "except RunNotRunningException" in inspect.getsource(loop._push_messages)
