"""Reliability (issue 11): bad input is refused before anything is written, with one line that
names the key or file and exit code 2; results never lie (divergence, provenance, resume
identity); one writer per run directory; Ctrl-C and SIGKILL lose nothing and leave nothing
behind."""

from __future__ import annotations

import json
import os
import random
import resource
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from incofl.cli import run
from incofl.config import load_run_config
from incofl.data.partition import make_partition
from incofl.data.sources import load_dataset

BASE = {
    "datasets": ["synthetic"],
    "clients": 4,
    "ratio": 0.5,
    "models": ["resnet10", "resnet14"],
    "model_scale": 0.25,  # a quarter of the channels: the properties do not depend on width
    "rounds": 2,
    "batch_size": 32,
    "min_size": 20,
    "progress": False,
    "threads": 1,
    "methods": ["FedAvg"],
}
CMD = [sys.executable, "-m", "incofl.cli", "train"]
REPO = Path(__file__).resolve().parents[1]


def _config(tmp_path: Path, **extra) -> Path:
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump({**BASE, "cache_dir": str(tmp_path / "cache"), **extra}))
    return path


def _refused(capsys, argv: list[str], names: str) -> str:
    """Exit 2, one line on stderr naming `names`, no traceback."""
    code = run(argv)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and names in lines[0], err
    assert "Traceback" not in err
    return lines[0]


# --- bad values: one line naming the key, exit 2, nothing written -------------------------------
BAD_VALUES = [
    ("alphas", [0.0], "alphas.0"),
    ("alphas", [-1.0], "alphas.0"),
    ("alphas", [float("inf")], "alphas.0: Input should be a finite number"),
    ("alphas", [float("nan")], "alphas.0: Input should be a finite number"),
    ("alphas", ["half"], "alphas.0"),
    ("alphas", [0.5, 0.5], "alphas: 0.5 is listed twice"),
    ("alphas", [], "alphas"),
    ("ratio", 0.0, "ratio"),
    ("ratio", 1.5, "ratio"),
    ("ratio", float("nan"), "ratio: Input should be a finite number"),
    ("clients", 0, "clients"),
    ("clients", 1, "clients: 1 clients cannot fill 2 model groups"),
    ("clients", "many", "clients"),
    ("lr", 0.0, "lr"),
    ("lr", -0.1, "lr"),
    ("lr", float("inf"), "lr: Input should be a finite number"),
    ("momentum", 1.0, "momentum"),
    ("weight_decay", -1.0, "weight_decay"),
    ("rounds", 0, "rounds"),
    ("rounds", 2.5, "rounds"),
    ("local_epochs", 0, "local_epochs"),
    ("batch_size", 1, "batch_size"),
    ("eval_every", 0, "eval_every"),
    ("eval_last", -1, "eval_last"),
    ("checkpoint_every", 0, "checkpoint_every"),
    ("threads", 0, "threads"),
    ("min_size", 0, "min_size"),
    ("max_retries", 0, "max_retries"),
    ("partition", "random", "partition"),
    ("partition", "release", "release_partitions: needed with partition: release"),
    ("optimizer", "rmsprop", "optimizer"),
    ("stem", "tiny", "stem"),
    ("device", "tpu", "device"),
    ("models", [], "models"),
    ("models", ["resnet99"], "unknown model 'resnet99'"),
    ("models", ["resnet10", "vit_d8"], "all models must come from one family"),
    ("models", ["resnet14", "resnet10"], "models: one group per model, smallest first"),
    ("models", ["resnet10", "resnet10"], "models: 'resnet10' is listed twice"),
    ("datasets", ["imagenet"], "unknown dataset 'imagenet'"),
    ("datasets", ["synthetic", "synthetic"], "datasets: 'synthetic' is listed twice"),
    ("seeds", [-1], "seeds.0"),
    ("seeds", [0, 0], "seeds: 0 is listed twice"),
    ("methods", ["FedAvg", "FedAvg"], "methods: 'FedAvg' is listed twice"),
    ("methods", ["NoSuchMethod"], "unknown method 'NoSuchMethod'"),
    ("method_args", {"clip": 0.2}, "method_args.clip: not a parameter of FedAvg"),
    ("method_args", "mu=1", "method_args"),
    ("per_method", {"NoSuchMethod": {"rounds": 3}}, "per_method.NoSuchMethod"),
    ("per_method", {"FedAvg": {"rounds": 0}}, "per_method.FedAvg.rounds"),
    ("per_method", {"FedAvg": {"learning_rate": 0.1}}, "per_method.FedAvg.learning_rate: unknown key"),
    ("per_method", {"FedProx": {"method_args": {"mu": -1}}}, "per_method.FedProx.method_args.mu"),
    ("per_dataset", {"imagenet": {"rounds": 3}}, "per_dataset.imagenet: unknown dataset"),
    ("per_dataset", {"synthetic": {"lr": float("inf")}}, "per_dataset.synthetic.lr: Input should be a finite number"),
    ("augment", "mixup", "augment"),
    ("cutout", -1, "cutout"),
    ("pad_fill", "white", "pad_fill"),
    ("normalize", "imagenet", "normalize"),
    ("resize", 4, "resize"),
    ("drop_last", "maybe", "drop_last"),
    ("fmnist_partition", "svhn", "fmnist_partition"),
    ("vit_epoch_scale", "some", "vit_epoch_scale"),
    ("table_metric", "median_acc", "table_metric"),
    ("resources", {"gpu": -1}, "resources.gpu"),
    ("resources", {"nodes": 2}, "resources.nodes: unknown key"),
    ("learning_rate", 0.1, "learning_rate: unknown key"),
]


