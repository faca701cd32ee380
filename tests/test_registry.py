"""The registry (src/incofl/registry.py): the methods it collects from the families' spec modules,
what each component declares matches its class, parameters are combined without a clash (and
renamed ones migrated), and a config is validated without importing the training code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from workflows import package_with_family

from incofl.config import RunConfig, load_experiment
from incofl.fl.engine.checkpoint import check_same, semantic_config
from incofl.fl.methods.fedpart.plan import PartPlanner
from incofl.fl.methods.inco.spec import INCO
from incofl.fl.methods.personal.plan import KeepPlanner, LagPlanner
from incofl.fl.methods.personal.spec import LAG
from incofl.fl.methods.width.exits import ExitLoss
from incofl.fl.methods.width.levels import WidthPlanner
from incofl.fl.methods.width.spec import ROLEX, SlicedParams
from incofl.fl.stages.aggregate import Aggregator
from incofl.fl.stages.layout import Layout
from incofl.fl.stages.objective import Objective
from incofl.fl.stages.observers import Observer
from incofl.fl.stages.plan import FullPlanner
from incofl.fl.stages.transforms import AverageTransform, UpdateTransform
from incofl.params import Params
from incofl.registry import GROUPS, METHODS, WIDTH_LAYOUT, families, layout_of
from incofl.spec import Component, Method

REPO = Path(__file__).resolve().parents[1]
STAGES = {
    "objective": Objective,
    "aggregator": Aggregator,
    "pre": UpdateTransform,
    "post": AverageTransform,
    "observers": Observer,
    "planner": FullPlanner,
}


def _components(stage: str):
    """Every registered method's component(s) of a stage, each once."""
    picked = (getattr(m, stage) for m in METHODS.values())
    values = {c for v in picked for c in (v if isinstance(v, tuple) else (v,))}
    return sorted(values, key=lambda c: c.name)


@pytest.mark.parametrize("stage", STAGES)
def test_every_component_is_a_class_of_its_stage(stage):
    for component in _components(stage):
        assert issubclass(component.cls, STAGES[stage]), component.code


def test_what_a_component_declares_is_what_its_class_is():
    """The flags config validation reads without importing the code agree with the classes."""
    for planner in _components("planner"):
        assert planner.personal == issubclass(planner.cls, (KeepPlanner, LagPlanner)), planner.code
        assert planner.layer_groups == issubclass(planner.cls, PartPlanner), planner.code
        assert planner.width == issubclass(planner.cls, WidthPlanner), planner.code
    for objective in _components("objective"):
        assert objective.exits == issubclass(objective.cls, ExitLoss), objective.code


def test_each_method_builds_the_parameters_its_components_read():
    """Every method's typed method_args carry InCo's and each component's fields (spot checks of
    the combination), with the method's own defaults."""
    assert {"mu", "anchor", "variant", "clip", "weighted"} <= set(METHODS["InCoProx"].params.model_fields)
    assert METHODS["FedNova"].parse_args({}).weighted and not METHODS["FedAvg"].parse_args({}).weighted
    assert {"grad_clip", "rolling", "weighting", "class_rows"} <= set(METHODS["FedRolex"].params.model_fields)
    assert METHODS["FedRolex"].parse_args({}).rolling and not METHODS["HeteroFL"].parse_args({}).rolling


def _spec_or_above(module: str) -> bool:
    """A method family's spec, or a package on its import path."""
    parts = module.split(".")
    return parts[:2] == ["incofl", "fl"] and (len(parts) <= 4 or (len(parts) == 5 and parts[4] == "spec"))


