"""The server side of a run: the global weights and every component of the round's stages that
acts on them.

It plans a round (`plan`: the seeded schedule's clients, each with its planner's plan), gives
each planned client its start weights (`start`: the layout's choice) and what its objective
broadcasts (`broadcasts`: SCAFFOLD's c), and folds the clients' updates into the round
(fl/engine/fold.py: check -> planner.observe -> pre transforms -> aggregate, then post
transforms -> apply -> the objective's server end). It scores its own weights and the client
models that need nothing of a client (`score`), says what it accepts of a client that trains or
scores elsewhere (`expect`, `expect_scores`), and is checkpointed component by component, by
role (`components`). It never trains: the client side (clients.py) does, reached through a
transport (exchange.py). It names no method, model family or model: a test greps it.

`build_server` builds it from the server's record of the run's settings (incofl.sides), the run's
facts (data/facts.py) and the test split: no training image, partition or augmentation reaches it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from incofl.data.facts import Facts, TestSplit
from incofl.data.tensors import TensorSplit
from incofl.fl.contracts import ClientPlan, ClientUpdate, Round, RoundReport, State, Trained
from incofl.fl.engine.checkpoint import CheckpointMismatch
from incofl.fl.engine.exchange import ExpectedScores, ExpectedUpdate
from incofl.fl.engine.fingerprint import run_fingerprint
from incofl.fl.engine.models import LaidOut, Shape, lay_out
from incofl.fl.stages.component import Stateful, expected_extra
from incofl.fl.stages.evaluation import Scores, scored_samples
from incofl.fl.stages.layout import HELD_OUT, ClientEval, ClientScores, Layout
from incofl.fl.stages.observers import CostLog
from incofl.fl.stages.probes import analyses_for
from incofl.fl.stages.sampling import local_steps, sample_schedule
from incofl.fl.stages.transforms import EpochScale, UpdateNoise
from incofl.models.family import exit_count

if TYPE_CHECKING:
    from incofl.sides import ServerSettings


class Server:
    """A run's server side (module docstring): `weights`, one state per federation (the global
    model each federation trains), and the method's stage components around them."""

    def __init__(self, laid: LaidOut, facts: Facts, test: TensorSplit, device: torch.device):
        self.settings, self.facts, self.test, self.device, self.layout = laid.settings, facts, test, device, laid.layout
        self.models, self.server_model = laid.models, laid.layout.server_model
        self.names = [list(m.state_dict()) for m in self.models]
        run, method, hp, setup = laid.settings, laid.method, laid.hp, laid.setup()
        self.objective = method.objective.cls(hp, setup)  # its server half: state, broadcast, round end
        self.aggregator = method.aggregator.cls(hp, setup)
        noise = [UpdateNoise(hp, setup)] if run.update_noise else []  # robustness: before any other transform
        self.pre = [*noise, *(transform.cls(hp, setup) for transform in method.pre)]
        scale = [EpochScale(hp, setup)] if run.scales_epochs else []  # the release's, for every method: first
        self.post = [*scale, *(transform.cls(hp, setup) for transform in method.post)]
        self.costs = CostLog(hp, setup)  # every method's; its totals go into metrics.csv and summary.json
        self.observers = [self.costs, *(observer.cls(hp, setup) for observer in method.observers)]
        self.observers += analyses_for(run, self.models, test)  # none unless `analyses` lists rounds
        self.planner = method.planner.cls(hp, setup)
        server = self.server_model.state_dict()
        if self.aggregator.shared:
            self.weights = [{k: v.detach().clone() for k, v in server.items()}]
        else:
            self.weights = [{k: server[k].detach().clone() for k in names} for names in self.names]
        self.schedule = sample_schedule(run.seed, run.clients, run.ratio, run.rounds)
        self.objective.begin(server)  # read-only; an objective keeps a copy if it needs one

    def components(self) -> list[tuple[str, Stateful]]:
        """Every stage component by its role: what a checkpoint holds the state of."""
        listed = [("pre", self.pre), ("post", self.post)]
        return [
            ("objective", self.objective),
            ("aggregator", self.aggregator),
            *((f"{stage}.{i}", c) for stage, components in listed for i, c in enumerate(components)),
            ("planner", self.planner),
            *((f"observers.{i}", o) for i, o in enumerate(self.observers)),
            ("layout", self.layout),
        ]

    def sub_state(self, group: int) -> State:
        """The global weights a group's model trains from and is evaluated with."""
        state = self.weights[self.aggregator.federation(group)]
        return {k: state[k] for k in self.names[group]}

    def plan(self, round_: Round) -> list[ClientPlan]:
        """Round `round_`'s sampled clients (its row of the seeded schedule), each with its planner's plan."""
        return [self.planner.plan(round_, int(c)) for c in self.schedule[round_.index]]

    def start(self, plan: ClientPlan) -> State:
        """The server's weights a planned client trains from (the layout's choice); the client
        lays what it keeps over them (ClientRunner.own_start)."""
        return self.layout.start(plan, self.weights, self.sub_state)

    def broadcasts(self, plans: list[ClientPlan]) -> dict[int, State]:
        """What the server's objective sends the planned clients of each federation besides the
        weights (its `broadcast`; a client's session reads server state only through it)."""
        return {
            federation: self.objective.broadcast(federation) for federation in sorted({p.federation for p in plans})
        }

    def trained(self, plan: ClientPlan, update: ClientUpdate) -> Trained:
        """A client's model after this round's training (before the round is applied): its start,
        what it keeps, and its update."""
        start = self.start(plan)
        state = {**start, **update.kept, **{k: start[k] + d for k, d in update.delta.items()}}
        return Trained(plan.client, plan.group, state, update.delta, plan.view)

    def observe(self, report: RoundReport) -> None:
        for observer in self.observers:
            observer.observe(report)

    def evaluate(self, client_scores: ClientScores) -> dict[str, float]:
        """The metrics of an evaluated round: the layout scores the global weights and the client
        models it lists (`client_scores`: where the clients are, or `score` here)."""
        return self.layout.evaluate(self.weights, client_scores)

    def score(self, job: ClientEval) -> Scores:
        """A listed client model scored here: one that keeps nothing, on the test split (its
        group's global weights are its model: Layout.on_client)."""
        return self.layout.score(job, self.sub_state(job.group))

    def expect(self, plan: ClientPlan, start: State) -> ExpectedUpdate:
        """What the server accepts from a planned client that trains from `start` (ExpectedUpdate):
        the trainer's rules (the plan's uploads, the client's facts: its share and the classes it
        holds, the batches of its schedule), the components' declarations of what their clients send."""
        run, facts = self.settings, self.facts.clients[plan.client]
        params = [name for name, _ in self.models[plan.group].named_parameters()]
        samples = facts.samples
        steps = local_steps(samples, run.local_epochs, run.batch_size, run.drop_last)
        return ExpectedUpdate(
            plan,
            {k: (tuple(start[k].shape), start[k].dtype) for k in plan.uploaded(start)},
            expected_extra([c for _, c in self.components()], plan, start, params, steps),
            samples,
            steps,
            plan.upload_params(start, params),
            torch.tensor(facts.classes, dtype=torch.int64),
        )

    def expect_scores(self, client: int, group: int, splits: tuple[str, ...]) -> ExpectedScores:
        """The samples each split scores (the held-out share, the test set as the evaluator batches
        it) and the exits of the client's model."""
        run, held_out = self.settings, self.facts.clients[client].held_out
        samples = tuple(
            held_out if split == HELD_OUT else scored_samples(len(self.test), run.eval_batch_size, run.drop_last)
            for split in splits
        )
        return ExpectedScores(client, samples, exit_count(self.models[group]))

    def fingerprint(self, kept_sha256: dict[int, str]) -> str:
        """The run's weights as one SHA-256 (fingerprint.py): the global weights and what clients keep."""
        return run_fingerprint(self.weights, kept_sha256)

    def state_dict(self) -> dict[str, Any]:
        """The global weights and every component's state by its role."""
        return {
            "states": [{k: v.cpu() for k, v in s.items()} for s in self.weights],
            "components": {role: c.state_dict() for role, c in self.components()},
            "kinds": self.kinds(),
        }

    def load_state_dict(self, payload: dict[str, Any]) -> None:
        """Restore `state_dict`; a checkpoint of other components (another method or settings,
        or an older incofl's) is refused with one line naming the first role that differs."""
        ours, theirs = self.kinds(), payload.get("kinds", {})
        if theirs != ours:
            role = next(r for r in [*ours, *theirs] if ours.get(r) != theirs.get(r))
            had, have = theirs.get(role, "absent"), ours.get(role, "absent")
            raise CheckpointMismatch(
                f"components: the checkpoint's {role} is {had}, this run's {have}; "
                "delete the checkpoint or use another --out"
            )
        for state, saved in zip(self.weights, payload["states"], strict=True):
            for k, v in saved.items():
                state[k].copy_(v)
        for role, component in self.components():
            component.load_state_dict(payload["components"][role])

    def kinds(self) -> dict[str, str]:
        """Each component's role -> its class's name."""
        return {role: type(component).__name__ for role, component in self.components()}


def build_server(
    settings: ServerSettings, facts: Facts, test: TestSplit, device: torch.device, client_side: Layout | None = None
) -> Server:
    """A run's server side (module docstring) from its record, the facts and the test split, on
    `device`; `client_side`: the client side's layout where both share a process (the simulator),
    for what its evaluation asks of the training data (LayoutInputs)."""
    shape = Shape(facts.classes, facts.shape[0], facts.shape[1])
    mean, std = facts.normalisation()
    split = TensorSplit(test.x, test.y, mean, std, device, shape.input_size(settings))
    held_out = tuple(facts.held_out_clients())
    laid = lay_out(
        settings, shape, device, split, settings.pretrained, held_out_clients=held_out, client_side=client_side
    )
    return Server(laid, facts, split, device)
