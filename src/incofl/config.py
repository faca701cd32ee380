"""Typed, validated experiment configuration: one place for defaults and ranges.

A config file is an *experiment*: the grid (datasets x alphas x methods x seeds) plus the
settings every run shares. `incofl train` picks one grid point (`--set dataset=... alpha=...`,
default: the first of each list); the workflow expands the whole grid. Errors name the key.

A grid's `methods` are registered methods (`incofl methods`) or *variants*: named settings of
one registered method (`variants: {FedPart-W0: {method: FedPart, method_args: {warmup: 0}}}`),
each a run directory, table row and figure curve of its own, under its name (a run's `label`).
"""

from __future__ import annotations

import os
import re
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator, with_config
from typing_extensions import TypedDict  # pydantic needs this one, not typing's, before Python 3.12

from incofl.errors import ConfigError, key_and_message
from incofl.models.names import (
    EXIT_MODEL,
    EXITS,
    LAYER_GROUP_MODELS,
    MODELS,
    RESNETS,
    VITS,
    WIDTH_LEVELS,
    WIDTH_MODELS,
)
from incofl.registry import METHODS
from incofl.studies import CaseStudy, Robustness, check_studies

DATASETS = ("digits", "synthetic", "cifar10", "cinic10", "fmnist", "svhn")
GRID_KEYS = {"dataset": "datasets", "alpha": "alphas", "method": "methods", "seed": "seeds"}
# What a run is shown under (a method, variant or label name): it names run directories, so the
# workflow's {method} wildcard is this pattern too.
NAME = r"[A-Za-z0-9-]+"


class Affects(Enum):
    """What a run setting changes. Every RunConfig field carries exactly one, in its annotation
    (`min_size: Annotated[int, Affects.PARTITION] = Field(...)`); the lists of settings that
    checks need (run_settings) are read from these tags, never kept by hand."""

    PARTITION = "partition"  # which samples each client holds (and so everything a run computes)
    RESULTS = "results"  # the numbers a run computes and records, given its partition
    # how a run computes them: the same experiment whatever the value, only its last bits differ;
    # exactly what compare's hardware kind accounts for (device, thread count, numerics)
    BITS = "bits"
    NOTHING = "nothing"  # nothing a run computes: paths, cadence, budgets, progress


class Role(Enum):
    """A further role of a run setting, beside what it affects (none, one or several)."""

    # one partition artifact (and the data cache) stands for it: per_method and variants may not
    # override it (every method of a grid trains on the same clients)
    SHARED = "shared"
    EXPORTED = "exported"  # a site's data file holds what it gives (the normalisation): a node checks it
    REPLICATE = "replicate"  # the runs of one experiment differ in it (the seed)
    # the client side computes with it: a federation's node is told it (its schedule:
    # deploy/wire/schedule.py), and no setting without this tag
    CLIENT = "client"
    PATH = "path"  # names a file or folder of the server's: never sent to a node, whose own config names its files


Rounds = list[Annotated[int, Field(ge=1)]]


class Analyses(BaseModel):
    """The paper's analyses as observers of the round (fl/stages/probes.py). Each `*_rounds` list
    names the rounds (1-based, the round just trained) it runs after; an empty one costs nothing."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    cka_rounds: Rounds = Field(
        default_factory=list,
        description=(
            "rounds after which to compute CKA of the trained clients' representations (stage and block outputs) on "
            "one probe batch of test images, the same for every run, and the cosine of their updates (Figs. 1, 2, 10)"
        ),
    )
    probe_samples: int = Field(256, ge=4, description="test images in the CKA probe batch")
    gradient_rounds: Rounds = Field(
        default_factory=list,
        description=(
            "rounds after which to histogram the server's averaged update of every conv and linear weight, before "
            "and after the server's transforms such as InCo's step (Figs. 2c-d, 3)"
        ),
    )
    gradient_bins: int = Field(50, ge=2, description="histogram bins (shared by the before and after histograms)")
    tsne_rounds: Rounds = Field(
        default_factory=list,
        description=(
            "rounds after which to compute a t-SNE of penultimate features of clients trained that round (Fig. 9d-f)"
        ),
    )
    tsne_groups: list[Annotated[int, Field(ge=0)]] = Field(
        default_factory=lambda: [3, 4, 4],
        min_length=1,
        description="t-SNE: one client of each listed model group (paper: one ResNet22, two ResNet26)",
    )
    tsne_classes: list[Annotated[int, Field(ge=0)]] = Field(
        default_factory=lambda: [0, 1, 2, 3, 4, 5],
        min_length=2,
        description="t-SNE: the classes whose test images are mapped",
    )
    tsne_per_class: int = Field(50, ge=2, description="t-SNE: test images per class")

    @property
    def rounds(self) -> set[int]:
        return {*self.cka_rounds, *self.gradient_rounds, *self.tsne_rounds}


class ModelGroups:
    """The model groups a run's settings make (the config's and every side's record: sides.py)."""

    if TYPE_CHECKING:  # the settings read (annotated here only for type checkers: pydantic takes each class's own)
        models: list[str]
        width_rates: list[float] | None
        exits: list[int] | None
        eval_bn: str | None

    @property
    def groups(self) -> int:
        return len(self.levels) if self.levels else len(self.models)

    @property
    def levels(self) -> list[tuple[float, int | None]] | None:
        """Width models: each group's (width rate, deepest exit); None for the other families."""
        if self.models[0] not in WIDTH_LEVELS:
            return None
        rates, exits = WIDTH_LEVELS[self.models[0]]
        rates = self.width_rates or rates
        exits = self.exits or (exits if exits and len(exits) == len(rates) else None)
        deepest = EXITS if self.models[0] == EXIT_MODEL else None
        return [(r, e) for r, e in zip(rates, exits or [deepest] * len(rates), strict=True)]

    @property
    def bn_at_eval(self) -> str:
        """The BN statistics width models are evaluated with (eval_bn, else the model's)."""
        return self.eval_bn or ("static" if self.models[0] == "preresnet18" else "batch")


