"""Method variants: named settings of a registered method (`variants: {FedPart-W0: {method:
FedPart, method_args: {warmup: 0}}}`), listed in `methods` by name. A variant's run trains its
method with shared < per_dataset < per_method < the variant's settings < --set, under the
variant's name (`label`): in summary.json, tables, figures and the workflow's run directories.
Every bad variant is one line naming the key, before anything runs."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import jsonschema
import pandas as pd
import pytest
import yaml
from jsonschema import Draft202012Validator
from workflows import REPO, run_snakemake

from incofl.cli import run
from incofl.config import ConfigError, RunConfig, load_run_config, validate_experiment

SCHEMA = yaml.safe_load((REPO / "workflow" / "schemas" / "config.schema.yaml").read_text())
VARIANTS = {
    "FedPart-W0": {"method": "FedPart", "method_args": {"warmup": 0}},
    "FedProx-mu10": {"method": "FedProx", "method_args": {"mu": 10}},
}
# digits (scikit-learn's, no download), 4 clients, 2 small models, 2 rounds: seconds per run
TINY = {
    "datasets": ["digits"],
    "alphas": [0.5],
    "methods": ["FedAvg", "FedPart-W0"],
    "seeds": [0],
    "clients": 4,
    "ratio": 0.5,
    "models": ["resnet10", "resnet14"],
    "model_scale": 0.25,  # a quarter of the channels: what is checked here is names and settings
    "rounds": 2,
    "batch_size": 32,
    "eval_batch_size": 500,
    "progress": False,
    "threads": 1,
    "variants": {"FedPart-W0": {"method": "FedPart", "method_args": {"warmup": 0, "rounds_per_group": 1}}},
}


def _write(path: Path, cfg: dict) -> Path:
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


# --- the merge, the label ----------------------------------------------------------------
def test_settings_merge_shared_dataset_method_variant_then_overrides():
    exp = validate_experiment(
        {
            "datasets": ["digits", "synthetic"],
            "methods": ["FedPart", "FedPart-W0"],
            "rounds": 10,
            "lr": 0.1,
            "batch_size": 16,
            "eval_every": 2,
            "per_dataset": {"digits": {"rounds": 11, "lr": 0.2, "batch_size": 17, "eval_every": 3}},
            "per_method": {"FedPart": {"rounds": 12, "lr": 0.3, "batch_size": 18, "method_args": {"warmup": 7}}},
            "variants": {"FedPart-W0": {"method": "FedPart", "rounds": 13, "lr": 0.4, "method_args": {"warmup": 0}}},
        }
    )
    cfg = exp.run_config("digits", 0.5, "FedPart-W0", 1, rounds=14)
    assert (cfg.method, cfg.label, cfg.name) == ("FedPart", "FedPart-W0", "FedPart-W0")
    assert (cfg.rounds, cfg.lr, cfg.batch_size, cfg.eval_every) == (14, 0.4, 18, 3)  # --set, variant, method, data set
    assert cfg.method_args == {"warmup": 0}  # the variant's method_args replace per_method's, as per_method's do
    assert (cfg.dataset, cfg.alpha, cfg.seed) == ("digits", 0.5, 1)
    assert exp.run_config("synthetic", 0.5, "FedPart-W0", 0).rounds == 13  # no per_dataset: the variant's
    method = exp.run_config("digits", 0.5, "FedPart", 0)  # the registered method beside it: no variant settings
    assert (method.label, method.name, method.rounds, method.method_args) == (None, "FedPart", 12, {"warmup": 7})
    assert exp.settings_for("FedPart-W0", "digits")["label"] == "FedPart-W0"  # what the workflow and table job see
    assert exp.names == ["FedPart", "FedPart-W0"] and exp.method_of("FedPart-W0") == "FedPart"


def test_set_method_picks_a_variant(tmp_path):
    path = _write(tmp_path / "c.yaml", {**TINY, "variants": {**TINY["variants"], **VARIANTS}})
    cfg = load_run_config(path, {"method": "FedProx-mu10", "lr": 0.01})
    assert (cfg.method, cfg.name, cfg.method_args, cfg.lr) == ("FedProx", "FedProx-mu10", {"mu": 10}, 0.01)
    assert load_run_config(path).name == "FedAvg"  # the first of `methods`


def test_label_names_the_run():
    assert RunConfig(method="FedProx").name == "FedProx"
    assert RunConfig(method="FedProx", label="FedProx-mu10").name == "FedProx-mu10"
    with pytest.raises(ValueError, match="label"):
        RunConfig(method="FedProx", label="mu 10")  # not a run directory's name
    with pytest.raises(ValueError, match="label: 'FedAvg' is a registered method"):
        RunConfig(method="FedProx", label="FedAvg")


# --- bad variants: one line naming the key -----------------------------------------------
BAD = [
    ({"variants": {"X-1": {"method": "NoSuch"}}}, "variants.X-1.method: unknown method 'NoSuch'; known: FedAvg"),
    ({"variants": {"X-1": {"method_args": {"mu": 1}}}}, "variants.X-1.method: missing"),
    (
        {"variants": {"A": {"method": "FedProx"}, "B": {"method": "A"}}},
        "variants.B.method: 'A' is a variant; a variant's method must be a registered method",
    ),
    ({"variants": {"FedProx": {"method": "FedAvg"}}}, "variants.FedProx: 'FedProx' is a registered method"),
    ({"variants": {"FedProx_mu": {"method": "FedProx"}}}, "variants.FedProx_mu: a variant name is letters, digits"),
    ({"variants": {"Prox mu": {"method": "FedProx"}}}, "variants.Prox mu: a variant name is letters, digits"),
    (
        {"variants": {"A": {"method": "FedPart", "method_args": {"mu": 1}}}},
        "variants.A.method_args.mu: not a parameter of FedPart",
    ),
    (
        {"variants": {"A": {"method": "FedProx", "method_args": {"mu": -1}}}},
        "variants.A.method_args.mu: Input should be greater than or equal to 0",
    ),
    ({"variants": {"A": {"method": "FedProx", "rounds": 0}}}, "variants.A.rounds: Input should be greater"),
    ({"variants": {"A": {"method": "FedProx", "learning_rate": 1}}}, "variants.A.learning_rate: unknown key"),
    ({"variants": {"A": {"method": "FedProx", "label": "B"}}}, "variants.A.label: a variant's runs are shown"),
    (
        {"variants": {"A": {"method": "FedProx", "partition": "iid"}}},
        "variants.A.partition: data and partition settings are shared by all methods",
    ),
    (
        {"variants": {"A": {"method": "FedProx", "min_size": 5}}},
        "variants.A.min_size: data and partition settings are shared by all methods",
    ),
    (
        {"variants": {"A": {"method": "FedPart", "models": ["vit_d8", "vit_d9"]}}},
        "variants.A.models: FedPart's layer groups are defined for ResNets",
    ),
    ({"per_method": {"A": {"rounds": 3}}, "variants": {"A": {"method": "FedProx"}}}, "per_method.A: a variant"),
    ({"per_method": {"FedProx": {"partition": "iid"}}}, "per_method.FedProx.partition: data and partition settings"),
    ({"per_method": {"FedProx": {"label": "P"}}}, "per_method.FedProx.label"),
    ({"methods": ["FedAvg", "NoSuch"]}, "methods: unknown method 'NoSuch'; known: FedAvg"),
    ({"methods": ["FedAvg", "NoSuch"], "variants": VARIANTS}, "methods: unknown method 'NoSuch'; known: FedAvg"),
    ({"methods": ["FedPart-W0", "FedPart-W0"], "variants": VARIANTS}, "methods: 'FedPart-W0' is listed twice"),
    ({"methods": ["FedAvg", "FedProx"], "label": "L"}, "label: names the runs of one registered method"),
    ({"methods": ["FedPart-W0"], "variants": VARIANTS, "label": "L"}, "label: names the runs of one registered"),
    ({"methods": ["FedAvg"], "label": "FedProx"}, "label: 'FedProx' is a registered method"),
    ({"methods": ["FedAvg"], "label": "a/b"}, "label: String should match pattern"),
]


@pytest.mark.parametrize("override,message", BAD, ids=[m.split(":")[0] + f"-{i}" for i, (_, m) in enumerate(BAD)])
def test_bad_variant_is_one_line_naming_the_key(override, message):
    with pytest.raises(ConfigError) as err:
        validate_experiment({"methods": ["FedAvg"], **override}, "c.yaml")
    msg = str(err.value)
    assert msg.startswith(f"c.yaml: {message}") and "\n" not in msg, msg


def test_a_variant_outside_the_grid_is_checked_too():
    """As a per_method entry of a method not in `methods` is: the grid may grow to include it."""
    with pytest.raises(ConfigError, match=r"^c\.yaml: variants\.A\.method_args\.warmup: not a parameter of FedProx"):
        validate_experiment(
            {"methods": ["FedPart"], "variants": {"A": {"method": "FedProx"}}, "method_args": {"warmup": 1}}, "c.yaml"
        )


def test_a_bad_setting_is_blamed_where_it_was_made():
    """The variant's base method's per_method entry, not the variant, when the key is not the variant's."""
    cfg = {"methods": ["FedPart-W0"], "variants": VARIANTS, "per_method": {"FedPart": {"method_args": {"mu": 1}}}}
    with pytest.raises(ConfigError, match=r"^c\.yaml: per_method\.FedPart\.method_args\.mu: not a parameter"):
        validate_experiment(cfg, "c.yaml")
    listed = {"FedPart-R3": {"method": "FedPart", "rounds": 3}}  # listed, so the top level's method_args are its own
    cfg = {"methods": ["FedPart-R3"], "variants": listed, "method_args": {"mu": 1}}
    with pytest.raises(ConfigError, match=r"^c\.yaml: method_args\.mu: not a parameter of FedPart"):
        validate_experiment(cfg, "c.yaml")


