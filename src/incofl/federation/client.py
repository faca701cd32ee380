"""One client of a real federation, without Flower: the run's engine built on the node from
the config and that client's data alone (sitedata.py), used for its trainer and objective.

A planned round: the objective receives the server's broadcast (SCAFFOLD's c), then the
engine's client side (`Engine.client`) lays what this client keeps over the server's start
weights and trains exactly as the simulator does (the config's trainer, the method's objective,
the client's own batch stream). What the client keeps across rounds (the engine's ClientStore:
its kept entries, SCAFFOLD's c_i, MOON's previous models) goes in and out as one blob, the
store's `state_dict`, which the Flower app keeps in the node's `Context.state`.
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path
from typing import Any

import torch

from incofl.config import RunConfig
from incofl.federation.sitedata import load_site
from incofl.fl.contracts import ClientPlan, ClientUpdate, State
from incofl.fl.engine.engine import Engine, resolve_device
from incofl.fl.stages.client import KEPT


def pack(state: dict[str, Any]) -> bytes:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def unpack(blob: bytes) -> dict[str, Any]:
    """A packed client state (tensors, numbers, strings and containers only: no code runs)."""
    return torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)


def state_sha256(state: State) -> str:
    """SHA-256 of a state's names and bytes in order (as the run's fingerprint hashes them)."""
    digest = hashlib.sha256()
    for name, tensor in state.items():
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


class SiteClient:
    """Client `client` of the run `cfg`, with its data file (module docstring): the engine's
    client side (`Engine.client`, a ClientRunner) and objective, on the node's data alone."""

    def __init__(self, cfg: RunConfig, client: int, data_path: str | Path):
        self.cfg, self.client = cfg, client
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        data, partition = load_site(data_path, cfg, client)
        # the engine seeds the models' initialisation: the caller's random stream is left as it was
        with torch.random.fork_rng(devices=[]):
            self.engine = Engine(cfg, data, partition, resolve_device(cfg.device))

    def train(
        self, round_: int, plan: ClientPlan, start: State, broadcast: State, blob: bytes | None
    ) -> tuple[ClientUpdate, bytes, str]:
        """One planned round from the server's start weights and its objective's broadcast: the
        update, the client's new state and the hash of what it keeps (never sent itself)."""
        if plan.client != self.client:
            raise ValueError(f"a plan for client {plan.client} sent to client {self.client}'s node")
        engine = self.engine
        if blob:
            engine.clients.load_state_dict(unpack(blob))
        engine.objective.receive(plan.federation, broadcast)
        update = engine.client.train(round_, plan, start)
        return update, pack(engine.clients.state_dict()), state_sha256(engine.clients.get(KEPT, self.client) or {})