class ServerGroups(ModelGroups):
    """The model groups, and what the server's transforms derive besides (the config's and the server's record)."""

    if TYPE_CHECKING:
        vit_epoch_scale: str

    @property
    def scales_epochs(self) -> bool:
        """Every method's averaged update divided by local_epochs (the release on ViTs)."""
        return self.vit_epoch_scale == "all" and self.models[0] in VITS


class Settings(ServerGroups, BaseModel):
    """What every run of an experiment shares (overridable per method and with --set)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    # data
    data_dir: Annotated[str | None, Affects.NOTHING, Role.PATH, Role.SHARED] = Field(
        None,
        description=(
            "the folder holding the data sets (e.g. cifar10-jpeg.tar.xz or torchvision's files); "
            "unset: $INCOFL_DATA_DIR, else ./data"
        ),
    )
    cache_dir: Annotated[str, Affects.NOTHING, Role.PATH, Role.SHARED] = Field(
        "resources/data", description="where each data set is cached, decoded, as `<name>.npz`"
    )
    partition: Annotated[
        Literal["dirichlet", "iid", "iid_draw", "shards", "release"], Affects.PARTITION, Role.SHARED
    ] = Field(
        "dirichlet",
        description=(
            "how clients get their data: Dirichlet(alpha) label skew, IID, independent draws of client_samples "
            "(FedPart), HeteroFL's class shards, or the authors' files (release)"
        ),
    )
    client_samples: Annotated[int | None, Affects.PARTITION, Role.SHARED] = Field(
        None,
        ge=1,
        description="partition: iid_draw: images each client draws (FedPart: 500); set exactly with iid_draw",
    )
    shard_classes: Annotated[int, Affects.PARTITION, Role.SHARED] = Field(
        2, ge=1, description="partition: shards: label shards dealt to each client (HeteroFL: 2)"
    )
    partition_seed: Annotated[int, Affects.PARTITION, Role.CLIENT] = Field(
        0, ge=0, description="seed of the partition (apart from the run's seed)"
    )
    partition_file: Annotated[str | None, Affects.NOTHING, Role.PATH, Role.SHARED] = Field(
        None, description="a saved partition artifact (incofl partition); unset: the partition is computed in memory"
    )
    release_partitions: Annotated[str | None, Affects.PARTITION, Role.PATH, Role.SHARED] = Field(
        None, description="partition: release: the folder of the release's fix_distribution/*.npy files"
    )
    fmnist_partition: Annotated[Literal["own", "cifar"], Affects.PARTITION, Role.SHARED] = Field(
        "own", description="cifar: FMNIST clients get CIFAR-10's partition, as the release does"
    )
    min_size: Annotated[int, Affects.PARTITION, Role.SHARED] = Field(
        10, ge=1, description="Dirichlet: the fewest samples a client may get (redrawn below it)"
    )
    max_retries: Annotated[int, Affects.PARTITION, Role.SHARED] = Field(
        1000, ge=1, description="Dirichlet: draws tried before giving up on min_size"
    )
    # the input pipeline (ours by default, the release's as options)
    augment: Annotated[Literal["auto", "none", "crop", "crop_flip", "release"], Affects.RESULTS, Role.CLIENT] = Field(
        "auto",
        description=(
            "training augmentation: auto = crop+flip for CIFAR-10 and CINIC-10, crop for SVHN, none for digits "
            "and FMNIST; release = the authors' choice per data set, with Cutout"
        ),
    )
    cutout: Annotated[int | None, Affects.RESULTS, Role.CLIENT] = Field(
        None, ge=0, description="Cutout square side; unset: as augment says (release: 16), 0: off"
    )
    pad_fill: Annotated[Literal["mean", "black"], Affects.RESULTS, Role.CLIENT] = Field(
        "mean", description="random-crop padding colour (release: black)"
    )
    normalize: Annotated[Literal["stats", "half", "none"], Affects.RESULTS, Role.CLIENT, Role.EXPORTED] = Field(
        "stats", description="training-set channel mean/std, 0.5/0.5, or [0, 1] pixels"
    )
    resize: Annotated[int | None, Affects.RESULTS, Role.CLIENT] = Field(
        None, ge=8, description="ResNets: resize images to this side (release FMNIST: 32)"
    )
    drop_last: Annotated[bool, Affects.RESULTS, Role.CLIENT] = Field(
        False, description="drop incomplete batches: each client's last, and the test set's tail (release)"
    )
    holdout: Annotated[float, Affects.RESULTS, Role.CLIENT] = Field(
        0.0, ge=0.0, lt=1.0, description="each client's share held out for personal evaluation (FedLAG: 0.25)"
    )
    pool_test: Annotated[bool, Affects.PARTITION, Role.SHARED] = Field(
        False, description="pool the train and test sets before partitioning (FedLAG's release); needs holdout"
    )
    # federation
    clients: Annotated[int, Affects.PARTITION, Role.CLIENT] = Field(100, ge=1, description="number of clients K")
    ratio: Annotated[float, Affects.RESULTS] = Field(
        0.1, gt=0.0, le=1.0, description="share of the clients sampled each round"
    )
    models: Annotated[list[str], Affects.RESULTS, Role.CLIENT] = Field(
        default_factory=lambda: list(RESNETS),
        min_length=1,
        description="one model group per model, smallest first, one family; client i is in group i * G // K",
    )
    stem: Annotated[Literal["imagenet", "cifar"], Affects.RESULTS, Role.CLIENT] = Field(
        "imagenet",
        description="ResNet stem: the authors' 7x7/2 convolution with max-pool, or cifar's 3x3/1 without pool",
    )
    pretrained: Annotated[str | None, Affects.RESULTS, Role.PATH] = Field(
        None, description="ViT: a local state-dict file to start from"
    )
    rounds: Annotated[int, Affects.RESULTS, Role.CLIENT] = Field(50, ge=1, description="communication rounds")
    local_epochs: Annotated[int, Affects.RESULTS, Role.CLIENT] = Field(1, ge=1, description="local epochs E per round")
    batch_size: Annotated[int, Affects.RESULTS, Role.CLIENT] = Field(64, ge=2, description="local batch size")
    optimizer: Annotated[Literal["adam", "sgd"], Affects.RESULTS, Role.CLIENT] = Field(
        "adam", description="local optimizer (fresh each round)"
    )
    lr: Annotated[float, Affects.RESULTS, Role.CLIENT] = Field(1e-3, gt=0.0, description="local learning rate")
    momentum: Annotated[float, Affects.RESULTS, Role.CLIENT] = Field(0.0, ge=0.0, lt=1.0, description="SGD momentum")
    weight_decay: Annotated[float, Affects.RESULTS, Role.CLIENT] = Field(
        0.0, ge=0.0, description="weight decay of the local optimizer"
    )
    bn_stats: Annotated[Literal["averaged", "local"], Affects.RESULTS, Role.CLIENT] = Field(
        "averaged",
        description="BatchNorm running statistics averaged like weights, or kept by each client (FedPart's release)",
    )
    # width and depth splitting (HeteroFL, FedRolex, ScaleFL)
    width_rates: Annotated[list[Annotated[float, Field(gt=0.0, le=1.0)]] | None, Affects.RESULTS, Role.CLIENT] = Field(
        None,
        description=(
            "width models: each rate is a model group; unset: the model's levels (preresnet18: HeteroFL's "
            "1, 1/2, 1/4, 1/8, 1/16; resnet110: ScaleFL's 0.7, 0.7, 0.75, 1)"
        ),
    )
    exits: Annotated[list[Annotated[int, Field(ge=1, le=EXITS)]] | None, Affects.RESULTS, Role.CLIENT] = Field(
        None, description="resnet110: each group's deepest exit (unset: 1, 2, 3, 4 with the default rates)"
    )
    rate_assignment: Annotated[Literal["fixed", "dynamic"], Affects.RESULTS] = Field(
        "fixed",
        description="fixed: a client keeps its level; dynamic: every sampled client draws its level each round",
    )
    model_scale: Annotated[float, Affects.RESULTS, Role.CLIENT] = Field(
        1.0,
        gt=0.0,
        le=1.0,
        description=(
            "width models and ResNets: every layer's channels x this (CPU-sized runs; HeteroFL's hidden_size)"
        ),
    )
    eval_bn: Annotated[Literal["static", "batch"] | None, Affects.RESULTS, Role.CLIENT] = Field(
        None,
        description=(
            "BN at evaluation of width models: static (HeteroFL: statistics of training data gathered before each "
            "evaluation) or batch (the test batch's: FedRolex, ScaleFL); unset: static for preresnet18, batch for "
            "resnet110"
        ),
    )
    static_bn_samples: Annotated[int | None, Affects.RESULTS, Role.CLIENT] = Field(
        None, ge=1, description="static BN: training images passed (unset: all the clients')"
    )
    # robustness (paper Fig. 7)
    update_noise: Annotated[float, Affects.RESULTS] = Field(
        0.0,
        ge=0.0,
        description="Gaussian noise on each client update before aggregation, std = this x that update tensor's std",
    )
    analyses: Annotated[Analyses, Affects.RESULTS] = Field(
        default_factory=Analyses, description="the paper's analyses, each after the rounds it lists"
    )
    vit_epoch_scale: Annotated[Literal["inco", "all"], Affects.RESULTS] = Field(
        "inco",
        description=(
            "ViTs: divide client updates by local_epochs for InCo's official variant only, or for every method "
            "(release)"
        ),
    )
    method_args: Annotated[dict[str, Any], Affects.RESULTS, Role.CLIENT] = Field(
        default_factory=dict,
        description="the method's hyper-parameters (`incofl methods` lists each method's, with defaults)",
    )
    label: Annotated[str | None, Affects.RESULTS] = Field(
        None,
        pattern=f"^{NAME}$",
        description="the name a run is shown under in tables and figures (unset: the method)",
    )
    # evaluation, checkpoints, runtime
    eval_every: Annotated[int, Affects.RESULTS] = Field(
        1, ge=1, description="evaluate every group's model on the test set every N rounds"
    )
    eval_last: Annotated[int, Affects.RESULTS] = Field(
        10, ge=0, description="also evaluate every one of the last N rounds (last10_acc reads them)"
    )
    eval_batch_size: Annotated[int, Affects.RESULTS, Role.CLIENT] = Field(
        1000, ge=1, description="batch size of evaluation"
    )
    checkpoint_every: Annotated[int, Affects.NOTHING, Role.CLIENT] = Field(
        5, ge=1, description="write ckpt.pt every N rounds"
    )
    keep_checkpoint: Annotated[bool, Affects.NOTHING] = Field(
        False, description="keep ckpt.pt (final weights) and clientstate/ after a finished run"
    )
    client_memory_mb: Annotated[int, Affects.NOTHING, Role.CLIENT] = Field(
        2048,
        ge=0,
        description=(
            "memory for what clients keep across rounds (SCAFFOLD's c_i, MOON's previous models, local entries), "
            "in MiB; beyond it the least recently used go to <out>/clientstate/ (0: every one on disk)"
        ),
    )
    device: Annotated[Literal["auto", "cpu", "cuda"], Affects.BITS, Role.CLIENT] = Field(
        "auto", description="auto: cuda where there is one; cuda without a GPU is refused before any job"
    )
    numerics: Annotated[Literal["auto", "native", "portable"], Affects.BITS, Role.CLIENT] = Field(
        "native",
        description=(
            "CPU kernels: native (the fastest for this CPU; bits differ between CPU kinds), portable (the same "
            "bits on every x86-64 CPU with AVX2, for one torch build and thread count; 2-4x slower; CPU only), or "
            "auto (portable where it can hold, else native, saying why in one line; a run records which)"
        ),
    )
    threads: Annotated[int | None, Affects.BITS, Role.CLIENT] = Field(
        None,
        ge=1,
        description=(
            "torch threads of a training job, and the CPUs the workflow asks for per training job (unset: torch's "
            "default in incofl train, 1 in the workflow)"
        ),
    )
    channels_last: Annotated[bool, Affects.RESULTS, Role.CLIENT] = Field(
        False, description="channels-last memory format (GPU)"
    )
    bf16: Annotated[bool, Affects.RESULTS, Role.CLIENT] = Field(False, description="bf16 autocast (GPU)")
    trainer: Annotated[Literal["serial", "batched"], Affects.RESULTS, Role.CLIENT] = Field(
        "serial", description="batched: a model group's clients side by side (torch.func.vmap)"
    )
    cuda_graphs: Annotated[bool, Affects.RESULTS, Role.CLIENT] = Field(
        False,
        description=(
            "a client's full-batch local steps replayed as one CUDA graph (with trainer: batched, the model "
            "group's clients together); GPU only, plain cross-entropy methods"
        ),
    )
    progress: Annotated[bool, Affects.NOTHING] = Field(True, description="a progress bar on stderr")

    @field_validator("models")
    @classmethod
    def _known_models(cls, models: list[str]) -> list[str]:
        return check_models(models)

    @model_validator(mode="after")
    def _width_levels(self) -> Settings:
        width = self.models[0] in WIDTH_LEVELS
        keys = ("width_rates", "exits", "eval_bn", "static_bn_samples")
        if not width and any(getattr(self, k) for k in keys):
            key = next(k for k in keys if getattr(self, k))
            raise ValueError(f"{key}: only width models ({', '.join(WIDTH_MODELS)}) are cut in width and depth")
        if self.model_scale != 1.0 and self.models[0] not in (*LAYER_GROUP_MODELS, *WIDTH_MODELS):
            raise ValueError(
                f"model_scale: thins ResNets and width models ({', '.join(WIDTH_MODELS)}), not {self.models[0]}"
            )
        if width and len(self.models) > 1:
            raise ValueError(f"models: {self.models[0]} is cut in width: one architecture, its groups `width_rates`")
        if self.exits is not None and self.models[0] != EXIT_MODEL:
            raise ValueError("exits: only resnet110 has early exits")
        if self.exits is not None and len(self.exits) != len(self.width_rates or WIDTH_LEVELS["resnet110"][0]):
            raise ValueError(f"exits: one deepest exit per width rate ({len(self.exits)} given)")
        if self.eval_bn == "static" and self.models[0] == "resnet110":
            raise ValueError("eval_bn: resnet110 keeps no BN statistics (ScaleFL: batch statistics); use batch")
        return self

    @model_validator(mode="after")
    def _portable_on_cpu(self) -> Settings:
        if self.numerics == "portable" and self.device == "cuda":
            raise ValueError("numerics: portable pins CPU kernels; a cuda run cannot have them (numerics: native)")
        if self.cuda_graphs and (self.device == "cpu" or self.numerics == "portable"):
            raise ValueError("cuda_graphs: CUDA graphs replay on a GPU; this run computes on the CPU (device: cuda)")
        return self

    @model_validator(mode="after")
    def _analysis_rounds(self) -> Settings:
        late = sorted(r for r in self.analyses.rounds if r > self.rounds)
        if late:
            key = next(
                k for k in ("cka_rounds", "gradient_rounds", "tsne_rounds") if late[0] in getattr(self.analyses, k)
            )
            raise ValueError(f"analyses.{key}: round {late[0]} is past the run's last round ({self.rounds})")
        groups = [g for g in self.analyses.tsne_groups if g >= self.groups]
        if self.analyses.tsne_rounds and groups:
            raise ValueError(f"analyses.tsne_groups: group {groups[0]} does not exist ({self.groups} model groups)")
        return self

    @model_validator(mode="after")
    def _enough_clients(self) -> Settings:
        if self.clients < self.groups:
            key = "width_rates" if self.width_rates else "clients"
            raise ValueError(f"{key}: {self.clients} clients cannot fill {self.groups} model groups")
        return self

    @model_validator(mode="after")
    def _pool_test(self) -> Settings:
        if self.pool_test and not self.holdout:
            raise ValueError("pool_test: needs holdout > 0 (with the test set pooled, accuracy is measured per client)")
        if self.pool_test and self.partition == "release":
            raise ValueError("pool_test: the release's partition files index the training set alone")
        return self

    @model_validator(mode="after")
    def _client_samples(self) -> Settings:
        if (self.partition == "iid_draw") != (self.client_samples is not None):
            raise ValueError("client_samples: set it exactly when partition is iid_draw (images each client draws)")
        return self

    @model_validator(mode="after")
    def _release_partitions(self) -> Settings:
        if self.partition == "release" and not self.partition_file and not self.release_partitions:
            raise ValueError("release_partitions: needed with partition: release (the folder of the .npy files)")
        return self


def check_models(models: list[str]) -> list[str]:
    """Known models of one family, one group each, smallest first."""
    for name in models:
        if name not in MODELS:
            raise ValueError(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    if len({m[:3] for m in models}) > 1:
        raise ValueError("all models must come from one family (resnet*, vit_d* or cnn20)")
    _unique(models)
    if models != sorted(models, key=MODELS.index):
        raise ValueError(f"one group per model, smallest first: {', '.join(sorted(models, key=MODELS.index))}")
    return models


def _unique(values: list[Any]) -> list[Any]:
    """A grid list without repeats (a repeated seed would train the same run twice)."""
    seen = [v for i, v in enumerate(values) if v in values[:i]]
    if seen:
        raise ValueError(f"{seen[0]!r} is listed twice")
    return values


def check_method(name: str) -> str:
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; known: {', '.join(METHODS)}")
    return name


def _check_label(label: str | None, method: str) -> None:
    """A label must not pass a run off as another registered method."""
    if label is not None and label != method and label in METHODS:
        raise ValueError(f"label: {label!r} is a registered method, not a name for runs of {method}")


def _check_variant(name: str, spec: dict[str, Any], variants: dict[str, Any]) -> None:
    """A variant's name and `method` (its settings are checked merged, with every other method's)."""
    where = f"variants.{name}"
    if not re.fullmatch(NAME, name):
        raise ValueError(f"{where}: a variant name is letters, digits and '-' only (it names run directories)")
    if name in METHODS:
        raise ValueError(f"{where}: {name!r} is a registered method; give the variant a name of its own")
    if "method" not in spec:
        raise ValueError(f"{where}.method: missing (the registered method the variant sets up)")
    base = spec["method"]
    if isinstance(base, str) and base in variants:
        raise ValueError(f"{where}.method: {base!r} is a variant; a variant's method must be a registered method")
    if not isinstance(base, str) or base not in METHODS:
        raise ValueError(f"{where}.method: unknown method {base!r}; known: {', '.join(METHODS)}")
    if "label" in spec:
        raise ValueError(f"{where}.label: a variant's runs are shown under its name, {name!r}")


def check_dataset(name: str) -> str:
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; known: {', '.join(DATASETS)}")
    return name


@with_config(ConfigDict(extra="forbid"))
class Resources(TypedDict, total=False):
    """Resources of each training job (Snakemake `resources:`, sbatch options on SLURM).
    What is left out comes from the profile's default-resources."""

    gpu: Annotated[int, Field(ge=0, description="GPUs per job (sbatch --gpus)")]
    gpu_model: Annotated[str, Field(description="e.g. a100 (sbatch --gpus=a100:N)")]
    runtime: Annotated[int, Field(ge=1, description="minutes for the first try; a retry gets attempt x runtime")]
    mem_mb: Annotated[int, Field(ge=1, description="memory per training run in MB (sbatch --mem)")]
    runs_per_gpu: Annotated[
        int,
        Field(
            ge=1,
            description=(
                "training runs per SLURM job, side by side on its `gpu` GPUs (unset: 1): the job asks for `gpu` once "
                "and for N x mem_mb and N x threads CPUs"
            ),
        ),
    ]


