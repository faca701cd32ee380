"""The round loop: sample, train locally, aggregate, evaluate, checkpoint, resume.

Nothing here depends on the method: the registry supplies a local objective and a server
rule. Outputs (in `out_dir`): metrics.csv, inco.csv (InCo diagnostics), summary.json,
train.log, and ckpt.pt while the run is unfinished.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from tqdm import tqdm

from incofl.atomic import atomic_path, write_json
from incofl.config import RunConfig
from incofl.data.augment import resolve_augment
from incofl.data.dataset import ImageDataset
from incofl.data.partition import Partition, make_partition
from incofl.data.tensors import to_device
from incofl.fl import checkpoint
from incofl.fl.client import ClientContext, ClientUpdate, evaluate, local_train, make_optimizer
from incofl.fl.methods import METHODS
from incofl.fl.sampling import client_seed, group_of, sample_schedule
from incofl.fl.server import apply_update
from incofl.models.family import build_model, check_nested

VIT_INPUT = 224


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


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


class Engine:
    """One federated run: models per group, server states, and the method's hooks."""

    def __init__(self, cfg: RunConfig, data: ImageDataset, partition: Partition, device: torch.device):
        self.cfg, self.device, self.parts = cfg, device, partition.parts
        if len(self.parts) != cfg.clients:
            raise ValueError(f"partition has {len(self.parts)} clients, config has clients={cfg.clients}")
        vit = cfg.models[0].startswith("vit")
        input_size = VIT_INPUT if vit else data.image_size
        self.train_data, self.test_data = to_device(data, device, input_size, resolve_augment(cfg.augment, cfg.dataset))
        torch.manual_seed(cfg.seed)
        method = METHODS[cfg.method]
        model_kwargs = method.model_kwargs(cfg.method_args)  # e.g. MOON's projection head
        self.models = [
            build_model(
                name,
                data.num_classes,
                data.channels,
                stem=cfg.stem,
                pretrained=cfg.pretrained,
                image_size=input_size,
                **model_kwargs,
            ).to(device)
            for name in cfg.models
        ]
        if cfg.channels_last:
            self.models = [m.to(memory_format=torch.channels_last) for m in self.models]
        server = self.models[check_nested(self.models)].state_dict()
        self.names = [list(m.state_dict()) for m in self.models]
        self.objective, self.rule = method.build(list(server), cfg.method_args, cfg.local_epochs)
        self.federation_size = Counter(
            self.rule.state_index(group_of(c, cfg.clients, cfg.groups)) for c in range(cfg.clients)
        )
        if self.rule.shared:
            self.states = [{k: v.detach().clone() for k, v in server.items()}]
        else:
            self.states = [{k: server[k].detach().clone() for k in names} for names in self.names]
        self.schedule = sample_schedule(cfg.seed, cfg.clients, cfg.ratio, cfg.rounds)

    def sub_state(self, group: int) -> dict[str, torch.Tensor]:
        state = self.states[self.rule.state_index(group)]
        return {k: state[k] for k in self.names[group]}

    def train_client(self, round_: int, client: int) -> ClientUpdate:
        cfg, group = self.cfg, group_of(client, self.cfg.clients, self.cfg.groups)
        model, start, state = self.models[group], self.sub_state(group), self.rule.state_index(group)
        model.load_state_dict(start)  # copies: `start` stays the untouched global weights
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = make_optimizer(params, cfg.optimizer, cfg.lr, cfg.momentum, cfg.weight_decay)
        ctx = ClientContext(
            client,
            group,
            round_,
            model,
            start,
            cfg.lr,
            momentum=optimizer.param_groups[0].get("momentum", 0.0),
            state=state,
            federation_size=self.federation_size[state],
        )
        gen = torch.Generator().manual_seed(client_seed(cfg.seed, round_, client))
        local_train(
            ctx,
            self.objective,
            self.train_data,
            self.parts[client],
            epochs=cfg.local_epochs,
            batch_size=cfg.batch_size,
            optimizer=optimizer,
            gen=gen,
            autocast=cfg.bf16 and self.device.type == "cuda",
        )
        delta = {k: v.detach() - start[k] for k, v in model.state_dict().items() if v.is_floating_point()}
        update = ClientUpdate(client, group, delta, len(self.parts[client]), ctx.steps, state=state)
        return self.objective.end(ctx, update)

    def run_round(self, round_: int) -> int:
        """One communication round; returns the number of training samples processed."""
        updates = self.objective.before_aggregate([self.train_client(round_, int(c)) for c in self.schedule[round_]])
        for index, update in self.rule.aggregate(updates).items():
            apply_update(self.states[index], update)
        self.objective.server_round_end(updates, self.cfg.clients)
        return self.cfg.local_epochs * sum(u.num_samples for u in updates)

    def evaluate(self) -> tuple[list[float], list[float]]:
        accs, losses = [], []
        for group, model in enumerate(self.models):
            model.load_state_dict(self.sub_state(group))
            acc, loss = evaluate(model, self.test_data, self.cfg.eval_batch_size)
            accs.append(acc)
            losses.append(loss)
        return accs, losses

    def fingerprint(self) -> str:
        """SHA-256 of every server state entry (name and bytes, in order): equal iff the weights are."""
        digest = hashlib.sha256()
        for state in self.states:
            for name, tensor in state.items():
                digest.update(name.encode())
                digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
        return digest.hexdigest()

    def state_dict(self) -> dict[str, Any]:
        return {
            "states": [{k: v.cpu() for k, v in s.items()} for s in self.states],
            "objective": self.objective.state_dict(),
        }

    def load_state_dict(self, payload: dict[str, Any]) -> None:
        for ours, saved in zip(self.states, payload["states"], strict=True):
            for k, v in saved.items():
                ours[k].copy_(v)
        self.objective.load_state_dict(payload["objective"])