def test_cli_refuses_a_bad_variant_with_exit_2_and_nothing_written(tmp_path, capsys):
    cfg = {**TINY, "variants": {"FedPart-W0": {"method": "FedPart", "method_args": {"warmup": -1}}}}
    out = tmp_path / "out"
    assert run(["train", "--config", str(_write(tmp_path / "c.yaml", cfg)), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "variants.FedPart-W0.method_args.warmup: " in err, err
    assert not out.exists()


# --- the workflow's schema ---------------------------------------------------------------
def test_schema_accepts_variants_and_labels_and_refuses_bad_names():
    good = {**TINY, "variants": {**TINY["variants"], **VARIANTS}}
    jsonschema.validate(good, SCHEMA, cls=Draft202012Validator)
    validate_experiment(good)
    jsonschema.validate({"methods": ["FedPart"], "label": "FedPart-W0"}, SCHEMA, cls=Draft202012Validator)
    bad = [
        {"methods": ["FedAvg"], "variants": {"Prox mu": {"method": "FedProx"}}},
        {"methods": ["FedAvg"], "variants": {"A": {"rounds": 2}}},
        {"methods": ["FedAvg"], "label": "a b"},
    ]
    for cfg in bad:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(cfg, SCHEMA, cls=Draft202012Validator)
        with pytest.raises(ConfigError):
            validate_experiment(cfg)
    # which names are registered is the package's check alone (the schema lists none: no regeneration)
    unregistered = [
        {"methods": ["FedAvg", "NoSuch"]},  # no variants: methods only
        {"methods": ["FedAvg"], "variants": {"FedProx": {"method": "FedProx"}}},
        {"methods": ["FedAvg"], "variants": {"A": {"method": "NoSuch"}}},
    ]
    for cfg in unregistered:
        jsonschema.validate(cfg, SCHEMA, cls=Draft202012Validator)
        with pytest.raises(ConfigError):
            validate_experiment(cfg)


# --- downstream: the table shows a variant's name, paired with its method's base ---------
def test_table_rows_are_variant_names_with_their_methods_base(tmp_path):
    runs = tmp_path / "runs"
    accs = {"FedAvg": 40.0, "FedPart": 41.0, "FedPart-W0": 45.0, "FedProx-mu10": 30.0, "Other": 99.0}
    for method, acc in accs.items():
        d = runs / "digits" / "a0.5" / method / "s0"
        d.mkdir(parents=True)
        (d / "summary.json").write_text(
            json.dumps(
                {
                    "method": method,
                    "dataset": "digits",
                    "alpha": 0.5,
                    "seed": 0,
                    "status": "completed",
                    "final_acc": acc,
                }
            )
        )
    cfg = {"datasets": ["digits"], "methods": ["FedAvg", "FedPart-W0", "FedProx-mu10", "FedPart"], "variants": VARIANTS}
    out = tmp_path / "tables"
    assert (
        run(["table", "--config", str(_write(tmp_path / "c.yaml", cfg)), "--runs", str(runs), "--out", str(out)]) == 0
    )
    table = pd.read_csv(out / "table2.csv").set_index("method")
    # FedProx-mu10 stands where FedProx does (a baseline), FedPart-W0 where FedPart does (over FedAvg)
    assert list(table.index) == ["FedAvg", "FedProx-mu10", "FedPart-W0", "FedPart"]  # "Other": not in the grid
    assert table.loc["FedPart-W0", "base"] == "FedAvg" and table.loc["FedPart-W0", "improvement"] == 5.0
    assert pd.isna(table.loc["FedProx-mu10", "base"]) and table.loc["FedProx-mu10", "mean"] == 30.0
    assert "| FedPart-W0 | 45.0 (+5.0) |" in (out / "table2.md").read_text()


# --- end to end: incofl train, the workflow's run file and its dry run ---------------------
def _snakemake(workdir: Path, config: Path, *args: str) -> subprocess.CompletedProcess:
    return run_snakemake(workdir, *args, config=config, timeout=300)


@pytest.mark.slow
def test_dry_run_plans_the_variants_run_directory(tmp_path):
    config = _write(tmp_path / "c.yaml", {**TINY, "cache_dir": str(tmp_path / "cache")})
    proc = _snakemake(tmp_path, config, "--dry-run")
    assert proc.returncode == 0, proc.stderr + proc.stdout
    planned = proc.stdout + proc.stderr
    for method in ("FedAvg", "FedPart-W0"):
        assert f"results/runs/digits/a0.5/{method}/s0/summary.json" in planned, planned
    assert "results/runs/digits/a0.5/FedPart/s0" not in planned  # the variant's runs are its own
    assert not (tmp_path / "results").exists()


@pytest.mark.slow
def test_train_a_variant_and_its_workflow_run_file_round_trips(tmp_path, capsys):
    """`incofl train --set method=FedPart-W0` trains FedPart with the variant's settings under
    its name; the run file the workflow writes for it (`methods: [FedPart]`, `label:
    FedPart-W0`) is the same run: training from it finds the run finished."""
    config = _write(tmp_path / "c.yaml", {**TINY, "cache_dir": str(tmp_path / "cache")})
    out = tmp_path / "run"
    assert run(["train", "--config", str(config), "--out", str(out), "--set", "method=FedPart-W0"]) == 0
    assert capsys.readouterr().out.startswith("FedPart-W0 digits alpha=0.5 seed=0: final")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["method"] == "FedPart" and summary["config"]["label"] == "FedPart-W0"
    assert summary["config"]["method_args"] == {"warmup": 0, "rounds_per_group": 1}
    assert summary["method"] == "FedPart-W0"  # the run's name (the run writes cfg.name)

    target, plain = (f"results/runs/digits/a0.5/{m}/s0/config.yaml" for m in ("FedPart-W0", "FedAvg"))
    proc = _snakemake(tmp_path, config, "--cores", "1", target, plain)  # the run_config jobs only
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "label" not in yaml.safe_load((tmp_path / plain).read_text())  # as before labels: no run is redone
    run_file = yaml.safe_load((tmp_path / target).read_text())
    assert run_file["methods"] == ["FedPart"] and run_file["label"] == "FedPart-W0"
    assert run_file["method_args"] == {"warmup": 0, "rounds_per_group": 1}
    assert "variants" not in run_file or not run_file["variants"]
    assert load_run_config(tmp_path / target, {"threads": 1, "progress": False}) == load_run_config(
        config, {"method": "FedPart-W0"}
    )
    before = (out / "summary.json").read_text()
    argv = ["train", "--config", str(tmp_path / target), "--out", str(out), "--set", "threads=1", "progress=false"]
    assert run(argv) == 0  # the same semantic settings (else: refused, naming the key)
    assert (out / "summary.json").read_text() == before
    assert "already finished" in (out / "train.log").read_text()
