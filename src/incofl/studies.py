"""Studies beside an experiment's grid (config `robustness`, `case_study`; docs/analyses.md).

Each study is a set of runs that differ from the grid's in a setting the grid does not vary:
- robustness (paper Fig. 7): methods x batch sizes (no noise) and x update-noise levels (the
  experiment's batch size), at every data set and alpha of the grid;
- case study (paper Table 1): IID and non-IID partitions x homogeneous (the family's largest
  model for every client) and heterogeneous (the whole family) models, one method.

A run is named by its study and a *point* (its directory under the study, which the workflow's
wildcards carry) and a seed; `study_run` turns a point back into the run's config.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from incofl.errors import key_and_message
from incofl.models.names import FAMILIES
from incofl.registry import METHODS

if TYPE_CHECKING:
    from incofl.config import ExperimentConfig, RunConfig

ROBUSTNESS = re.compile(
    r"(?P<dataset>[a-z0-9]+)/a(?P<alpha>[0-9.e+-]+)/(?P<method>[A-Za-z0-9-]+)/"
    r"b(?P<batch>\d+)-n(?P<noise>[0-9.e+-]+)"
)
CASE = re.compile(r"(?P<dataset>[a-z0-9]+)/(?P<family>[a-z]+)-(?P<iid>iid|noniid)-(?P<models>homo|hetero)")


class Robustness(BaseModel):
    """Accuracy against the local batch size and against noise on client updates (Fig. 7)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    methods: list[str] = Field(
        default_factory=lambda: ["FedAvg", "InCoAvg"], min_length=1, description="the methods the study runs"
    )
    batch_sizes: list[Annotated[int, Field(ge=2)]] = Field(
        default_factory=list, description="local batch sizes, each run without noise"
    )
    noise: list[Annotated[float, Field(ge=0.0)]] = Field(
        default_factory=list, description="update_noise levels, each run at the experiment's batch size"
    )
    seeds: list[Annotated[int, Field(ge=0)]] | None = Field(None, description="unset: the experiment's seeds")


class CaseStudy(BaseModel):
    """IID / non-IID x homogeneous / heterogeneous models, per model family (Table 1)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    families: dict[Literal["resnet", "vit"], dict[str, Any]] = Field(
        default_factory=lambda: {"resnet": {}},
        description=(
            "family -> settings of its runs on top of the experiment's (e.g. clients, rounds; a ViT's "
            "pretrained weights); the models are the family's"
        ),
    )
    method: str = Field("HeteroAvg", description="one federation over every model (with one model: FedAvg)")
    alpha: float = Field(0.5, gt=0.0, description="the non-IID runs' Dirichlet alpha")
    seeds: list[Annotated[int, Field(ge=0)]] | None = Field(None, description="unset: the experiment's seeds")


def study_points(exp: ExperimentConfig) -> dict[str, list[str]]:
    """Every study's points (without seeds), in a stable order."""
    out: dict[str, list[str]] = {}
    rob = exp.robustness
    if rob is not None:
        axes = [(b, 0.0) for b in rob.batch_sizes] + [(exp.batch_size, float(n)) for n in rob.noise]
        out["robustness"] = [
            f"{d}/a{float(a)}/{m}/b{b}-n{n}"
            for d in exp.datasets
            for a in exp.alphas
            for m in rob.methods
            for b, n in dict.fromkeys(axes)
        ]
    case = exp.case_study
    if case is not None:
        out["case_study"] = [
            f"{d}/{f}-{i}-{m}"
            for d in exp.datasets
            for f in case.families
            for i in ("iid", "noniid")
            for m in ("homo", "hetero")
        ]
    return out


def study_seeds(exp: ExperimentConfig, study: str) -> list[int]:
    seeds = getattr(exp, study).seeds
    return exp.seeds if seeds is None else seeds


def study_run(exp: ExperimentConfig, study: str, point: str, seed: int) -> RunConfig:
    """The config of one study run (a point of `study_points`)."""
    if study == "robustness":
        p = ROBUSTNESS.fullmatch(point)
        if p is None:
            raise ValueError(f"robustness: {point!r} is not a robustness point")
        return exp.run_config(
            p["dataset"],
            float(p["alpha"]),
            p["method"],
            seed,
            batch_size=int(p["batch"]),
            update_noise=float(p["noise"]),
        )
    p = CASE.fullmatch(point)
    case = exp.case_study
    if p is None or case is None or p["family"] not in case.families:
        raise ValueError(f"case_study: {point!r} is not a case-study point")
    models = FAMILIES[p["family"]]
    settings = {**case.families[p["family"]], "models": list(models if p["models"] == "hetero" else models[-1:])}
    settings["partition"] = "iid" if p["iid"] == "iid" else "dirichlet"
    return exp.run_config(p["dataset"], case.alpha, case.method, seed, **settings)


def check_studies(exp: ExperimentConfig) -> None:
    """Every study run's config is valid (a ValueError naming the study and its point otherwise)."""
    for method in exp.robustness.methods if exp.robustness else []:
        if method not in METHODS and method not in exp.variants:
            raise ValueError(f"robustness.methods: unknown method {method!r}; known: {', '.join(METHODS)}")
    for study, points in study_points(exp).items():
        for point in points:
            try:
                study_run(exp, study, point, study_seeds(exp, study)[0])
            except ValueError as err:
                raise ValueError(f"{study} ({point}): {key_and_message(err)}") from None
