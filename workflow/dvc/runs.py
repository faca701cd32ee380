"""Write workflow/dvc/runs.yaml: the `incofl train` command of every committed evidence run
(results/runs-*/), one `train` stage of dvc.yaml each (docs/workflow.md, "Reproduce with DVC").

    python workflow/dvc/runs.py            # after adding runs under results/runs-*/

A run's command is its grid's config file with `--set` for the grid point and for every setting
its summary.json records that differs from what the config gives that point (a study's batch
size, a collapse hypothesis, the GPU). The script checks that the command reproduces the recorded
settings and refuses a run it cannot express (exit 2)."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

import yaml

from incofl.atomic import write_text
from incofl.config import ConfigError, load_run_config

OUT = Path(__file__).with_name("runs.yaml")
# Which config made the runs of a root: the first of them whose grid names the run's method.
CONFIGS = {
    "runs-ivh": ["inco-vs-heteroavg"],
    "runs-ivh-gpu": ["inco-vs-heteroavg"],
    "runs-ivh-e5-gpu": ["inco-vs-heteroavg"],  # local_epochs=5 (the paper's E), on an H200
    "runs-ivh-release": ["inco-vs-heteroavg-release"],
    "runs-ivh-release-gpu": ["inco-vs-heteroavg-release"],
    "runs-collapse": ["cifar10-mini"],
    "runs-fedpart": ["fedpart-cpu"],
    "runs-fedlag": ["fedlag-cpu"],
    "runs-hetero": ["hetero-split-cpu", "scalefl-cpu"],
    "runs-hetero-gpu": ["hetero-split-cpu", "scalefl-cpu"],
    "runs-analysis": ["analysis-cpu"],
    "runs-studies": ["analysis-cpu"],
}
POINT = ("dataset", "alpha", "method", "seed")
# Where the run happened, not what it computed (the data cache, progress bars); or set by the
# stage itself (device: from where the run was made).
NOT_SETTINGS = {"cache_dir", "data_dir", "progress", "partition_file", "device", *POINT}


def _value(v: Any) -> str:
    """A --set value as YAML reads it back: a plain string where unambiguous, else JSON."""
    return v if isinstance(v, str) and v and yaml.safe_load(v) == v else json.dumps(v)


def _config(root: str, method: str) -> str:
    for name in CONFIGS[root]:
        grid = yaml.safe_load(Path(f"config/{name}.yaml").read_text())
        if method in [*grid["methods"], *(grid.get("variants") or {})]:
            return f"config/{name}.yaml"
    return f"config/{CONFIGS[root][0]}.yaml"


def command(summary: dict[str, Any], root: str) -> tuple[str, dict[str, Any]]:
    """The run's config file and its --set settings (point first), checked against the summary."""
    recorded = summary["config"]
    point = {
        "dataset": summary["dataset"],
        "alpha": summary["alpha"],
        "method": summary["method"],
        "seed": summary["seed"],
    }
    config = _config(root, point["method"])
    given = load_run_config(config, dict(point)).model_dump()
    sets = {k: v for k, v in recorded.items() if k not in NOT_SETTINGS and given.get(k, v) != v}
    sets |= {"device": "cuda"} if summary["device"].startswith("cuda") else {}
    remade = load_run_config(config, point | sets).model_dump()
    wrong = sorted(k for k in recorded.keys() - NOT_SETTINGS if remade.get(k, recorded[k]) != recorded[k])
    if wrong:
        raise ConfigError(f"{root}: {point}: the command does not give {wrong}")
    return config, point | sets


def runs() -> dict[str, dict[str, str]]:
    """Stage key -> config, out (the run folder) and the shell-quoted --set arguments."""
    entries = {}
    for path in sorted(Path("results").glob("runs-*/**/summary.json")):
        run = path.parent
        root = run.relative_to("results").parts[0]
        config, sets = command(json.loads(path.read_text()), root)
        key = "-".join(run.relative_to("results").parts).removeprefix("runs-")
        sets_text = " ".join(shlex.quote(f"{k}={_value(v)}") for k, v in sets.items())
        entries[key] = {"config": config, "out": str(run), "sets": sets_text}
    return entries


def main() -> int:
    try:
        entries = runs()
    except (ConfigError, KeyError) as err:
        print(f"runs.py: error: {err}", file=sys.stderr)
        return 2
    header = "# Written by workflow/dvc/runs.py from the runs' summary.json: do not edit.\n"
    write_text(OUT, header + yaml.safe_dump({"runs": entries}, sort_keys=False, width=200))
    print(f"{OUT}: {len(entries)} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
