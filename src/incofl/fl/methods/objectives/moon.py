"""MOON (Li, He & Song, CVPR 2021): model-contrastive local training.

loss = CE(logits, y) + mu * CE([cos(z, z_glob), cos(z, z_prev_1), ...] / T, target 0), with
z the projection of this model, z_glob that of the global (sub-)model the client started
from and z_prev those of its previous local models (a FIFO pool of `pool_size`). The models
carry MOON's projection head (`projection_dim`, models/projection.py; 0 builds none and z is
the features, MOON code's `use_project_head=0`); the frozen models run in eval mode, as in
MOON's code. Defaults: mu = 5 and T = 0.5 (the MOON paper's CIFAR-10 setting; NIID-Bench's
code defaults to mu = 0.001 without a projection head), pool 1, 256 dims.

A client with no previous model yet (every client in round one, and later a client sampled
for the first time) uses the global model as its negative. Then both logits are equal and
the contrastive term is the constant log 2 with zero gradient, which is what MOON's code
computes in round one (its pool is empty, so the logits hold only the positive and the term
is 0). MOON's code differs later: with partial participation it compares a client sampled
for the first time with that client's own randomly initialised, never-trained network, an
artifact of keeping one model object per client, which the algorithm does not call for.

Previous models are kept compactly: per client, the floating-point state entries only
(weights and BN statistics, what the eval-mode forward needs), in the run's client store
(fl/stages/clientstore.py, space "moon": in memory up to `client_memory_mb`, on disk beyond
it, checkpointed with the run). On the device the objective keeps sets
of frozen copies per model group (global and previous; 1 + pool_size in general), reloaded
for each client; a session borrows a set and returns it at its end, so clients training side
by side get one set each and clients in turn share one.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from incofl.fl.contracts import ClientContext, ClientUpdate, Setup, State
from incofl.fl.methods.objectives.spec import MoonParams
from incofl.fl.stages.objective import ClientObjective, Objective, Session

SPACE = "moon"  # the client store's space of the clients' previous models


def pack(models: list[State]) -> State:
    """Previous models, oldest first, as one state: entry `name` of model i is `i:name`."""
    return {f"{i}:{name}": v for i, model in enumerate(models) for name, v in model.items()}


def unpack(state: State) -> list[State]:
    models: dict[int, State] = {}
    for key, v in state.items():
        i, name = key.split(":", 1)
        models.setdefault(int(i), {})[name] = v
    return [models[i] for i in sorted(models)]


def moon_loss(
    logits: torch.Tensor,
    y: torch.Tensor,
    z: torch.Tensor,
    z_glob: torch.Tensor,
    z_prevs: list[torch.Tensor],
    mu: float,
    temperature: float,
) -> torch.Tensor:
    """Cross-entropy plus MOON's model-contrastive term (the positive pair is column 0)."""
    sims = torch.stack([F.cosine_similarity(z, other, dim=-1) for other in (z_glob, *z_prevs)], dim=1)
    target = torch.zeros(len(z), dtype=torch.long, device=z.device)
    return F.cross_entropy(logits, y) + mu * F.cross_entropy(sims / temperature, target)


class MoonSession(Session):
    objective: MoonClient

    def __init__(self, objective: MoonClient, ctx: ClientContext):
        super().__init__(objective, ctx)
        self.frozen = objective.borrow(ctx)
        self.previous = previous = unpack(objective.store.get(SPACE, ctx.client) or {})
        self.frozen[0].load_state_dict(ctx.global_state)
        for model, state in zip(self.frozen[1:], previous, strict=False):
            model.load_state_dict(state, strict=False)  # float entries only: BN batch counters stay
        self.models = self.frozen[: 1 + len(previous)]  # [global, previous...]

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        model, hp = self.ctx.model, self.objective.hp
        z = model.embed(x)
        glob, *previous = self.models
        with torch.no_grad():
            z_glob = glob.embed(x)
            z_prevs = [m.embed(x) for m in previous] or [z_glob]  # no previous model yet: the global one
        return moon_loss(model.classify(z), y, z, z_glob, z_prevs, float(hp.mu), float(hp.temperature))

    def end(self, update: ClientUpdate) -> ClientUpdate:
        # a real copy: on the CPU, state_dict() shares storage with the model trained next
        model = {
            k: v.detach().to("cpu", copy=True) for k, v in self.ctx.model.state_dict().items() if v.is_floating_point()
        }
        pool = [*self.previous, model][-int(self.objective.hp.pool_size) :]
        self.objective.store.put(SPACE, self.ctx.client, pack(pool))
        self.objective.spare[self.ctx.group].append(self.frozen)
        return update


class MoonClient(ClientObjective):
    session_type = MoonSession
    model_args = ("projection_dim",)
    scratch = ("spare",)  # frozen model copies lent to sessions: reused, never state

    def __init__(self, hp: MoonParams, setup: Setup):
        super().__init__(hp, setup)
        self.spare: dict[int, list[list[nn.Module]]] = {}  # group -> free sets [global, previous...] on the device

    def borrow(self, ctx: ClientContext) -> list[nn.Module]:
        """A set of 1 + pool_size frozen copies of the client's architecture."""
        spare = self.spare.setdefault(ctx.group, [])
        if spare:
            return spare.pop()
        return [copy.deepcopy(ctx.model).eval().requires_grad_(False) for _ in range(1 + int(self.hp.pool_size))]


class Moon(Objective):
    """MOON's server half: FedAvg's (the contrastive term and the previous models are the clients')."""

    client = MoonClient