def test_a_config_is_validated_without_the_training_code():
    """Loading and validating a config, and every run config of its grid (what a workflow's dry
    run and the report commands do), imports neither torch nor the engine: of incofl.fl, only
    the families' specs and the packages above them."""
    code = (
        "import sys; from incofl.config import load_experiment; "
        "exp = load_experiment('config/fedlag-cpu.yaml'); "
        "[exp.run_config(d, a, m, s) for d in exp.datasets for a in exp.alphas for m in exp.methods "
        "for s in exp.seeds]; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'torchvision', 'timm') "
        "or m.startswith(('incofl.fl', 'incofl.data', 'incofl.models.family'))))"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    loaded = eval(proc.stdout)  # a printed list of module names
    assert {m for m in loaded if not _spec_or_above(m)} == set(), loaded
    assert set(families()) <= set(loaded)


def test_methods_are_collected_from_every_family_in_order():
    """Every family package under fl/methods/ has a spec, every registered method comes from
    one (in family-name order, each family's own order), and no name is registered twice."""
    folders = sorted(p.name for p in (REPO / "src/incofl/fl/methods").iterdir() if (p / "__init__.py").is_file())
    assert families() == [f"incofl.fl.methods.{name}.spec" for name in folders]
    collected = [m.name for f in families() for m in __import__(f, fromlist=["METHODS"]).METHODS]
    assert collected == list(METHODS)[: len(collected)] and len(set(collected)) == len(collected)
    assert {"FedAvg", "SCAFFOLD", "InCoNova", "InCoPart", "FedLAG", "InCoScaleFL"} <= set(collected)


def test_a_new_family_folder_is_collected(tmp_path):
    """Adding a method is adding a folder: a package with one more family folder registers its
    method, last (families by name), without importing torch."""
    env = {**os.environ, "PYTHONPATH": str(package_with_family(tmp_path))}
    code = "import sys; from incofl.registry import METHODS; print(list(METHODS)[-1], 'torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["FedAvgNew", "False"]


class _Variant(Params):
    variant: str = "x"


def test_two_components_declaring_one_parameter_are_refused():
    """One name cannot mean two things (InCo's `variant` and FedLAG's old one): the error names
    the method, the parameter and both components; a model derived from another's is no clash."""
    clash = Method("Clash", planner=Component("incofl.fl.stages.plan:FullPlanner", _Variant), post=(INCO,))
    with pytest.raises(ValueError, match="^Clash: parameter 'variant' is declared by both InCoStep and FullPlanner$"):
        _ = clash.params
    derived = Method(
        "Derived", aggregator=ROLEX, pre=(Component("incofl.fl.stages.transforms:UpdateTransform", SlicedParams),)
    )
    assert {"class_rows", "weighting"} <= set(derived.params.model_fields)
    assert all(method.params for method in METHODS.values())  # every registered method combines


def test_fedlags_renamed_parameter_is_migrated():
    """FedLAG's `variant: intended | released` is `broadcast: true | false`: the old name still
    parses, and the committed FedLAG-released runs (their summary.json holds the old name) are
    the same runs as config/fedlag-cpu.yaml (the new name) makes."""
    assert LAG.renamed and METHODS["FedLAG"].parse_args({"variant": "released"}).broadcast is False
    assert METHODS["FedLAG"].parse_args({"variant": "intended"}) == METHODS["FedLAG"].parse_args({})
    with pytest.raises(ValueError, match="method_args.variant: not a parameter of FedLAG"):
        METHODS["FedLAG"].parse_args({"variant": "other"})
    exp = load_experiment(REPO / "config" / "fedlag-cpu.yaml")
    for path in sorted((REPO / "results" / "runs-fedlag").glob("*/a*/FedLAG-released/s*/summary.json")):
        theirs = json.loads(path.read_text())["config"]
        assert theirs["method_args"] == {"variant": "released"}
        ours = exp.run_config(theirs["dataset"], theirs["alpha"], "FedLAG-released", theirs["seed"])
        assert ours.method_args == {"broadcast": False}
        # as a resume or a rerun into the run's folder compares them (checkpoint.check_same)
        assert semantic_config(theirs)["method_args"] == semantic_config(ours.model_dump())["method_args"]
    check_same(Path("ckpt.pt"), {**ours.model_dump(), "method_args": {"variant": "released"}}, ours.model_dump(), "")


def test_the_layout_follows_the_model():
    """Width models are laid out in width levels, under a whole-model method too (uncut: scored
    as width models are); every other model one per group. Both are layouts."""
    assert issubclass(GROUPS.cls, Layout) and issubclass(WIDTH_LAYOUT.cls, Layout)
    assert layout_of(RunConfig(models=["resnet10", "resnet14"])) is GROUPS
    assert layout_of(RunConfig(models=["preresnet18"], method="HeteroFL")) is WIDTH_LAYOUT
    assert layout_of(RunConfig(models=["preresnet18"], method="FedAvg", width_rates=[1.0])) is WIDTH_LAYOUT
