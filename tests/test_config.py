"""Config validation: every error is one line naming the key; the CLI exits with code 2."""

import re
from pathlib import Path

import pytest
import yaml

from incofl.cli import run
from incofl.config import (
    SHARED_SETTINGS,
    Affects,
    ConfigError,
    Role,
    RunConfig,
    load_experiment,
    load_run_config,
    parse_overrides,
    run_settings,
)

REPO = Path(__file__).resolve().parents[1]
SHIPPED = sorted(REPO.glob("config/*.yaml"))  # every config the repository ships


def _write(tmp_path, **cfg):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.parametrize(
    "cfg,key",
    [
        ({"alphas": [0.5, -1.0]}, "alphas"),
        ({"alpha": 0}, "alpha"),
        ({"ratio": 1.5}, "ratio"),
        ({"ratio": 0.0}, "ratio"),
        ({"clients": 3}, "clients"),  # fewer clients than the 5 model groups
        ({"methods": ["FedAvg", "NoSuchMethod"]}, "methods"),
        ({"datasets": ["imagenet"]}, "datasets"),
        ({"learning_rate": 0.1}, "learning_rate"),
        ({"models": ["resnet10", "vit_d8"]}, "models"),
        ({"per_method": {"InCoAvg": {"rounds": 0}}}, "per_method"),
        ({"method_args": {"clip": 0.2}, "methods": ["FedAvg"]}, "method_args"),
    ],
)
def test_bad_config_names_the_key(tmp_path, cfg, key):
    with pytest.raises(ConfigError) as err:
        load_run_config(_write(tmp_path, **cfg))
    msg = str(err.value)
    assert key in msg and "\n" not in msg


