"""The config (validated before any job is planned), the experiment grid, the paths every
rule shares, and the functions the rules call (the rules themselves are in the other .smk
files: Snakemake's linter wants rules and functions apart).

Which jobs rerun after a config change is left to Snakemake's params trigger: the prepare,
partition and run_config jobs hold in `params:` exactly the settings their output depends
on, and a training job reads its run's config file, which run_config rewrites only when the
run's settings change. So a changed setting redoes the runs it affects and nothing else, and
a grown grid only adds jobs."""

import functools
import json
import os
import re
import shlex
import sys
from pathlib import Path

import jsonschema
import yaml
from snakemake.exceptions import WorkflowError
from snakemake.utils import update_config, validate

from incofl.codehash import code_hash
from incofl.config import NAME, ConfigError, read_config_file, validate_experiment
from incofl.data.release import ReleasePartitionError, release_file
from incofl.numerics import NumericsError, decide, notice
from incofl.studies import CASE, ROBUSTNESS, study_points, study_run, study_seeds

# Settings one partition artifact stands for (incofl.config.SHARED_SETTINGS) are refused in
# per_method and variants by validate_experiment: `incofl` refuses them too.
# Settings the train rule sets itself (from the job), so they are not part of a run's config file.
JOB_SETTINGS = {"threads", "progress", "partition_file"}


def _yaml_values(value):
    if isinstance(value, str):
        return yaml.safe_load(value)
    if isinstance(value, list):
        return [_yaml_values(v) for v in value]
    if isinstance(value, dict):
        return {k: _yaml_values(v) for k, v in value.items()}
    return value


