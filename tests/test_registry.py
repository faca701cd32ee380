"""The registry (src/incofl/registry.py): what each component declares matches its class, and a
config is validated without importing the training code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from incofl.config import RunConfig
from incofl.fl.methods.fedpart import PartPlanner
from incofl.fl.methods.personal import KeepPlanner, LagPlanner
from incofl.fl.methods.width.exits import ExitLoss
from incofl.fl.methods.width.levels import WidthPlanner
from incofl.fl.stages.aggregate import Aggregator
from incofl.fl.stages.layout import Layout
from incofl.fl.stages.local import Objective
from incofl.fl.stages.observers import Observer
from incofl.fl.stages.plan import FullPlanner
from incofl.fl.stages.transforms import AverageTransform, UpdateTransform
from incofl.registry import GROUPS, METHODS, WIDTH_LAYOUT, layout_of

REPO = Path(__file__).resolve().parents[1]
STAGES = {"objective": Objective, "aggregator": Aggregator, "pre": UpdateTransform, "post": AverageTransform,
          "observers": Observer, "planner": FullPlanner}  # fmt: skip


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


def test_a_config_is_validated_without_the_training_code():
    """Loading and validating a config, and every run config of its grid (what a workflow's dry
    run and the report commands do), imports neither torch nor the engine."""
    code = ("import sys; from incofl.config import load_experiment; "
            "exp = load_experiment('config/fedlag-cpu.yaml'); "
            "[exp.run_config(d, a, m, s) for d in exp.datasets for a in exp.alphas for m in exp.methods "
            "for s in exp.seeds]; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'torchvision') "
            "or m.startswith(('incofl.fl', 'incofl.data', 'incofl.models.family'))))")  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_the_layout_follows_the_model():
    """Width models are laid out in width levels, under a whole-model method too (uncut: scored
    as width models are); every other model one per group. Both are layouts."""
    assert issubclass(GROUPS.cls, Layout) and issubclass(WIDTH_LAYOUT.cls, Layout)
    assert layout_of(RunConfig(models=["resnet10", "resnet14"])) is GROUPS
    assert layout_of(RunConfig(models=["preresnet18"], method="HeteroFL")) is WIDTH_LAYOUT
    assert layout_of(RunConfig(models=["preresnet18"], method="FedAvg", width_rates=[1.0])) is WIDTH_LAYOUT