@pytest.mark.parametrize("key,value,names", BAD_VALUES, ids=[f"{k}={v!r}" for k, v, _ in BAD_VALUES])
def test_bad_value_is_refused_before_anything_is_written(tmp_path, capsys, key, value, names):
    cfg = _config(tmp_path, **{key: value})
    _refused(capsys, ["train", "--config", str(cfg), "--out", str(tmp_path / "out")], names)
    assert not (tmp_path / "out").exists() and not (tmp_path / "cache").exists()


FEW_METHOD_ARGS = [
    ("FedProx", {"mu": float("inf")}, "method_args.mu: Input should be a finite number"),
    ("FedProx", {"anchor": "first"}, "method_args.anchor"),
    ("MOON", {"temperature": 0}, "method_args.temperature"),
    ("FedNova", {"rho": 1.0}, "method_args.rho"),
    ("InCoAvg", {"variant": "v2"}, "method_args.variant"),
]


@pytest.mark.parametrize("method,args,names", FEW_METHOD_ARGS, ids=[m for m, _, _ in FEW_METHOD_ARGS])
def test_bad_method_args_are_refused(tmp_path, capsys, method, args, names):
    cfg = _config(tmp_path, methods=[method], method_args=args)
    _refused(capsys, ["train", "--config", str(cfg), "--out", str(tmp_path / "out")], names)
    assert not (tmp_path / "out").exists()


# --- bad files and command lines ---------------------------------------------------------------
def _write(path: Path, text: str | bytes) -> Path:
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


BAD_FILES = [
    ("missing", lambda t: t / "nope.yaml", "nope.yaml: config file not found"),
    ("a folder", lambda t: t, "config file not found"),
    ("yaml syntax", lambda t: _write(t / "c.yaml", "rounds: [1, 2\nlr: 0.1\n"), "not valid YAML (line"),
    ("yaml tab", lambda t: _write(t / "c.yaml", "rounds:\t3\n\tlr: 1\n"), "not valid YAML"),
    ("a list", lambda t: _write(t / "c.yaml", "- rounds\n- 3\n"), "expected a mapping"),
    ("binary", lambda t: _write(t / "c.yaml", b"\xff\xfe\x00garbage"), "c.yaml: cannot read the config"),
]


@pytest.mark.parametrize("case,make,names", BAD_FILES, ids=[c for c, _, _ in BAD_FILES])
def test_bad_config_file_is_one_line(tmp_path, capsys, case, make, names):
    _refused(capsys, ["train", "--config", str(make(tmp_path)), "--out", str(tmp_path / "out")], names)
    assert not (tmp_path / "out").exists()


BAD_SETS = [
    (["--set", "alpha"], "--set 'alpha': expected key=value"),
    (["--set", "seeds=[0, 1"], "--set 'seeds=[0, 1': the value is not valid YAML"),
    (["--set", "no_such_key=1"], "--set: no_such_key: unknown key"),
    (["--set", "lr=.inf"], "lr: Input should be a finite number"),
    (["--set", "method=NoSuch"], "unknown method 'NoSuch'"),
]