class RunConfig(Settings):
    """One training run: a grid point plus its settings."""

    dataset: Annotated[str, Affects.PARTITION, Role.CLIENT] = Field("digits", description="the run's data set")
    alpha: Annotated[float, Affects.PARTITION] = Field(0.5, gt=0.0, description="the run's Dirichlet alpha")
    method: Annotated[str, Affects.RESULTS, Role.CLIENT] = Field(
        "InCoAvg", description="a registered method (a variant's run: its method, and `label` its name)"
    )
    seed: Annotated[int, Affects.RESULTS, Role.CLIENT, Role.REPLICATE] = Field(
        0, ge=0, description="the run's seed: initialisation, client sampling, batches"
    )

    @property
    def name(self) -> str:
        """What the run is shown under: summary.json's `method`, its table row and figure curve."""
        return self.label or self.method

    @model_validator(mode="after")
    def _method_args(self) -> RunConfig:
        METHODS[self.method].parse_args(self.method_args)  # a ValueError naming method_args.<key>
        METHODS[self.method].check(self)
        _check_label(self.label, self.method)
        return self

    @field_validator("dataset")
    @classmethod
    def _dataset(cls, v: str) -> str:
        return check_dataset(v)

    @field_validator("method")
    @classmethod
    def _method(cls, v: str) -> str:
        return check_method(v)