class Run:
    """Drives an Engine through its rounds with metrics, checkpoints and resume."""

    def __init__(self, cfg: RunConfig, engine: Engine, out_dir: Path):
        self.cfg, self.engine, self.out = cfg, engine, out_dir
        self.log = _file_logger(out_dir / "train.log")
        self.ckpt = out_dir / "ckpt.pt"
        self.rows: list[dict[str, float]] = []
        self.inco_rows: list[dict[str, Any]] = []
        self.round, self.elapsed, self.samples = 0, 0.0, 0

    def resume(self) -> None:
        payload = checkpoint.load(self.ckpt, self.cfg.model_dump())
        if payload is None:
            return
        self.engine.load_state_dict(payload["engine"])
        self.rows, self.inco_rows = payload["rows"], payload["inco_rows"]
        self.round, self.elapsed, self.samples = payload["round"], payload["elapsed"], payload["samples"]
        torch.set_rng_state(payload["torch_rng"])
        self.log.info("resumed from %s after round %d", self.ckpt, self.round)

    def save(self) -> None:
        checkpoint.save(
            self.ckpt,
            {
                "engine": self.engine.state_dict(),
                "rows": self.rows,
                "inco_rows": self.inco_rows,
                "round": self.round,
                "elapsed": self.elapsed,
                "samples": self.samples,
                "torch_rng": torch.get_rng_state(),
                "config": checkpoint.semantic_config(self.cfg.model_dump()),
            },
        )

    def record(self, round_: int) -> dict[str, float]:
        accs, losses = self.engine.evaluate()
        row = {
            "round": round_,
            "mean_acc": float(np.mean(accs)),
            "mean_loss": float(np.mean(losses)),
            **{f"acc_g{g}": a for g, a in enumerate(accs)},
            "seconds": round(self.elapsed, 3),
        }
        self.rows.append(row)
        with atomic_path(self.out / "metrics.csv") as tmp:
            pd.DataFrame(self.rows).to_csv(tmp, index=False)
        self.log.info(
            "round %d: mean acc %.2f%% loss %.4f groups %s",
            round_,
            row["mean_acc"],
            row["mean_loss"],
            " ".join(f"{a:.1f}" for a in accs),
        )
        return row

    def execute(self) -> dict[str, Any]:
        cfg = self.cfg
        self.resume()
        self.log.info(
            "run %s %s alpha=%s seed=%d: rounds %d..%d",
            cfg.method,
            cfg.dataset,
            cfg.alpha,
            cfg.seed,
            self.round + 1,
            cfg.rounds,
        )
        bar = tqdm(
            range(self.round, cfg.rounds),
            initial=self.round,
            total=cfg.rounds,
            disable=not cfg.progress,
            desc=f"{cfg.method} {cfg.dataset} a={cfg.alpha} s={cfg.seed}",
            unit="round",
        )
        for t in bar:
            start = time.perf_counter()
            self.samples += self.engine.run_round(t)
            seconds = time.perf_counter() - start
            self.elapsed += seconds
            self.round = t + 1
            self.log.info("round %d/%d trained in %.1f s", self.round, cfg.rounds, seconds)
            self.inco_rows += [{"round": self.round, "layer": k, **v} for k, v in self.engine.rule.stats.items()]
            if evaluated(self.round, cfg):
                bar.set_postfix(acc=f"{self.record(self.round)['mean_acc']:.2f}")
            if self.round % cfg.checkpoint_every == 0 and self.round < cfg.rounds:
                self.save()
        return self.finish()

    def finish(self) -> dict[str, Any]:
        cfg, accs = self.cfg, [r["mean_acc"] for r in self.rows]
        final = self.rows[-1]
        summary = {
            "method": cfg.method,
            "dataset": cfg.dataset,
            "alpha": cfg.alpha,
            "seed": cfg.seed,
            "rounds": cfg.rounds,
            "final_acc": final["mean_acc"],
            "best_acc": max(accs),
            "best_round": int(self.rows[int(np.argmax(accs))]["round"]),
            "last10_acc": float(np.mean([r["mean_acc"] for r in self.rows if r["round"] > cfg.rounds - 10])),
            "group_final_acc": [final[f"acc_g{g}"] for g in range(cfg.groups)],
            "final_loss": final["mean_loss"],
            "wall_s": round(self.elapsed, 3),
            "samples_per_s": round(self.samples / max(self.elapsed, 1e-9), 1),
            "state_sha256": self.engine.fingerprint(),
            "device": str(self.engine.device),
            "torch": torch.__version__,
            "config": cfg.model_dump(),
        }
        if self.inco_rows:
            with atomic_path(self.out / "inco.csv") as tmp:
                pd.DataFrame(self.inco_rows).to_csv(tmp, index=False)
        write_json(self.out / "summary.json", summary)
        if cfg.keep_checkpoint:
            self.save()
        else:
            self.ckpt.unlink(missing_ok=True)
        self.log.info(
            "done: final %.2f%% best %.2f%% last10 %.2f%%",
            summary["final_acc"],
            summary["best_acc"],
            summary["last10_acc"],
        )
        return summary


def partition_for(cfg: RunConfig, labels: np.ndarray) -> Partition:
    """The config's partition artifact if given, else the same partition computed in memory."""
    if cfg.partition_file:
        return Partition.load(cfg.partition_file)
    return make_partition(
        labels,
        kind=cfg.partition,
        num_clients=cfg.clients,
        alpha=cfg.alpha,
        seed=cfg.partition_seed,
        min_size=cfg.min_size,
        max_retries=cfg.max_retries,
        dataset=cfg.dataset,
    )


def train(cfg: RunConfig, out_dir: str | Path, data: ImageDataset | None = None) -> dict[str, Any]:
    """Run (or resume) one configured training run and return its summary."""
    from incofl.data.sources import load_dataset

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    data = data or load_dataset(cfg.dataset, cfg.data_dir, cfg.cache_dir)
    engine = Engine(cfg, data, partition_for(cfg, data.y_train), resolve_device(cfg.device))
    return Run(cfg, engine, out).execute()