@pytest.mark.parametrize("sets,names", BAD_SETS, ids=[s[1] for s, _ in BAD_SETS])
def test_bad_set_is_one_line(tmp_path, capsys, sets, names):
    _refused(capsys, ["train", "--config", str(_config(tmp_path)), "--out", str(tmp_path / "out"), *sets], names)
    assert not (tmp_path / "out").exists()


def test_out_that_is_a_file_is_refused(tmp_path, capsys):
    out = _write(tmp_path / "out", "keep me")
    _refused(capsys, ["train", "--config", str(_config(tmp_path)), "--out", str(out)], "is a file, not a directory")
    assert out.read_text() == "keep me"


def test_out_under_a_file_is_refused(tmp_path, capsys):
    _write(tmp_path / "file", "x")
    _refused(capsys, ["train", "--config", str(_config(tmp_path)), "--out", str(tmp_path / "file" / "run")], "file")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the machine has a CUDA device")
def test_cuda_without_a_gpu_is_one_line(tmp_path, capsys):
    _refused(
        capsys,
        ["train", "--config", str(_config(tmp_path, device="cuda")), "--out", str(tmp_path / "o")],
        "device: cuda",
    )
    assert not (tmp_path / "o").exists()


def test_missing_data_set_names_the_folder(tmp_path, capsys):
    cfg = _config(tmp_path, datasets=["cifar10"], data_dir=str(tmp_path / "nodata"))
    _refused(capsys, ["train", "--config", str(cfg), "--out", str(tmp_path / "out")], "nodata")
    assert not (tmp_path / "out").exists()


# --- partition provenance and the data cache ------------------------------------------------------
@pytest.fixture()
def synthetic(tmp_path):
    return load_dataset("synthetic", cache_dir=tmp_path / "cache")


def _artifact(tmp_path, labels, **kw) -> Path:
    args = {"kind": "dirichlet", "num_clients": 4, "alpha": 0.5, "seed": 0, "min_size": 20, "dataset": "synthetic"}
    path = tmp_path / "part.npz"
    make_partition(labels, **{**args, **kw}).save(path)
    return path


PROVENANCE = [
    ({"num_clients": 8}, "made for clients=8, this run has clients=4"),
    ({"alpha": 1.0}, "made for alpha=1.0, this run has alpha=0.5"),
    ({"seed": 3}, "made for partition_seed=3, this run has partition_seed=0"),
    ({"min_size": 10}, "made for min_size=10, this run has min_size=20"),
    ({"dataset": "digits"}, "made for dataset='digits', this run has dataset='synthetic'"),
    ({"kind": "iid"}, "made for partition='iid', this run has partition='dirichlet'"),
]


@pytest.mark.parametrize("made,names", PROVENANCE, ids=[next(iter(m)) for m, _ in PROVENANCE])
def test_partition_made_for_another_run_is_refused(tmp_path, capsys, synthetic, made, names):
    path = _artifact(tmp_path, synthetic.y_train, **made)
    cfg = _config(tmp_path, partition_file=str(path))
    line = _refused(capsys, ["train", "--config", str(cfg), "--out", str(tmp_path / "out")], names)
    assert "part.npz" in line and not (tmp_path / "out").exists()


def test_partition_of_other_labels_is_refused(tmp_path, capsys, synthetic):
    path = _artifact(tmp_path, np.roll(synthetic.y_train, 1))
    cfg = _config(tmp_path, partition_file=str(path))
    _refused(capsys, ["train", "--config", str(cfg), "--out", str(tmp_path / "out")], "other training labels")


@pytest.mark.parametrize("content", [b"", b"PK\x03\x04 truncated", b"not a zip"], ids=["empty", "truncated", "garbage"])
def test_broken_partition_file_is_one_line(tmp_path, capsys, content):
    cfg = _config(tmp_path, partition_file=str(_write(tmp_path / "part.npz", content)))
    _refused(
        capsys, ["train", "--config", str(cfg), "--out", str(tmp_path / "out")], "part.npz: not a partition artifact"
    )


def test_missing_partition_file_is_one_line(tmp_path, capsys):
    cfg = _config(tmp_path, partition_file=str(tmp_path / "none.npz"))
    _refused(
        capsys, ["train", "--config", str(cfg), "--out", str(tmp_path / "out")], "none.npz: partition file not found"
    )