def test_cli_exits_2_with_one_line(tmp_path, capsys):
    assert run(["train", "--config", str(_write(tmp_path, ratio=2)), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert "ratio" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "out").exists()  # nothing ran


def test_set_overrides_pick_the_grid_point(tmp_path):
    path = _write(
        tmp_path,
        datasets=["digits", "synthetic"],
        alphas=[0.5, 1.0],
        methods=["FedAvg", "InCoAvg"],
        per_method={"InCoAvg": {"rounds": 7}},
    )
    cfg = load_run_config(path, parse_overrides(["dataset=synthetic", "alpha=1.0", "method=InCoAvg", "seed=2"]))
    assert (cfg.dataset, cfg.alpha, cfg.method, cfg.seed, cfg.rounds) == ("synthetic", 1.0, "InCoAvg", 2, 7)
    first = load_run_config(path)
    assert (first.dataset, first.alpha, first.method, first.rounds) == ("digits", 0.5, "FedAvg", 50)
    with pytest.raises(ConfigError, match="bogus"):
        load_run_config(path, {"bogus": 1})
    with pytest.raises(ConfigError, match="expected key=value"):
        parse_overrides(["alpha"])


def test_the_shipped_configs_are_found():
    """The tests over SHIPPED would pass vacuously on an empty list: it must hold the default
    experiment's config and every config dvc.yaml trains."""
    trained = set(re.findall(r"config/[\w.-]+\.yaml", (REPO / "dvc.yaml").read_text()))
    assert "config/config.yaml" in trained and len(trained) > 5
    assert trained <= {str(path.relative_to(REPO)) for path in SHIPPED}


@pytest.mark.parametrize("path", SHIPPED, ids=lambda path: path.name)
def test_shipped_configs_are_valid(path):
    assert load_experiment(path).methods


BAD_METHOD_ARGS = [
    ("FedProx", {"mu": -0.1}, "method_args.mu: Input should be greater than or equal to 0"),
    ("FedProx", {"mu": float("inf")}, "method_args.mu: Input should be a finite number"),
    ("FedProx", {"mu": "0.1"}, "method_args.mu: Input should be a valid number (got '0.1')"),
    ("MOON", {"temperature": 0}, "method_args.temperature: Input should be greater than 0"),
    ("MOON", {"pool_size": 0}, "method_args.pool_size: Input should be greater than or equal to 1"),
    ("MOON", {"pool_size": 1.5}, "method_args.pool_size: Input should be a valid integer"),
    ("MOON", {"projection_dim": -1}, "method_args.projection_dim: Input should be greater than or equal to 0"),
    ("SCAFFOLD", {"correction": "both"}, "method_args.correction: Input should be 'step' or 'gradient'"),
    ("FedAvg", {"weighted": "no"}, "method_args.weighted: Input should be a valid boolean (got 'no')"),
    ("FedNova", {"rho": 1.0}, "method_args.rho: Input should be less than 1"),
    ("InCoAvg", {"clip": 0}, "method_args.clip: Input should be greater than 0"),
    ("InCoAvg", {"clamp_max": -5}, "method_args.clamp_max: Input should be greater than 0"),
    ("InCoAvg", {"variant": "authors"}, "method_args.variant: Input should be 'official' or 'paper'"),
    ("InCoAvg", {"normalize": 0}, "method_args.normalize: Input should be a valid boolean"),
    ("FedAvg", {"mu": 0.1}, "method_args.mu: not a parameter of FedAvg (takes: weighted)"),
    ("FedDyn", {"alpha": 0}, "method_args.alpha: Input should be greater than 0 (got 0)"),
    ("FedDyn", {"alpha": float("nan")}, "method_args.alpha: Input should be a finite number"),
    ("InCoDyn", {"alpha": -0.01}, "method_args.alpha: Input should be greater than 0"),
    ("FedDyn", {"weighted": True}, "method_args.weighted: Input should be False (got True)"),  # the plain mean only
]


@pytest.mark.parametrize("method,args,message", BAD_METHOD_ARGS)
def test_bad_method_args_are_refused_before_any_output(tmp_path, capsys, method, args, message):
    """incofl train: exit 2, one line naming method_args.<key> and what is allowed, no run directory."""
    cfg = _write(tmp_path, methods=[method], method_args=args)
    assert run(["train", "--config", str(cfg), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "out").exists()


def test_bad_per_method_args_name_the_method(tmp_path):
    cfg = _write(tmp_path, methods=["FedAvg", "MOON"], per_method={"MOON": {"method_args": {"temperature": -1}}})
    with pytest.raises(ConfigError, match=r"per_method\.MOON\.method_args\.temperature: Input should be greater"):
        load_experiment(cfg)


def test_method_args_take_their_types_and_method_defaults():
    from incofl.registry import METHODS

    assert METHODS["FedProx"].parse_args({"mu": 1}).mu == 1.0  # an int is a valid float
    assert METHODS["FedNova"].parse_args({}).weighted is True  # FedNova's own default
    assert METHODS["InCoAvg-noNorm"].parse_args({}).normalize is False
    assert METHODS["InCoAvg-noNorm"].parse_args({"clip": 0.2}).clip == 0.2


# --- --set with dotted keys ------------------------------------------------------------------------
def test_dotted_set_merges_into_the_mapping_it_names(tmp_path):
    """A dotted key sets one nested key over per_method and variants, keeping their other keys;
    the YAML mapping form replaces the whole mapping."""
    path = _write(
        tmp_path,
        methods=["FedProx", "Var"],
        per_method={"FedProx": {"method_args": {"mu": 0.5, "weighted": False}}},
        variants={"Var": {"method": "InCoAvg", "method_args": {"clip": 0.3}}},
        analyses={"probe_samples": 32},
    )
    cfg = load_run_config(path, parse_overrides(["method_args.mu=0.1", "analyses.cka_rounds=[1]"]))
    assert cfg.method_args == {"mu": 0.1, "weighted": False}
    assert (cfg.analyses.cka_rounds, cfg.analyses.probe_samples) == ([1], 32)
    variant = load_run_config(path, parse_overrides(["method=Var", "method_args.normalize=false"]))
    assert variant.method_args == {"clip": 0.3, "normalize": False} and variant.label == "Var"
    whole = load_run_config(path, parse_overrides(["method_args={mu: 0.1}"]))
    assert whole.method_args == {"mu": 0.1}
    assert load_experiment(path).per_method["FedProx"]["method_args"] == {"mu": 0.5, "weighted": False}  # untouched


BAD_DOTTED = [
    ("method_args.bogus=1", "--set: method_args.bogus: not a parameter of FedAvg (takes: weighted)"),
    ("analyses.bogus=1", "--set: analyses.bogus: unknown key"),
    ("analyses.cka_rounds=[0]", "--set: analyses.cka_rounds.0: Input should be greater than or equal to 1"),
    ("clients.x=1", "--set clients.x: clients is not a mapping"),
    ("method.x=1", "--set method.x: method is not a mapping"),
    ("resources.gpu=1", "--set: resources.gpu: a key of the experiment (its config file), not a setting of one run"),
    ("nothing.x=1", "--set: nothing.x: unknown key"),
    ("method_args..x=1", "expected key=value"),
]


@pytest.mark.parametrize("pair,message", BAD_DOTTED, ids=[p for p, _ in BAD_DOTTED])
def test_bad_dotted_set_is_one_line_naming_the_key(tmp_path, capsys, pair, message):
    cfg = _write(tmp_path, methods=["FedAvg"], clients=10)
    assert run(["train", "--config", str(cfg), "--out", str(tmp_path / "out"), "--set", pair]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "out").exists()


# --- personalised methods need holdout ----------------------------------------------------------
@pytest.mark.parametrize("method", ["Local", "FedPer", "FedLAG"])
def test_personalised_method_without_holdout_is_refused(tmp_path, capsys, method):
    """Without holdout its per-client models would be reported as the first client's on the global test set."""
    with pytest.raises(ConfigError, match=rf"c.yaml: holdout: {method} keeps a personal model"):
        load_experiment(_write(tmp_path, methods=["FedAvg", method]))
    assert load_run_config(_write(tmp_path, methods=[method], holdout=0.25)).holdout == 0.25
    out = tmp_path / "out"
    assert run(["train", "--out", str(out), "--set", f"method={method}"]) == 2  # the built-in config, no holdout
    assert "--set: holdout: " in capsys.readouterr().err and not out.exists()


def test_committed_personalised_configs_set_holdout():
    from incofl.registry import METHODS

    for path in SHIPPED:
        exp = load_experiment(path)
        personal = [m for m in exp.methods if METHODS[exp.method_of(m)].planner.personal]
        assert not personal or exp.holdout == 0.25, path  # FedLAG's, as their evidence runs were trained


# --- every setting declares what it affects -----------------------------------------------------
def test_every_run_setting_declares_exactly_one_thing_it_affects():
    """A setting added later is tagged (config.Affects, in its annotation) or fails here: the
    lists of settings that checks use are read from the tags."""
    for name, field in RunConfig.model_fields.items():
        tags = [tag for tag in field.metadata if isinstance(tag, Affects)]
        assert len(tags) == 1, f"{name}: annotate it with exactly one config.Affects (it has {tags})"


def test_a_partition_setting_is_shared_by_a_grids_methods_unless_it_names_the_partition_artifact():
    """per_method and variants may override a partition setting only where the workflow's partition
    artifact is named by it (results/partitions/{dataset}/a{alpha}-k{clients}-p{partition_seed}.npz):
    otherwise two methods would read one artifact drawn for one of them."""
    partition = run_settings(Affects.PARTITION)
    assert partition - SHARED_SETTINGS == {"dataset", "alpha", "clients", "partition_seed"}
    assert SHARED_SETTINGS <= partition | run_settings(Affects.NOTHING)  # the rest: where data is read from


def test_the_lists_of_settings_read_from_the_tags_agree():
    """What a resumed run may change (a checkpoint's) a rerun may change too (compare's); what the
    partition or results depend on a rerun may not; a node checks every partition setting."""
    from incofl.fl.engine.checkpoint import NON_SEMANTIC
    from incofl.report.compare import NOT_SETTINGS
    from incofl.sides import PARTITION_SETTINGS

    assert NON_SEMANTIC <= NOT_SETTINGS
    assert NOT_SETTINGS & run_settings(Affects.PARTITION, Affects.RESULTS) == run_settings(Role.REPLICATE) == {"seed"}
    assert run_settings(Affects.PARTITION) <= PARTITION_SETTINGS
