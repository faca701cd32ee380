"""A run: drives an Engine through its rounds with metrics, checkpoints and resume.

Outputs (in `out_dir`): metrics.csv (every evaluated round), rounds.csv (per-round costs), the
method's observer files (InCo: inco.csv), summary.json (written last, atomically: it marks a
finished run), train.log, and while the run is unfinished ckpt.pt and clientstate/ (the client
store's files beyond its memory budget, fl/stages/clientstore.py).
"""

from __future__ import annotations

import json
import logging
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from tqdm import tqdm

from incofl.atomic import atomic_path, write_json
from incofl.config import RunConfig
from incofl.errors import Diverged
from incofl.fl.contracts import Round
from incofl.fl.engine import checkpoint
from incofl.fl.engine.engine import Engine
from incofl.fl.engine.estimate import Work
from incofl.fl.engine.hardware import cpu_model, hardware_kind


def evaluated(round_: int, cfg: RunConfig) -> bool:
    """Rounds scored on the test set: every `eval_every`-th, each of the last `eval_last`, and the last."""
    return round_ % cfg.eval_every == 0 or round_ > cfg.rounds - cfg.eval_last or round_ == cfg.rounds


def _file_logger(path: Path) -> logging.Logger:
    log = logging.getLogger(f"incofl.run.{path.parent}")
    log.handlers.clear()
    log.propagate = False
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    return log