def test_truncated_or_altered_data_cache_is_rebuilt(tmp_path, caplog):
    cache = tmp_path / "cache"
    good = load_dataset("synthetic", cache_dir=cache)
    blob = (cache / "synthetic.npz").read_bytes()
    (cache / "synthetic.npz").write_bytes(blob[: len(blob) // 2])
    again = load_dataset("synthetic", cache_dir=cache)
    assert np.array_equal(again.x_train, good.x_train) and "unreadable data cache" in caplog.text
    with np.load(cache / "synthetic.npz") as z:
        arrays = dict(z)
    arrays["y_train"] = (arrays["y_train"] + 1) % 10  # a stale or altered cache: its hash no longer fits
    with open(cache / "synthetic.npz", "wb") as fh:
        np.savez(fh, **arrays)
    assert np.array_equal(load_dataset("synthetic", cache_dir=cache).y_train, good.y_train)
    assert "does not match its hash" in caplog.text


# --- results never lie --------------------------------------------------------------------------------
@pytest.mark.slow
def test_divergence_stops_the_run_and_is_recorded(tmp_path, capsys):
    cfg = _config(tmp_path, optimizer="sgd", lr=1e6, rounds=3)
    code = run(["train", "--config", str(cfg), "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("work: ")  # said before round 1
    assert code == 3 and len(err) == 2 and "diverged in round 1" in err[1], err
    text = (tmp_path / "run" / "summary.json").read_text()
    summary = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))
    assert summary["status"] == "diverged" and summary["diverged_round"] == 1
    assert "final_acc" not in summary and not (tmp_path / "run" / "ckpt.pt").exists()
    assert run(["train", "--config", str(cfg), "--out", str(tmp_path / "run")]) == 3  # a rerun says so again


def test_tables_and_figures_show_a_diverged_run_and_never_average_it(tmp_path):
    from incofl.report.figures import plot_curves
    from incofl.report.runs import collect_curves, collect_summaries
    from incofl.report.tables import metrics_json, table2, to_markdown

    runs = tmp_path / "runs"
    for seed, acc in ((0, 40.0), (1, 50.0), (2, None)):
        d = runs / "synthetic" / "a0.5" / "FedAvg" / f"s{seed}"
        d.mkdir(parents=True)
        done = {"final_acc": acc, "status": "completed"} if acc else {"status": "diverged", "diverged_round": 2}
        (d / "summary.json").write_text(
            json.dumps({"method": "FedAvg", "dataset": "synthetic", "alpha": 0.5, "seed": seed, **done})
        )
        pd.DataFrame({"round": [1, 2], "mean_acc": [10.0, acc or 11.0], "mean_loss": [2.0, 1.0]}).to_csv(
            d / "metrics.csv", index=False
        )
    t = table2(collect_summaries(runs), methods=["FedAvg"], base_of={"FedAvg": None})
    row = t.iloc[0]
    assert (row["mean"], row["n_seeds"], row["n_diverged"]) == (45.0, 2, 1)
    assert "45.0 ± 7.1 [1 diverged]" in to_markdown(t, metric="final_acc")
    assert metrics_json(t)["synthetic"]["a0.5"]["FedAvg"]["n_diverged"] == 1
    paths = plot_curves(collect_curves(runs), tmp_path / "fig", methods=["FedAvg"])
    assert all(p.exists() for p in paths)


@pytest.mark.slow
def test_finished_run_is_not_redone_and_other_settings_are_refused(tmp_path, capsys):
    cfg = _config(tmp_path)
    assert run(["train", "--config", str(cfg), "--out", str(tmp_path / "run")]) == 0
    summary = (tmp_path / "run" / "summary.json").read_text()
    assert run(["train", "--config", str(cfg), "--out", str(tmp_path / "run"), "--set", "threads=2"]) == 0
    assert (tmp_path / "run" / "summary.json").read_text() == summary  # not trained again
    assert "already finished" in (tmp_path / "run" / "train.log").read_text()
    capsys.readouterr()
    line = _refused(
        capsys,
        ["train", "--config", str(cfg), "--out", str(tmp_path / "run"), "--set", "rounds=1"],
        "summary.json: made with rounds=2, this run has rounds=1",
    )
    assert "delete" in line and (tmp_path / "run" / "summary.json").read_text() == summary


@pytest.mark.parametrize("damage", [lambda b: b[: len(b) // 3], lambda b: b"\x00" * 64], ids=["truncated", "zeroed"])
def test_unreadable_checkpoint_is_one_line(tmp_path, capsys, damage):
    from incofl.fl.engine import checkpoint

    cfg = _config(tmp_path)
    out = tmp_path / "run"
    out.mkdir()
    made = load_run_config(cfg)
    checkpoint.save(
        out / "ckpt.pt", {"config": checkpoint.semantic_config(made.model_dump()), "pad": torch.zeros(1000)}
    )
    (out / "ckpt.pt").write_bytes(damage((out / "ckpt.pt").read_bytes()))
    _refused(capsys, ["train", "--config", str(cfg), "--out", str(out)], "ckpt.pt: unreadable checkpoint")
    assert not (out / "summary.json").exists()


# --- one writer, interrupts, kills ---------------------------------------------------------------------
def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while not path.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert path.exists(), f"{path} never appeared"


@pytest.mark.slow
def test_second_writer_on_a_run_directory_is_refused(tmp_path):
    cfg = _config(tmp_path, rounds=50)
    first = subprocess.Popen([*CMD, "--config", str(cfg), "--out", str(tmp_path / "run")], stderr=subprocess.DEVNULL)
    try:
        _wait_for(tmp_path / "run" / "train.log", first)
        second = subprocess.run(
            [*CMD, "--config", str(cfg), "--out", str(tmp_path / "run")], capture_output=True, text=True, timeout=300
        )
        lines = second.stderr.strip().splitlines()
        assert second.returncode == 2 and len(lines) == 1, second.stderr
        assert f"another incofl train (pid {first.pid})" in lines[0]
    finally:
        first.kill()
        first.wait()


@pytest.mark.slow
def test_ctrl_c_keeps_the_checkpoint_and_exits_130(tmp_path):
    cfg = _config(tmp_path, rounds=50, checkpoint_every=1)
    # SIGINT as in a terminal, even when the tests run in the background (nohup, &), where it is
    # ignored and the ignoring is inherited (Python then installs no KeyboardInterrupt handler).
    proc = subprocess.Popen(
        [*CMD, "--config", str(cfg), "--out", str(tmp_path / "run")],
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    _wait_for(tmp_path / "run" / "ckpt.pt", proc)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    lines = [line for line in err.strip().splitlines() if not line.startswith(("work: ", "estimate: "))]
    assert proc.returncode == 130 and len(lines) == 1 and "interrupted" in lines[0], err
    assert (tmp_path / "run" / "ckpt.pt").exists() and not list((tmp_path / "run").glob(".*.tmp"))


@pytest.mark.slow
def test_stale_temporaries_of_dead_writers_are_removed(tmp_path):
    import socket

    out = tmp_path / "run"
    out.mkdir()
    host = socket.gethostname()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = out / f".ckpt.pt~{host}~{dead.stdout.strip()}.tmp"
    live = out / f".metrics.csv~{host}~{os.getppid()}.tmp"
    other_host = out / ".ckpt.pt~elsewhere~1.tmp"
    for f in (stale, live, other_host):
        f.write_bytes(b"x" * 1000)
    assert run(["train", "--config", str(_config(tmp_path)), "--out", str(out)]) == 0
    assert not stale.exists() and live.exists() and other_host.exists()


@pytest.mark.slow
@pytest.mark.timeout(1800)  # end to end: the README's test table names it, with its time
def test_random_sigkills_resume_bit_identically_and_leave_nothing_behind(tmp_path):
    """SIGKILL at random moments (checkpoints are written every round, so some kills land in a
    checkpoint write), resume each time: the result equals an uninterrupted run's, and no
    temporary file or checkpoint is left."""
    # 8 clients of ~250 images, 2 a round: cheap rounds, and enough of them to be killed in
    cfg = _config(tmp_path, rounds=8, checkpoint_every=1, methods=["InCoAvg"], clients=8, ratio=0.25)
    assert subprocess.run([*CMD, "--config", str(cfg), "--out", str(tmp_path / "full")]).returncode == 0
    out, rng, kills = tmp_path / "killed", random.Random(0), 0
    log, ckpt = out / "train.log", out / "ckpt.pt"

    def progress(life: int) -> float:
        """Odd lives wait for a new checkpoint, even ones for a trained round (then the kill lands
        in the evaluation or the checkpoint write after it)."""
        if life % 2:
            return ckpt.stat().st_mtime_ns if ckpt.exists() else 0
        return log.read_text().count(" trained in ") if log.exists() else 0

    for life in range(6):
        proc = subprocess.Popen([*CMD, "--config", str(cfg), "--out", str(out)], stderr=subprocess.DEVNULL)
        before, deadline = progress(life), time.time() + 300
        while proc.poll() is None and time.time() < deadline and progress(life) == before:
            time.sleep(0.02)
        time.sleep(rng.uniform(0.0, 1.5))
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            kills += 1
        proc.wait()
    assert kills >= 2, "the run finished before it could be killed: make it longer"
    assert subprocess.run([*CMD, "--config", str(cfg), "--out", str(out)]).returncode == 0
    assert "resumed from" in (out / "train.log").read_text()
    full = json.loads((tmp_path / "full" / "summary.json").read_text())
    resumed = json.loads((out / "summary.json").read_text())
    assert resumed["state_sha256"] == full["state_sha256"]
    drop = ["seconds"]
    pd.testing.assert_frame_equal(
        pd.read_csv(out / "metrics.csv").drop(columns=drop),
        pd.read_csv(tmp_path / "full" / "metrics.csv").drop(columns=drop),
    )
    pd.testing.assert_frame_equal(pd.read_csv(out / "inco.csv"), pd.read_csv(tmp_path / "full" / "inco.csv"))
    left = sorted(p.name for p in out.iterdir())
    assert left == sorted(p.name for p in (tmp_path / "full").iterdir()), left  # no .tmp, no ckpt.pt


# --- trust (issue 40): nothing read runs code, no write is half done, no run is unlocked -------------
class Payload:
    """A pickle that creates `marker` when unpickled (as a planted file's code would run)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_planted_checkpoint_is_refused_and_its_code_never_runs(tmp_path, capsys):
    from incofl.fl.engine import checkpoint

    cfg = _config(tmp_path)
    out, marker = tmp_path / "run", tmp_path / "pwned"
    out.mkdir()
    made = checkpoint.semantic_config(load_run_config(cfg).model_dump())
    torch.save({"config": made, "engine": Payload(marker)}, out / "ckpt.pt")
    _refused(capsys, ["train", "--config", str(cfg), "--out", str(out)], "ckpt.pt: unreadable checkpoint")
    assert not marker.exists() and not (out / "summary.json").exists()


def test_checkpoints_hold_plain_types_only(tmp_path):
    from incofl.fl.engine import checkpoint

    with pytest.raises(TypeError, match=r"checkpoint\['rows'\]\[0\]\['acc'\]: a numpy.float64"):
        checkpoint.save(tmp_path / "ckpt.pt", {"rows": [{"acc": np.float64(1.0)}]})
    assert not list(tmp_path.iterdir())


@contextmanager
def file_size_limit():
    """Writes past 1 MB fail (EFBIG, as a full disk or a quota fails them: an OSError of write)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an error, not the signal that kills
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)


@pytest.mark.slow
def test_failed_write_is_one_line_naming_the_file(tmp_path, capsys):
    cfg = _config(tmp_path, checkpoint_every=1)
    assert run(["prepare", "--config", str(cfg)]) == 0  # the data cache (over 1 MB) before the limit
    capsys.readouterr()
    out = tmp_path / "run"
    with file_size_limit():
        code = run(["train", "--config", str(cfg), "--out", str(out)])
    err = capsys.readouterr().err
    lines = [line for line in err.strip().splitlines() if not line.startswith(("work: ", "estimate: "))]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert f"{out / 'ckpt.pt'}: cannot write it (File too large)" in lines[0]
    assert not (out / "ckpt.pt").exists() and not list(out.glob(".*.tmp"))


@pytest.mark.parametrize(
    "text",
    [b"{not json", b"\xff\xfe", b"[1, 2]", b'{"method": "FedAvg"}', b'{"config": 3}'],
    ids=["not-json", "not-utf8", "a-list", "no-config", "config-not-a-mapping"],
)
def test_corrupt_or_foreign_summary_is_one_line(tmp_path, capsys, text):
    out = tmp_path / "run"
    out.mkdir()
    (out / "summary.json").write_bytes(text)
    _refused(
        capsys,
        ["train", "--config", str(_config(tmp_path)), "--out", str(out)],
        "summary.json: not the summary.json of an incofl run",
    )
    assert (out / "summary.json").read_bytes() == text


@pytest.mark.slow
def test_finished_run_with_kept_checkpoint_is_not_resumed(tmp_path):
    cfg, out = _config(tmp_path, keep_checkpoint=True), tmp_path / "run"
    assert run(["train", "--config", str(cfg), "--out", str(out)]) == 0
    written = (out / "summary.json").stat().st_ino, (out / "ckpt.pt").stat().st_ino
    assert run(["train", "--config", str(cfg), "--out", str(out)]) == 0
    assert ((out / "summary.json").stat().st_ino, (out / "ckpt.pt").stat().st_ino) == written  # neither rewritten
    log = (out / "train.log").read_text()
    assert "already finished" in log and "resumed from" not in log


@pytest.mark.slow
def test_a_kill_after_the_summary_leaves_no_checkpoint_or_client_state_behind(tmp_path):
    """A kill after summary.json is written, before (or between) the removal of ckpt.pt and
    clientstate/: the next start finds the run finished and removes both."""
    cfg, out = _config(tmp_path), tmp_path / "run"
    assert run(["train", "--config", str(cfg), "--out", str(out)]) == 0
    finished = sorted(p.name for p in out.iterdir())
    summary = (out / "summary.json").read_bytes()
    (out / "ckpt.pt").write_bytes(b"left by a kill")
    (out / "clientstate").mkdir()
    (out / "clientstate" / "personal-0-1.pt").write_bytes(b"left by a kill")
    assert run(["train", "--config", str(cfg), "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == finished and "clientstate" not in finished
    assert (out / "summary.json").read_bytes() == summary


def test_paper_name_without_equals_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:  # argparse's refusal (cli.Parser: one line, exit 2)
        run(["analysis", "theta_beta", "--runs", str(tmp_path), "--out", str(tmp_path / "o"), "--paper-name", "X"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(lines) == 1 and "--paper-name: 'X': expected OURS=PAPER" in lines[0]


@pytest.mark.slow
def test_pretrained_file_of_other_weights_is_refused_naming_keys(tmp_path):
    from incofl.errors import ConfigError
    from incofl.models.family import build_model

    torch.save(build_model("resnet10", 10, 3).state_dict(), tmp_path / "resnet.pt")
    with pytest.raises(
        ConfigError,
        match=r"pretrained: .*resnet.pt: not weights of this ViT, keys: \d+ missing "
        r"\(cls_token, .*\d+ unexpected \(conv1.weight",
    ):
        build_model("vit_d8", 10, 3, pretrained=str(tmp_path / "resnet.pt"), image_size=224)
    torch.save({"blocks.0.norm1.weight": Payload(tmp_path / "pwned")}, tmp_path / "planted.pt")
    with pytest.raises(ConfigError, match="planted.pt: not a readable state-dict file"):
        build_model("vit_d8", 10, 3, pretrained=str(tmp_path / "planted.pt"), image_size=224)
    assert not (tmp_path / "pwned").exists()


# atomic writes and the lock without flock
def test_atomic_write_follows_no_planted_symlink_and_syncs_file_then_folder(tmp_path, monkeypatch):
    import socket

    from incofl import atomic

    victim, target = tmp_path / "victim", tmp_path / "out" / "summary.json"
    victim.write_text("mine")
    target.parent.mkdir()
    (target.parent / f".summary.json~{socket.gethostname()}~{os.getpid()}.tmp").symlink_to(victim)  # the old name
    events = []
    fsync, replace = os.fsync, os.replace
    opened = lambda fd: os.readlink(f"/proc/self/fd/{fd}")  # noqa: E731
    monkeypatch.setattr(os, "fsync", lambda fd: events.append(("fsync", opened(fd))) or fsync(fd))
    monkeypatch.setattr(os, "replace", lambda a, b: events.append(("replace", str(b))) or replace(a, b))
    atomic.write_text(target, "new")
    assert victim.read_text() == "mine" and target.read_text() == "new"
    assert [e[0] for e in events] == ["fsync", "replace", "fsync"]
    assert events[0][1].endswith(".tmp") and events[2][1] == str(target.parent)


@pytest.fixture()
def no_flock(monkeypatch):
    """A file system without flock (NFS without lockd): flock raises ENOLCK."""
    import errno
    import fcntl

    def flock(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", flock)


def test_without_flock_a_lock_file_refuses_a_second_writer(tmp_path, no_flock):
    import socket

    from incofl.fl.engine.rundir import RunDirError, claimed

    with claimed(tmp_path):
        assert (tmp_path / ".lock.owner").read_text().split()[:2] == [socket.gethostname(), str(os.getpid())]
        with pytest.raises(RunDirError, match=f"another incofl train \\(pid {os.getpid()} on"), claimed(tmp_path):
            pass
    assert not (tmp_path / ".lock.owner").exists()


def test_without_flock_a_dead_writers_lock_is_taken_over_and_another_hosts_refused(tmp_path, no_flock):
    import socket

    from incofl.fl.engine.rundir import RunDirError, claimed

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (tmp_path / ".lock.owner").write_text(f"{socket.gethostname()} {dead.stdout.strip()}\n")
    with claimed(tmp_path):
        assert (tmp_path / ".lock.owner").read_text().split()[1] == str(os.getpid())
    (tmp_path / ".lock.owner").write_text("elsewhere 1\n")
    with pytest.raises(RunDirError, match="pid 1 on elsewhere"), claimed(tmp_path):
        pass
    assert (tmp_path / ".lock.owner").read_text() == "elsewhere 1\n"


# CI checks everything: a missing prerequisite fails under CI=true, never skips
@pytest.mark.slow
def test_tests_missing_the_cluster_or_the_data_fail_under_ci(tmp_path):
    env = {**os.environ, "CI": "true", "INCOFL_DATA_DIR": str(tmp_path), "PATH": str(Path(sys.executable).parent)}
    select = ["tests/test_slurm.py", "tests/test_sources.py::test_real_cifar10", "-p", "no:cacheprovider", "-q"]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", *select], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 1 and " skipped" not in proc.stdout, proc.stdout[-3000:]
    assert "no SLURM cluster" in proc.stdout and "real CIFAR-10 not found" in proc.stdout
    assert "CI=true: CI must provide it" in proc.stdout


@pytest.mark.parametrize(
    "data,slurm,ci,expected",
    [
        (False, True, "true", "no cifar10-jpeg.tar.xz"),
        (True, False, "true", "SLURM cluster did not start"),
        (True, False, "", "WARNING"),
    ],
)
def test_ci_run_stops_without_the_archive_or_the_cluster(tmp_path, data, slurm, ci, expected):
    """.ci/run with stand-ins: `make` succeeds (no install, no tests), `bash .ci/slurm-up.sh` as told."""
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for name, rc in (("make", 0), ("bash", 0 if slurm else 1)):
        (stubs / name).write_text(f"#!/bin/sh\nexit {rc}\n")
        (stubs / name).chmod(0o755)
    if data:
        (tmp_path / "cifar10-jpeg.tar.xz").touch()
    env = {**os.environ, "CI": ci, "INCOFL_DATA_DIR": str(tmp_path), "PATH": f"{stubs}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run(["/bin/bash", str(REPO / ".ci" / "run")], env=env, capture_output=True, text=True, timeout=60)
    errors = [line for line in proc.stderr.splitlines() if not line.startswith("[ci]")]
    assert len(errors) == 1 and expected in errors[0], proc.stderr
    assert proc.returncode == (2 if ci else 0), proc.stderr


# configs are data: a YTE template is refused, never evaluated
@pytest.mark.slow
def test_workflow_refuses_yte_configs_and_never_evaluates_them(tmp_path):
    from workflows import TINY, run_snakemake

    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.yaml"
    evil.write_text(f'__use_yte__: true\n{TINY.read_text()}\nrounds: ?open("{marker}", "w") and 2\n')
    for args, names in (
        ((), "evil.yaml: __use_yte__: configs are data"),
        (("--configfile", str(TINY)), "--configfile: give the experiment as --config"),
    ):
        proc = run_snakemake(tmp_path / "work", "--dry-run", *args, config=evil, timeout=300)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and names in lines[-1], proc.stderr[-3000:]
    assert not marker.exists() and not (tmp_path / "work" / "results").exists()
