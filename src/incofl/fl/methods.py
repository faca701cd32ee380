"""The method registry: a name -> (local objective, server rule, InCo options, base method).

Adding a method is one entry here (plus, for a new local objective, one small class).
`base` is the method an InCo row is compared with in tables.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from incofl.fl.client import Objective
from incofl.fl.inco import InCoOptions, find_pairs
from incofl.fl.objectives import FedNova, FedProx, Moon, Scaffold
from incofl.fl.server import GroupWise, InCo, ServerRule


@dataclass(frozen=True)
class Method:
    name: str
    objective: type[Objective]
    server: str  # "groupwise" | "heteroavg" | "inco"
    base: str | None = None
    inco: dict[str, Any] = field(default_factory=dict)  # InCoOptions overrides (ablations, variants)
    source: str = ""
    weighted: bool = False  # default of method_args `weighted`: sample-weighted server averaging

    def split_args(self, args: dict[str, Any]) -> tuple[dict[str, Any], InCoOptions | None, bool]:
        """Split config `method_args` into objective parameters, InCo options and `weighted`;
        a name this method does not take is a ValueError naming it."""
        inco_keys = {f.name for f in fields(InCoOptions)} if self.server == "inco" else set()
        allowed = set(self.objective.params) | inco_keys | {"weighted"}
        for key in args:
            if key not in allowed:
                raise ValueError(f"{key}: not a parameter of {self.name} (takes: {', '.join(sorted(allowed))})")
        objective_args = {k: v for k, v in args.items() if k in self.objective.params}
        inco = InCoOptions(**{**self.inco, **{k: v for k, v in args.items() if k in inco_keys}}) if inco_keys else None
        return objective_args, inco, bool(args.get("weighted", self.weighted))

    def model_kwargs(self, args: dict[str, Any]) -> dict[str, Any]:
        """The objective's model-building parameters (MOON's projection_dim) for `build_model`."""
        merged = {**self.objective.params, **self.split_args(args)[0]}
        return {name: merged[name] for name in self.objective.model_args}

    def build(
        self, state_names: list[str], args: dict[str, Any], local_epochs: int = 1
    ) -> tuple[Objective, ServerRule]:
        """The method's local objective and server rule, configured by `args`."""
        objective_args, inco, weighted = self.split_args(args)
        if inco is not None:
            rule: ServerRule = InCo(find_pairs(state_names), inco, weighted, local_epochs)
        else:
            rule = GroupWise(weighted) if self.server == "groupwise" else ServerRule(weighted)
        return self.objective(**objective_args), rule


_PAPER = "Chan et al., ICLR 2024"
_GROUPWISE = "; groupwise as in " + _PAPER
_PROX = "Li et al., MLSys 2020 (FedProx)"
_SCAFFOLD = "Karimireddy et al., ICML 2020 (SCAFFOLD, option II)"  # plain mean over S, its Algorithm 1
_NOVA = "Wang et al., NeurIPS 2020 (FedNova)"  # sample-weighted: p_i = n_i / sum n (METHODS.md 3)
_MOON = "Li, He & Song, CVPR 2021 (MOON)"
_REGISTRY = [
    Method("FedAvg", Objective, "groupwise", source="McMahan et al. 2017" + _GROUPWISE),
    Method("FedProx", FedProx, "groupwise", source=_PROX + _GROUPWISE),
    Method("SCAFFOLD", Scaffold, "groupwise", source=_SCAFFOLD + _GROUPWISE),
    Method("FedNova", FedNova, "groupwise", weighted=True, source=_NOVA + _GROUPWISE),
    Method("MOON", Moon, "groupwise", source=_MOON + _GROUPWISE),
    Method("HeteroAvg", Objective, "heteroavg", source=_PAPER),
    Method("InCoAvg", Objective, "inco", base="FedAvg", source=_PAPER),
    Method("InCoProx", FedProx, "inco", base="FedProx", source=_PAPER + "; " + _PROX),
    Method("InCoScaffold", Scaffold, "inco", base="SCAFFOLD", source=_PAPER + "; " + _SCAFFOLD),
    Method("InCoNova", FedNova, "inco", base="FedNova", weighted=True, source=_PAPER + "; " + _NOVA),
    Method("InCoMOON", Moon, "inco", base="MOON", source=_PAPER + "; " + _MOON),
    Method("InCoAvg-noNorm", Objective, "inco", base="FedAvg", inco={"normalize": False}, source=_PAPER + ", Fig. 8"),
    Method("InCoAvg-noOpt", Objective, "inco", base="FedAvg", inco={"optimize": False}, source=_PAPER + ", Fig. 8"),
    Method(
        "InCoAvg-noNormOpt",
        Objective,
        "inco",
        base="FedAvg",
        inco={"normalize": False, "optimize": False},
        source=_PAPER + ", Fig. 8",
    ),
    Method(
        "InCoAvg-paper", Objective, "inco", base="FedAvg", inco={"variant": "paper"}, source=_PAPER + ", Algorithm 1"
    ),
    Method(
        "InCoAvg-projection",
        Objective,
        "inco",
        base="FedAvg",
        inco={"variant": "paper", "mode": "projection"},
        source=_PAPER + ", Theorem 3.1",
    ),
]
METHODS: dict[str, Method] = {m.name: m for m in _REGISTRY}


def register(method: Method) -> Method:
    """Add a method (used by modules that define new local objectives)."""
    METHODS[method.name] = method
    return method


def base_of(name: str) -> str | None:
    return METHODS[name].base