def run_settings(*tags: Affects | Role) -> frozenset[str]:
    """The run settings (RunConfig's fields) tagged with any of `tags`."""
    return frozenset(name for name, field in RunConfig.model_fields.items() if any(t in field.metadata for t in tags))


SHARED_SETTINGS = run_settings(Role.SHARED)


class ExperimentConfig(Settings):
    """A config file: the grid, shared settings, per-method overrides, variants and job resources."""

    datasets: list[str] = Field(default_factory=lambda: ["digits"], min_length=1, description="grid: data sets")
    alphas: list[Annotated[float, Field(gt=0.0)]] = Field(
        default_factory=lambda: [0.5], min_length=1, description="grid: Dirichlet alphas"
    )
    methods: list[str] = Field(
        default_factory=lambda: ["InCoAvg"],
        min_length=1,
        description="grid: registered methods (`incofl methods`) or names of variants",
    )
    seeds: list[Annotated[int, Field(ge=0)]] = Field(
        default_factory=lambda: [0], min_length=1, description="grid: seeds"
    )
    per_method: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="settings for one method, e.g. MOON: {rounds: 100} (not data or partition settings)",
    )
    per_dataset: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="settings for one data set, e.g. fmnist: {resize: 32}, applied before per_method's",
    )
    variants: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description=(
            "named settings of a registered method, listed in `methods` by name, e.g. "
            "FedPart-W0: {method: FedPart, method_args: {warmup: 0}} (its settings override per_method's)"
        ),
    )
    table_metric: Literal["final_acc", "best_acc", "last10_acc"] = Field(
        "final_acc", description="the statistic of Table 2 and the figures' bars"
    )
    resources: Resources = Field(
        default_factory=Resources,
        description="each training job's resources in the workflow (SLURM: sbatch options); left out: the profile's",
    )
    robustness: Robustness | None = Field(None, description="a robustness study beside the grid (paper Fig. 7)")
    case_study: CaseStudy | None = Field(None, description="a case study beside the grid (paper Table 1)")

    @field_validator("datasets")
    @classmethod
    def _datasets(cls, v: list[str]) -> list[str]:
        return _unique([check_dataset(d) for d in v])

    @field_validator("alphas", "seeds", "methods")
    @classmethod
    def _no_repeats(cls, v: list[Any]) -> list[Any]:
        return _unique(v)

    @model_validator(mode="after")
    def _methods_and_variants(self) -> ExperimentConfig:
        """Variants are named settings of a registered method; `methods` lists either; no override
        changes the data or partition, and `label` names the runs of one method only."""
        for name, spec in self.variants.items():
            _check_variant(name, spec, self.variants)
        for method in self.methods:
            if method not in METHODS and method not in self.variants:
                variants = f"; variants: {', '.join(self.variants)}" if self.variants else ""
                raise ValueError(f"methods: unknown method {method!r}; known: {', '.join(METHODS)}{variants}")
        for method in self.per_method:
            if method in self.variants:
                raise ValueError(f"per_method.{method}: a variant; give its settings under variants.{method}")
        for section in ("per_method", "variants"):
            for name, overrides in getattr(self, section).items():
                shared = sorted(SHARED_SETTINGS & set(overrides))
                if shared:
                    raise ValueError(
                        f"{section}.{name}.{shared[0]}: data and partition settings are shared "
                        "by all methods, set them at the top level"
                    )
        for section in ("per_method", "per_dataset"):
            for name, overrides in getattr(self, section).items():
                if "label" in overrides:
                    raise ValueError(f"{section}.{name}.label: name other settings of a method as a variant")
        if self.label is not None:
            if len(self.methods) > 1 or self.methods[0] in self.variants:
                raise ValueError(
                    "label: names the runs of one registered method (a run's config file); "
                    "name several settings of a method under variants"
                )
            _check_label(self.label, self.methods[0])
        return self

    @model_validator(mode="after")
    def _per_dataset_and_method(self) -> ExperimentConfig:
        """Every data set x method's merged settings and method_args are valid before any job starts."""
        for dataset in self.per_dataset:
            if dataset not in DATASETS:
                raise ValueError(f"per_dataset.{dataset}: unknown dataset; known: {', '.join(DATASETS)}")
        datasets = list(dict.fromkeys([*self.datasets, *self.per_dataset]))
        for method in dict.fromkeys([*self.methods, *self.per_method, *self.variants]):
            base = self.method_of(method)
            for dataset in datasets:
                try:
                    settings = Settings.model_validate(self.settings_for(method, dataset, validate=False))
                    METHODS[check_method(base)].parse_args(settings.method_args)
                    METHODS[base].check(settings)
                except ValueError as err:  # pydantic's ValidationError too
                    problem = key_and_message(err)
                    where = self._override_key(method, dataset, problem.split(":")[0].split(".")[0])
                    raise ValueError(f"{where}.{problem}" if where else problem) from None
        return self

    @model_validator(mode="after")
    def _studies(self) -> ExperimentConfig:
        check_studies(self)
        return self

    def _override_key(self, method: str, dataset: str, key: str) -> str:
        """Where a bad merged setting came from: variants.<v>, per_method.<m>, per_dataset.<d>, or
        the top level (for a variant or per_method entry outside the grid: that entry)."""
        if method in self.variants:
            if key in self.variants[method]:
                return f"variants.{method}"
            unlisted = "" if method in self.methods else f"variants.{method}"
            method = self.method_of(method)
        else:
            unlisted = "" if method in self.methods else f"per_method.{method}"
        if key in self.per_method.get(method, {}):
            return f"per_method.{method}"
        if key in self.per_dataset.get(dataset, {}):
            return f"per_dataset.{dataset}"
        return unlisted

    def method_of(self, name: str) -> str:
        """The registered method a name of `methods` runs: a variant's `method`, else the name."""
        return self.variants[name]["method"] if name in self.variants else name

    @property
    def names(self) -> list[str]:
        """What the grid's runs are shown under (their summary.json's `method`), in `methods` order."""
        return [m if m in self.variants else self.label or m for m in self.methods]

    def settings_for(
        self, method: str, dataset: str | None = None, extra: dict[str, Any] | None = None, validate: bool = True
    ) -> dict[str, Any]:
        """The shared settings with the data set's, the method's (per_method), then a variant's
        overrides (and `extra`) applied. `method` may name a variant: its settings get its name as `label`."""
        base = self.method_of(method)
        shared = self.model_dump(include=set(Settings.model_fields))
        by_dataset, by_method = self.per_dataset.get(dataset or "", {}), self.per_method.get(base, {})
        by_variant = {k: v for k, v in self.variants.get(method, {}).items() if k != "method"}
        if method in self.variants:
            by_variant["label"] = method
        merged = with_overrides({**shared, **by_dataset, **by_method, **by_variant}, extra or {})
        return Settings.model_validate(merged).model_dump() if validate else merged

    def run_config(self, dataset: str, alpha: float, method: str, seed: int, **overrides: Any) -> RunConfig:
        """One grid point's run; a variant's runs its registered method, labelled with its name."""
        settings = self.settings_for(method, dataset, overrides)
        return RunConfig(dataset=dataset, alpha=alpha, method=self.method_of(method), seed=seed, **settings)


