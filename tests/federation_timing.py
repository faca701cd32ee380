"""docs/performance.md's Flower numbers: seconds per round of the same digits run through the
simulator and the in-process Flower path, and bytes per round each way, in a fresh folder.

    PYTHONPATH=src python tests/federation_timing.py /tmp/timing [DEPLOYED_RUN_DIR]

DEPLOYED_RUN_DIR: a localhost deployment's run folder of the same run (test_federation_deploy.py's
`deployed`, kept with pytest --basetemp), whose rounds are printed beside them.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
from federation_helpers import run_both
from test_federation_deploy import DEPLOYED


def main(folder: Path, deployed: Path | None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    _, _, sim, fed = run_both(folder, **DEPLOYED)
    runs = {"simulator": sim, "in-process Flower": fed, **({"localhost deployment": deployed} if deployed else {})}
    for name, run in runs.items():
        seconds = pd.read_csv(run / "rounds.csv")["seconds"].tolist()
        print(f"{name}: seconds per round {', '.join(f'{s:.2f}' for s in seconds)}")
    traffic = pd.read_csv(fed / "federation.csv").query("stage == 'train'")
    traffic = traffic.groupby("round")[["down_bytes", "up_bytes"]].sum()
    costs = pd.read_csv(sim / "rounds.csv").set_index("round")["upload_bytes"]
    print(traffic.assign(cost_accounting_upload=costs).to_string())


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]) if len(sys.argv) > 2 else None)
