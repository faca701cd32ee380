"""Config validation: every error is one line naming the key; the CLI exits with code 2."""

import pytest
import yaml

from incofl.cli import run
from incofl.config import ConfigError, load_experiment, load_run_config, parse_overrides


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


def test_shipped_configs_are_valid():
    from pathlib import Path

    for path in sorted(Path(__file__).parents[1].glob("config/*.yaml")):
        load_experiment(path)
