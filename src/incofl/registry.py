"""The method registry: every method's name -> its `Method` (incofl.spec: the components of its
round's stages, what they take and what they need).

Each method family is a package under `incofl/fl/methods/` whose torch-free `spec.py` holds its
parameter models and, in `METHODS`, its registry entries; they are collected here at import, the
families in the order of their names and each family's methods in its own order, so adding a
method edits nothing outside its folder (docs/add-a-method.md). `register` adds a method defined
in a Python session. Nothing here imports training code: a config, a workflow's dry run and the
report commands are checked without importing torch.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from typing import TYPE_CHECKING

from incofl.spec import GROUPS, WIDTH_LAYOUT, Component, Method

if TYPE_CHECKING:
    from incofl.config import ModelGroups

__all__ = ["METHODS", "Component", "Method", "base_of", "families", "layout_of", "register"]
# Found by name, as each spec is: a plugin point, not a layer this module sits on (the import
# contracts in pyproject.toml keep the specs and the packages above them torch-free)
FAMILIES = "incofl.fl.methods"


def families() -> list[str]:
    """The modules of the method families' specs: `incofl.fl.methods.<family>.spec`, by family name."""
    found = pkgutil.iter_modules(importlib.import_module(FAMILIES).__path__, FAMILIES + ".")
    packages = sorted(info.name for info in found if info.ispkg)
    return [f"{name}.spec" for name in packages if importlib.util.find_spec(f"{name}.spec") is not None]


def _collect() -> dict[str, Method]:
    methods: dict[str, Method] = {}
    home: dict[str, str] = {}
    for module in families():
        for method in importlib.import_module(module).METHODS:
            if method.name in methods:
                raise ValueError(f"{module}: method {method.name!r} is already registered by {home[method.name]}")
            methods[method.name], home[method.name] = method, module
    return methods


METHODS: dict[str, Method] = _collect()


def register(method: Method) -> Method:
    """Add a method (used by modules that define new components in a Python session)."""
    METHODS[method.name] = method
    return method


def layout_of(settings: ModelGroups) -> Component:
    """The layout of a run's models, which follows its model: a width model (preresnet18,
    resnet110) in width levels, under a whole-model method too (uncut then: Method.check refuses
    cut levels), so that it is scored as a width model is (its BN rule at evaluation); every other
    model one per model group."""
    return WIDTH_LAYOUT if settings.levels else GROUPS


def base_of(name: str) -> str | None:
    return METHODS[name].base