def refuse(message):
    """A bad config: one line on stderr and exit code 2, before any job (as `incofl` does)."""
    print(f"snakemake: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def read_experiment(config):
    """The experiment file (`--config experiment=FILE`, default config/config.yaml) read by
    incofl as plain YAML, then the other `--config` items over it. Configs are data: Snakemake's
    own `--configfile` reader evaluates YTE templates (Python) before this code runs, so it is
    refused, and a file asking for YTE is refused (docs/reliability.md, Security)."""
    if workflow.config_settings.configfiles:
        refuse("--configfile: give the experiment as --config experiment=FILE (read as plain YAML; Snakemake "
               "evaluates YTE templates in a --configfile)")  # fmt: skip
    if sum(arg in ("--config", "-C") or arg.startswith("--config=") for arg in sys.argv) > 1:
        refuse("--config given twice: Snakemake keeps only the last; give every KEY=VALUE after one --config")
    path = str(config.pop("experiment", "config/config.yaml"))
    try:
        raw = read_config_file(path)
    except ConfigError as err:
        refuse(str(err))
    # Snakemake reads the items of list and dict --config values as strings
    # (`--config seeds=[0,1]` gives ['0', '1']): read them as YAML, as in a config file.
    overrides = {k: _yaml_values(v) if isinstance(v, (list, dict)) else v for k, v in config.items()}
    update_config(raw, overrides)
    config.clear()
    config.update(raw)
    return f"{path} with --config" if overrides else path


def load_config(config):
    """The JSON schema (keys, types, enums, ranges), then the pydantic model (cross-field
    checks: clients per model group, method_args, per_method, variants). Either way a bad
    config stops the workflow before any job, with one line naming the key and exit code 2."""
    source = read_experiment(config)
    try:
        validate(config, "../schemas/config.schema.yaml")
    except WorkflowError as err:
        cause = err.__context__  # the jsonschema error validate() caught
        if not isinstance(cause, jsonschema.ValidationError):
            raise
        key = ".".join(str(p) for p in cause.absolute_path) or "config"
        refuse(f"{source}: {key}: {cause.message}")
    try:
        exp = validate_experiment(config, source)
    except ConfigError as err:
        refuse(str(err))
    for dataset in exp.datasets:  # the release's partition files are there before any job
        settings = exp.settings_for(exp.methods[0], dataset)
        for alpha in exp.alphas if settings["partition"] == "release" else []:
            try:
                path = release_file(settings["release_partitions"], dataset, settings["clients"], alpha)
            except ReleasePartitionError as err:
                refuse(f"{source}: {err}")
            if not path.is_file():
                refuse(f"{source}: release_partitions: {path}: release partition file not found")
    for dataset, overrides in exp.per_dataset.items():
        if "cache_dir" in overrides:
            refuse(f"{source}: per_dataset.{dataset}.cache_dir: the data cache is shared, set it at the top level")
    return exp


EXP = load_config(config)
# The training code's content hash (incofl.codehash), a param of every training job: a change
# to the engine, models, data, methods or config code reruns the runs; a comment or report change does not.
TRAINING_CODE = code_hash()

# Jobs run the `incofl` of the Python environment Snakemake runs in, activated or not
# (`.venv/bin/snakemake`, `make run`, DVC); SLURM jobs inherit this PATH (sbatch --export=ALL).
# Declared with `envvars:`, as Snakemake's linter asks of a variable the workflow touches (an
# executor that exports declared variables to its jobs passes on this value).
envvars:
    "PATH",


os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"

# Every rule's software: the project's pinned environment, `incofl` included (pip `-e .`), for
# `snakemake --sdm conda`; without it jobs use the environment Snakemake runs in (above).
# Relative to workflow/rules/, where every rule that runs something is.
SOFTWARE = "../../environment.yml"

# --- paths -------------------------------------------------------------------------------
CONFIG = "results/config.yaml"  # the validated config with every default filled in (report jobs)
DATA = f"{EXP.cache_dir}/{{dataset}}.npz"
PARTITION = "results/partitions/{dataset}/a{alpha}-k{clients}-p{pseed}.npz"
RUNS_ROOT = "results/runs"
RUN = f"{RUNS_ROOT}/{{dataset}}/a{{alpha}}/{{method}}/s{{seed}}"  # {method}: a method or variant name
RUNS = expand(f"{RUN}/summary.json", dataset=EXP.datasets, alpha=EXP.alphas, method=EXP.methods, seed=EXP.seeds)
TABLES = [f"results/tables/table2.{ext}" for ext in ("md", "tex", "csv", "html")]
FIGURES = "results/figures"
METRICS = "results/metrics.json"
FEDPART_TABLE = "results/tables/fedpart.md"  # FedPart's poster table, when the grid has partial methods
PLOT_DATA = "results/plots/curves.csv"  # seed-mean accuracy per round, for `dvc plots`
CELLS = [(d, a) for d in EXP.datasets for a in EXP.alphas]  # one curve figure per data set x alpha
# resources.runs_per_gpu N > 1: N consecutive runs of RUNS per SLURM job, each such batch
# recorded (which runs, SLURM job, GPUs) by a train_batch job; see runs_per_gpu below.
RUNS_PER_GPU = EXP.resources.get("runs_per_gpu", 1)
BATCH = "results/logs/train/batches/b{batch}.txt"
ANALYSIS = "results/analysis"  # one folder per analysis (analysis.smk)
STUDIES_ROOT = "results/studies"  # the runs of the studies beside the grid (incofl.studies)
STUDY_RUN = f"{STUDIES_ROOT}/{{study}}/{{point}}/s{{seed}}"
STUDY_POINTS = study_points(EXP)
# The analyses (analysis.smk) of the grid's runs, each with what it needs: an `analyses` setting
# listing rounds (any method's: per_method may turn one on for some), or an InCo method in the grid.
GRID_ANALYSES = {"cka": "cka_rounds", "gradients": "gradient_rounds", "tsne": "tsne_rounds",
                 "theta_beta": None, "groups": None}  # fmt: skip
STUDIES = ("robustness", "case_study")

wildcard_constraints:
    dataset=r"[a-z0-9]+",
    alpha=r"[0-9.e+-]+",
    method=NAME,
    seed=r"\d+",
    clients=r"\d+",
    pseed=r"\d+",
    batch=r"\d+",
    study="|".join(STUDIES),
    point="|".join(re.sub(r"\?P<\w+>", "", p.pattern) for p in (ROBUSTNESS, CASE)),


def figures(ext):
    return [f"{FIGURES}/curves_{d}_a{a}.{ext}" for d, a in CELLS] + [f"{FIGURES}/ablation.{ext}"]


def partial_in_grid():
    """Whether a method of the grid trains partial rounds (FedPart and its kin, or their variants)."""
    from incofl.registry import METHODS

    return any(METHODS[EXP.method_of(m)].partial for m in EXP.methods)


def all_targets():
    fedpart = [FEDPART_TABLE] if partial_in_grid() else []
    return [*TABLES, METRICS, *figures("png"), *figures("pdf"), PLOT_DATA, *fedpart, *batches(), *analyses()]


# --- analyses (analysis.smk) ---------------------------------------------------------------


def analyses():
    """The analysis folders this config asks for: none without `analyses` rounds or a study."""
    from incofl.registry import METHODS

    settings = [EXP.settings_for(m, d)["analyses"] for m in EXP.methods for d in EXP.datasets]
    asked = {name for name, key in GRID_ANALYSES.items() if key and any(a[key] for a in settings)}
    if not asked and not STUDY_POINTS:
        return []
    inco = any(METHODS[EXP.method_of(m)].post for m in EXP.methods)
    asked |= {"groups"} | ({"theta_beta"} if inco else set())
    return [f"{ANALYSIS}/{name}" for name in [*GRID_ANALYSES, *STUDY_POINTS] if name in asked | set(STUDY_POINTS)]


def study_config(wc):
    return study_run(EXP, wc.study, wc.point, int(wc.seed))


def analysis_runs(analysis):
    """What an analysis reads: a study's runs, or the grid's."""
    if analysis in STUDIES:
        seeds = study_seeds(EXP, analysis)
        return expand(f"{STUDY_RUN}/summary.json", study=analysis, point=STUDY_POINTS[analysis], seed=seeds)
    return RUNS


def analysis_command(analysis, input):
    """`incofl analysis <name>` over its runs: a study's folder, or the grid's (restricted to the
    grid by the experiment config)."""
    if analysis in STUDIES:
        return f"incofl analysis {analysis} --runs {STUDIES_ROOT}/{analysis}"
    return f"incofl analysis {analysis} --config {input.config} --runs {runs_root(None, input)}"


def cli_sets(settings):
    """`incofl ... --set` arguments: key=value with the value as YAML reads it back
    (a plain string where that is unambiguous, else JSON), shell-quoted."""
    def value(v):
        return v if isinstance(v, str) and v and yaml.safe_load(v) == v else json.dumps(v)

    return " ".join(shlex.quote(f"{k}={value(v)}") for k, v in settings.items())


def as_yaml(data):
    return yaml.safe_dump(data, sort_keys=False)


# --- data and one run --------------------------------------------------------------------
def data_settings(wc):
    return {"dataset": wc.dataset, "cache_dir": EXP.cache_dir, "data_dir": dataset_settings(wc.dataset)["data_dir"]}


def dataset_settings(dataset):
    """The settings of a data set's runs that all its methods share (per_dataset applied)."""
    return EXP.settings_for(EXP.methods[0], dataset)


def partition_settings(wc):
    """The settings the partition job's artifact depends on. `pool_test` (partitions over train +
    test) only when on, with the `holdout` it needs to be a valid config: a config without it
    keeps the params, so the partitions made before it are not redone."""
    shared = dataset_settings(wc.dataset)
    keys = ("partition", "client_samples", "min_size", "max_retries", "release_partitions", "fmnist_partition")
    pooled = ("pool_test", "holdout") if shared["pool_test"] else ()
    shards = ("shard_classes",) if shared["partition"] == "shards" else ()  # likewise, only when used
    return {**data_settings(wc), "alpha": float(wc.alpha), "clients": int(wc.clients),
            "partition_seed": int(wc.pseed), **{k: shared[k] for k in (*keys, *pooled, *shards)}}


def partition_inputs(wc):
    """The data the partition job reads: the data set's, and CIFAR-10's labels for an FMNIST
    partition drawn as the release draws it (`fmnist_partition: cifar`)."""
    shared = dataset_settings(wc.dataset)
    borrowed = wc.dataset == "fmnist" and shared["fmnist_partition"] == "cifar" and shared["partition"] != "release"
    return [DATA.format(dataset=wc.dataset)] + ([DATA.format(dataset="cifar10")] if borrowed else [])


@functools.cache
def _run_config(dataset, alpha, method, seed):
    return EXP.run_config(dataset, float(alpha), method, int(seed))


def run_config(wc):
    """The run's settings: the shared ones with its method's per_method overrides (and a
    variant's settings, for a variant's name: the run's method is then the variant's, and its
    label the variant's name)."""
    return _run_config(wc.dataset, wc.alpha, wc.method, wc.seed)


def run_file(wc):
    """The run's config file: a one-point experiment with the run's settings (per_method and a
    variant's applied: `methods: [<its method>]` and `label: <the variant>`), minus what the
    train job sets itself. Without a label, none is written (the file a method's run had before
    labels: such a run is not redone)."""
    return config_file(run_config(wc))


def config_file(run):
    """A run config as a one-point experiment file (run_file; the studies' runs too), with the
    numerics this machine computes it with (`auto` decided: the file and the run record which)."""
    cfg = run.model_dump(exclude=JOB_SETTINGS if run.label else JOB_SETTINGS | {"label"})
    cfg["numerics"] = decided_numerics(cfg["numerics"], cfg["device"])
    point = {plural: [cfg.pop(key)] for key, plural in
             (("dataset", "datasets"), ("alpha", "alphas"), ("method", "methods"), ("seed", "seeds"))}
    return {**point, **cfg}


@functools.cache
def decided_numerics(requested, device):
    """incofl.numerics.decide, asked once per setting, before any job; where `auto` cannot be
    portable here, its one-line notice says why and what the verdict will be."""
    try:
        numerics, why = decide(requested, device)
    except NumericsError as err:
        refuse(str(err))
    if why:
        print(notice(why), file=sys.stderr)
    return numerics


def partition_of(wc):
    cfg = run_config(wc)
    return PARTITION.format(dataset=wc.dataset, alpha=wc.alpha, clients=cfg.clients, pseed=cfg.partition_seed)


def run_threads(wc):
    return run_config(wc).threads or 1


def train_resources():
    """The config's `resources` for training jobs; what it leaves out comes from the
    profile's default-resources. A retried job (e.g. past its SLURM time limit) gets
    attempt x runtime and resumes from its checkpoint."""
    res = dict(EXP.resources)
    res.pop("runs_per_gpu", None)
    if "runtime" in res:
        base = res["runtime"]
        res["runtime"] = lambda wc, attempt: base * attempt
    if RUNS_PER_GPU > 1:
        # A group job sums integer resources over its runs (so N x mem_mb and N x cpus_per_task)
        # but takes a string resource once: the GPUs as sbatch --gres, shared by the N runs.
        model = res.pop("gpu_model", None)
        gpus = res.pop("gpu", 1 if model else 0)
        if gpus:
            res["gres"] = ":".join(["gpu", *([model] if model else []), str(gpus)])
    return res


# --- several runs per SLURM job (resources.runs_per_gpu; docs/slurm.md) -------------------
# Snakemake submits a job group as ONE SLURM job (mem_mb and cpus_per_task summed over the jobs
# that run side by side, runtime their maximum, a string resource once). Inside it the SLURM
# plugin (2.8.0) runs the group's jobs with `snakemake --executor slurm-jobstep --jobs 1 --mode
# remote`, which forms groups again from the Snakefile and config only: --group-components is
# not passed on and profiles are not read in that mode, so groups made by --group-components
# fall apart there into one-run groups run one after another (measured; snakemake-executor-
# plugin-slurm issue #469). So the N runs of a batch are tied into one connected group by a
# job that reads their summaries (train_batch): one SLURM job, and inside it one srun step
# whose Snakemake runs the N training jobs side by side. Group "gpu", or none (N = 1).
TRAIN_GROUP = "gpu" if RUNS_PER_GPU > 1 else None


def batches():
    """The batch records: one per N consecutive runs of RUNS (none for one run per job)."""
    n = -(-len(RUNS) // RUNS_PER_GPU) if RUNS_PER_GPU > 1 else 0
    return expand(BATCH, batch=range(n))


def batch_runs(wc):
    """The runs of batch number `wc.batch`."""
    first = int(wc.batch) * RUNS_PER_GPU
    return RUNS[first : first + RUNS_PER_GPU]


# --- report ------------------------------------------------------------------------------
def runs_root(wc, input):
    """RUNS_ROOT for the table and figures jobs, as a path derived from their input (a run's
    summary.json is RUNS_ROOT/<dataset>/a<alpha>/<method>/s<seed>/summary.json), not a
    hardcoded prefix of it."""
    return str(Path(input.runs[0]).parents[len(Path(RUN).relative_to(RUNS_ROOT).parts)])
