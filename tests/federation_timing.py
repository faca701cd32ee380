"""docs/performance.md's Flower numbers: seconds per round of the same digits run through the
simulator, the in-process Flower path and `incofl federation up` with both sites (its defaults:
TLS, node keys, each node's warm executor), bytes per round each way, and what a node whose
messages each run in a fresh `flwr-clientapp` process (Flower's own SuperExec: a node started
apart, or `up --insecure`) pays for each message before it trains, in a fresh folder.

    cd tests && PYTHONPATH=../src:. python federation_timing.py /tmp/timing [DEPLOYED_RUN_DIR] [--up FLAGS]

DEPLOYED_RUN_DIR: another deployment's run folder of the same run (test_federation_deploy.py's
`deployed`, one node under `up` and one started apart, kept with pytest --basetemp), whose
rounds are printed beside them. --up: flags for `up` besides its defaults, one string
(`--up "--link-state disk"`).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
from federation_helpers import free_port, run_both
from test_federation_deploy import DEPLOYED, REPO

# What a fresh process does before a message's training, step by step (each step includes the ones before).
NODE_STEPS = {
    "start Python": "pass",
    "import torch": "import torch",
    "and timm, torchvision, pandas (incofl's engine imports them)": (
        "import torch, timm.models.vision_transformer, torchvision.transforms.v2.functional, pandas"
    ),
    "import flwr's and incofl's ClientApp": "import incofl.deploy.site.clientapp",
    "read the site file, build the client's engine": (
        "import incofl.deploy.site.clientapp\n"
        "from incofl.config import load_run_config\n"
        "from incofl.deploy.site.client import SiteClient\n"
        "from incofl.deploy.wire.schedule import Schedule, schedule_of\n"
        "SiteClient(Schedule.read(schedule_of(load_run_config({config!r}))), 0, {site!r}, {state!r})"
    ),
}


def node_costs(folder: Path, repeats: int = 5) -> dict[str, float]:
    """Median seconds of each of NODE_STEPS in a fresh process, for client 0 of the timed run."""
    fields = {"config": str(folder / "run.yaml"), "site": str(folder / "site0.npz"), "state": str(folder / "state")}
    costs = {}
    for step, code in NODE_STEPS.items():
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            subprocess.run([sys.executable, "-c", code.format(**fields)], check=True)
            times.append(time.perf_counter() - start)
        costs[step] = statistics.median(times)
    return costs


def site_read(folder: Path, repeats: int = 5) -> float:
    """Median seconds of reading client 0's site file (an uncompressed .npz) and checking it against the config."""
    from incofl.config import load_run_config
    from incofl.deploy.site.sitedata import load_site
    from incofl.sides import PartitionSettings

    cfg = load_run_config(folder / "run.yaml")
    digest = PartitionSettings.of(cfg).digest()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        load_site(folder / "site0.npz", cfg.dataset, 0, digest)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def cpu_seconds(root: int) -> float:
    """CPU seconds (user and system) used so far by the live descendants of process `root`."""
    children: dict[int, list[tuple[int, int]]] = {}
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text() if entry.name.isdigit() else ""
        except OSError:
            continue
        if stat:
            fields = stat[stat.rindex(")") + 2 :].split()
            children.setdefault(int(fields[1]), []).append((int(entry.name), int(fields[11]) + int(fields[12])))
    ticks, todo = 0, [root]
    while todo:
        for pid, used in children.get(todo.pop(), []):
            ticks, todo = ticks + used, [*todo, pid]
    return ticks / os.sysconf("SC_CLK_TCK")


def deployed_by_up(folder: Path, idle: float = 30.0, flags: tuple[str, ...] = ()) -> tuple[Path, float]:
    """The timed run on `incofl federation up --sites` (both clients' files, its defaults and
    `flags`): its run folder, and the share of a core that the federation used idle for `idle`
    seconds before it."""
    env = {**os.environ, "FLWR_HOME": str(folder / "flwr-home"), "PYTHONPATH": str(REPO / "src")}
    incofl = [sys.executable, "-m", "incofl.cli", "federation"]
    sites, out, port = folder / "sites", folder / "deployed", free_port(2 + DEPLOYED["clients"])
    subprocess.run([*incofl, "export", "--config", folder / "run.yaml", "--out", sites, "--keys"], env=env, check=True)
    with open(folder / "up.log", "w") as log:
        up = subprocess.Popen([*incofl, "up", "--sites", sites, "--port", str(port), *flags], stdout=log, env=env)
        try:
            while "federation up:" not in (folder / "up.log").read_text():
                time.sleep(0.2)
            time.sleep(15)  # settled: each node's executor imports torch and the engine as it starts
            before = cpu_seconds(up.pid)
            time.sleep(idle)
            share = (cpu_seconds(up.pid) - before) / idle
            settings = f'config="{folder / "run.yaml"}" out="{out}" node-keys="{sites / "keys"}" round-timeout=120'
            flwr = [Path(sys.executable).parent / "flwr", "run", REPO / "flower-app", "incofl-local"]
            subprocess.run([*flwr, "--run-config", settings], env=env, check=True, capture_output=True)
            while not (out / "summary.json").exists():
                time.sleep(0.2)
        finally:
            up.terminate()
            up.wait(timeout=60)
    return out, share


def main(folder: Path, deployed: Path | None, flags: tuple[str, ...] = ()) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    _, _, sim, fed = run_both(folder, **DEPLOYED)
    up, idle = deployed_by_up(folder, flags=flags)
    print(f"incofl federation up, idle: {idle:.1%} of a core")
    runs = {"simulator": sim, "in-process Flower": fed, "incofl federation up": up}
    runs |= {"a node under up, one apart": deployed} if deployed else {}
    for name, run in runs.items():
        seconds = pd.read_csv(run / "rounds.csv")["seconds"].tolist()
        print(f"{name}: seconds per round {', '.join(f'{s:.2f}' for s in seconds)}")
    traffic = pd.read_csv(fed / "federation.csv").query("stage == 'train'")
    traffic = traffic.groupby("round")[["down_bytes", "up_bytes"]].sum()
    costs = pd.read_csv(sim / "rounds.csv").set_index("round")["upload_bytes"]
    print(traffic.assign(cost_accounting_upload=costs).to_string())
    for step, seconds in node_costs(folder).items():
        print(f"a node's message, up to '{step}': {seconds:.2f} s")
    print(f"of which reading the site file: {site_read(folder):.4f} s")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("deployed", type=Path, nargs="?")
    parser.add_argument("--up", default="", help="flags for up besides its defaults, one string")
    args = parser.parse_args()
    main(args.folder, args.deployed, tuple(args.up.split()))