class Run:
    """Drives an Engine through its rounds with metrics, checkpoints and resume."""

    def __init__(self, cfg: RunConfig, engine: Engine, out_dir: Path):
        self.cfg, self.engine, self.out = cfg, engine, out_dir
        self.log = _file_logger(out_dir / "train.log")
        self.ckpt, self.clientstate = out_dir / "ckpt.pt", out_dir / "clientstate"
        self.rows: list[dict[str, float]] = []
        self.done, self.elapsed, self.samples = 0, 0.0, 0  # done: the rounds done

    def resume(self) -> None:
        payload = checkpoint.load(self.ckpt, self.cfg.model_dump())
        if payload is None:
            return
        try:
            self.engine.load_state_dict(payload["engine"])
        except checkpoint.CheckpointMismatch as err:
            raise checkpoint.CheckpointMismatch(f"{self.ckpt}: {err}") from None
        self.rows = payload["rows"]
        self.done, self.elapsed, self.samples = payload["round"], payload["elapsed"], payload["samples"]
        torch.set_rng_state(payload["torch_rng"])
        self.log.info("resumed from %s after round %d", self.ckpt, self.done)

    def save(self) -> None:
        checkpoint.save(
            self.ckpt,
            {
                "engine": self.engine.state_dict(),
                "rows": self.rows,
                "round": self.done,  # the rounds done
                "elapsed": self.elapsed,
                "samples": self.samples,
                "torch_rng": torch.get_rng_state(),
                "config": checkpoint.semantic_config(self.cfg.model_dump()),
            },
        )

    def say(self, line: str) -> None:
        """To train.log and stderr (the workflow's job log), beside the progress bar."""
        self.log.info(line)
        tqdm.write(line, file=sys.stderr)

    def record(self, round_: Round) -> dict[str, float]:
        costs = self.engine.server.costs.totals()  # upload bytes and compute units so far
        row = {"round": round_.number, **self.engine.evaluate(round_), "seconds": round(self.elapsed, 3), **costs}
        accs = [row[f"acc_g{g}"] for g in range(self.cfg.groups)]
        self.rows.append(row)
        with atomic_path(self.out / "metrics.csv") as tmp:
            pd.DataFrame(self.rows).to_csv(tmp, index=False)
        self.log.info(
            "round %d: mean acc %.2f%% loss %.4f groups %s",
            round_.number,
            row["mean_acc"],
            row["mean_loss"],
            " ".join(f"{a:.1f}" for a in accs),
        )
        return row

    def finished(self) -> dict[str, Any] | None:
        """The summary of this run if it already finished (with these settings; others are refused).
        A summary.json marks a finished run, with or without a kept checkpoint."""
        path = self.out / "summary.json"
        if not path.exists():
            return None
        try:
            summary = json.loads(path.read_text())
            theirs = summary["config"]
            if not isinstance(theirs, dict):
                raise TypeError
        except (ValueError, KeyError, TypeError):  # ValueError: not JSON, or not UTF-8
            raise checkpoint.CheckpointMismatch(
                f"{path}: not the summary.json of an incofl run (unreadable, or without its config); delete it or "
                "use another --out"
            ) from None
        checkpoint.check_same(path, theirs, self.cfg.model_dump(), f"delete {self.out} or use another --out")
        if not self.cfg.keep_checkpoint:  # a kill after summary.json, before the checkpoint's removal
            self.drop_checkpoint()
        return summary

    def drop_checkpoint(self) -> None:
        """ckpt.pt, then the client states it names (a kill between the two leaves only the folder,
        which the next start's `finished` drops)."""
        self.ckpt.unlink(missing_ok=True)
        shutil.rmtree(self.clientstate, ignore_errors=True)

    def execute(self) -> dict[str, Any]:
        cfg = self.cfg
        done = self.finished()
        if done is not None:
            self.log.info("already finished: %s", self.out / "summary.json")
            if done.get("status") == "diverged":
                raise Diverged(done["diverged_round"], done["diverged"])
            return done
        self.resume()
        self.engine.attach(self.clientstate)  # after resume: drops files its checkpoint does not name
        self.log.info(
            "run %s %s alpha=%s seed=%d: rounds %d..%d",
            cfg.name,
            cfg.dataset,
            cfg.alpha,
            cfg.seed,
            self.done + 1,
            cfg.rounds,
        )
        work, first = Work(self.engine.server, self.done), self.done
        self.say(work.line())
        bar = tqdm(
            Round.upto(cfg.rounds)[self.done :],
            initial=self.done,
            total=cfg.rounds,
            disable=not cfg.progress,
            desc=f"{cfg.name} {cfg.dataset} a={cfg.alpha} s={cfg.seed}",
            unit="round",
        )
        clients = tqdm(total=0, disable=not cfg.progress, desc="clients", unit="client", leave=False, position=1)
        self.engine.tick = clients.update  # the round's clients as each one's update is folded in
        for round_ in bar:
            clients.reset(total=len(self.engine.server.schedule[round_.index]))
            start = time.perf_counter()
            try:
                report = self.engine.run_round(round_)
            except Diverged as err:
                self.finish(diverged=err)
                raise
            report.seconds = time.perf_counter() - start
            self.engine.observe(report)
            self.elapsed, self.samples = self.elapsed + report.seconds, self.samples + report.samples
            self.done = round_.number
            self.log.info("round %d/%d trained in %.1f s", self.done, cfg.rounds, report.seconds)
            if round_.index == first and self.done < cfg.rounds:
                self.say(work.time_line(report.seconds))
            if evaluated(self.done, cfg):
                bar.set_postfix(acc=f"{self.record(round_)['mean_acc']:.2f}")
            if checkpoint.checkpointed(self.done, cfg.checkpoint_every, cfg.rounds):
                self.save()
        clients.close()
        return self.finish()

    def finish(self, diverged: Diverged | None = None) -> dict[str, Any]:
        """summary.json (last, atomically: it marks a finished run). A diverged run reports
        where it diverged and no accuracy."""
        cfg = self.cfg
        summary = {
            "method": cfg.name,  # a variant's label
            "dataset": cfg.dataset,
            "alpha": cfg.alpha,
            "seed": cfg.seed,
            "rounds": cfg.rounds,
            "status": "completed" if diverged is None else "diverged",
            **(self.accuracy() if diverged is None else {"diverged_round": diverged.round, "diverged": diverged.where}),
            "wall_s": round(self.elapsed, 3),
            "samples_per_s": round(self.samples / max(self.elapsed, 1e-9), 1),
            **self.engine.server.costs.totals(),
            **self.engine.server.planner.summary(),
            "device": str(self.engine.server.device),
            "hardware": hardware_kind(self.engine.server.device, cfg.numerics),  # one kind and threads: bit-identical
            "cpu": cpu_model(),
            "numerics": cfg.numerics,
            "torch": torch.__version__,
            "config": cfg.model_dump(),
        }
        for observer in self.engine.server.observers:
            observer.write(self.out)
        write_json(self.out / "summary.json", summary, strict=True)
        if cfg.keep_checkpoint and diverged is None:
            self.save()
        else:
            self.drop_checkpoint()
        if diverged is None:
            self.log.info(
                "done: final %.2f%% best %.2f%% last10 %.2f%%",
                summary["final_acc"],
                summary["best_acc"],
                summary["last10_acc"],
            )
        else:
            self.log.error("%s", diverged)
        return summary

    def accuracy(self) -> dict[str, Any]:
        """The completed run's accuracies (final, best, mean of the last 10 rounds) and weights' hash."""
        cfg, accs = self.cfg, [r["mean_acc"] for r in self.rows]
        final = self.rows[-1]
        return {
            "final_acc": final["mean_acc"],
            "best_acc": max(accs),
            "best_round": int(self.rows[int(np.argmax(accs))]["round"]),
            "last10_acc": float(np.mean([r["mean_acc"] for r in self.rows if r["round"] > cfg.rounds - 10])),
            "group_final_acc": [final[f"acc_g{g}"] for g in range(cfg.groups)],
            "final_loss": final["mean_loss"],
            **self.engine.server.layout.summary(self.rows),
            "state_sha256": self.engine.fingerprint(),
        }