def _one_line(err: ValidationError, source: str) -> ConfigError:
    return ConfigError(f"{source}: {key_and_message(err)}")


def with_overrides(settings: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """`settings` with `overrides` applied in order: `key` replaces a setting; a dotted key
    (`method_args.mu`) sets one key of a mapping setting and keeps its other keys."""
    out = dict(settings)
    for dotted, value in overrides.items():
        *heads, last = dotted.split(".")
        node = out
        for depth, head in enumerate(heads, start=1):
            inner = node.get(head, {})
            if not isinstance(inner, dict):
                raise ConfigError(f"--set {dotted}: {'.'.join(heads[:depth])} is not a mapping")
            node[head] = dict(inner)  # a copy: the experiment's own mapping is left as it is
            node = node[head]
        node[last] = value
    return out


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """`key=value` strings, values parsed as YAML (so 0.5 is a float and [a, b] a list); a key
    may be dotted (`method_args.mu=0.1`: see with_overrides)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not all(key.strip().split(".")):
            raise ConfigError(f"--set {pair!r}: expected key=value (a dotted key for a nested one)")
        try:
            out[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError:
            raise ConfigError(f"--set {pair!r}: the value is not valid YAML") from None
    return out


# Without a config file: the defaults, with the embedded experiment's federation (config/config.yaml),
# since the default data set, digits (1,437 training images), cannot give 100 clients 10 images each.
BUILT_IN: dict[str, Any] = {"clients": 20, "ratio": 0.25}


def load_experiment(path: str | os.PathLike | None) -> ExperimentConfig:
    """Read and validate a config file (None: the defaults with BUILT_IN's federation)."""
    raw = dict(BUILT_IN) if path is None else read_config_file(path)
    return validate_experiment(raw, str(path or "config"))


YTE = "__use_yte__"  # Snakemake's switch for YTE templates, which evaluate Python expressions


def read_config_file(path: str | os.PathLike) -> dict[str, Any]:
    """A config file's mapping, read as plain YAML (configs are data: a YTE template is refused,
    never evaluated)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise ConfigError(f"{path}: not valid YAML{where}: {getattr(err, 'problem', None) or err}") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: cannot read the config ({err.__class__.__name__})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of keys to values")
    if YTE in raw:
        raise ConfigError(f"{path}: {YTE}: configs are data, YTE templates (Python expressions) are refused")
    return raw


def validate_experiment(raw: dict[str, Any], source: str = "config") -> ExperimentConfig:
    try:
        return ExperimentConfig.model_validate(raw)
    except ValidationError as err:
        raise _one_line(err, source) from None


def load_run_config(path: str | os.PathLike | None, overrides: dict[str, Any] | None = None) -> RunConfig:
    """One run: the file's settings, with dataset/alpha/method/seed from overrides or the first grid value."""
    overrides = dict(overrides or {})
    experiment = load_experiment(path)
    point = {key: overrides.pop(key, getattr(experiment, plural)[0]) for key, plural in GRID_KEYS.items()}
    for key in overrides:
        head = key.split(".")[0]
        if head in GRID_KEYS:  # a dotted one: the plain keys were taken above
            raise ConfigError(f"--set {key}: {head} is not a mapping")
        if head in ExperimentConfig.model_fields and head not in Settings.model_fields:
            raise ConfigError(f"--set: {key}: a key of the experiment (its config file), not a setting of one run")
        if head not in Settings.model_fields:
            raise ConfigError(f"--set: {key}: unknown key")
    try:
        return experiment.run_config(**point, **overrides)
    except ValidationError as err:
        raise _one_line(err, "--set") from None
