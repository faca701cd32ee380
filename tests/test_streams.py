"""The random streams (incofl/streams.py): distinct ids, one builder of fixed length, every use
of a seed routed through it, and no two uses drawing the same sequence."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from incofl import streams
from incofl.data.partition import dirichlet_partition, holdout_split, iid_partition
from incofl.fl.contracts import Round
from incofl.fl.methods.fedpart.plan import PartPlanner
from incofl.fl.methods.width.levels import WidthPlanner, statistics_indices
from incofl.fl.stages.sampling import client_seed, noise_seed, sample_schedule
from incofl.streams import Stream, fixed_generator, generator, seed_int, seed_sequence

SRC = Path(__file__).resolve().parents[1] / "src" / "incofl"


def _state(entropy: list[int]) -> list[int]:
    return np.random.SeedSequence(entropy).generate_state(4).tolist()


def test_stream_ids_are_distinct_32_bit_words():
    ids = [int(s) for s in Stream]
    assert len(set(ids)) == len(ids) and all(0 <= i < streams.WORD for i in ids)


def test_numpy_pads_short_entropy_with_zeros():
    """Why the length is fixed: a shorter sequence is the longer one with trailing zeros (FedPart's
    order for pass p was client 0's update noise in round p)."""
    for s, p in [(0, 0), (1, 7), (2, 123)]:
        assert _state([s, 3, p]) == _state([s, 3, p, 0])
    assert _state([2**32 + 1, 3]) == _state([1, 1, 3])  # why every word must fit in 32 bits


def test_kept_streams_draw_what_they_drew_before_the_registry():
    """Padding to four words changes no draw: only the moved ids (FedPart's order, width levels) change."""
    for s, r, c in [(0, 0, 0), (1, 5, 3), (2, 49, 99)]:
        assert client_seed(s, r, c) == int(np.random.SeedSequence([s, 2, r, c]).generate_state(1)[0])
        assert noise_seed(s, r, c) == int(np.random.SeedSequence([s, 3, r, c]).generate_state(1)[0])
        assert seed_int(s, Stream.HOLDOUT, c) == int(np.random.SeedSequence([s, 4, c]).generate_state(1)[0])
        assert np.array_equal(sample_schedule(s, 10, 0.3, 4), _schedule(np.random.default_rng([s, 1]), 10, 3, 4))
        assert generator(s, Stream.STATIC_BN).integers(2**62) == np.random.default_rng([s, 5]).integers(2**62)
        assert np.array_equal(iid_partition(50, 5, s)[0], np.random.default_rng(s).permutation(50)[:10])
    assert fixed_generator(0).integers(2**62) == np.random.default_rng(0).integers(2**62)


def _schedule(rng: np.random.Generator, clients: int, m: int, rounds: int) -> np.ndarray:
    return np.stack([np.sort(rng.choice(clients, size=m, replace=False)) for _ in range(rounds)])


def test_the_builder_refuses_words_outside_32_bits():
    for words in [(2**32, Stream.SAMPLING), (-1, Stream.SAMPLING), (0, Stream.TRAINING, 2**32)]:
        with pytest.raises(ValueError, match=r"\[0, 2\*\*32\)"):
            seed_sequence(*words)


def _every_use(seed: int) -> None:
    """Every use of a run's seed, drawn once with small counters (rounds, clients, passes 0..3)."""
    parts = iid_partition(40, 4, seed)
    dirichlet_partition(np.arange(40) % 2, 4, 0.5, seed, min_size=1)
    holdout_split(parts, np.arange(40) % 2, 0.25, seed)
    sample_schedule(seed, 4, 0.5, 4)
    statistics_indices(parts, 8, seed)
    part = SimpleNamespace(keys=list("abcd"), hp=SimpleNamespace(order="random"), seed=seed)
    width = SimpleNamespace(dynamic=True, seed=seed, groups=3)
    for t in Round.upto(4):
        PartPlanner.order(part, t.index)
        for c in range(4):
            client_seed(seed, t.index, c)
            noise_seed(seed, t.index, c)
            WidthPlanner.group_of(width, t, c, 0)


_PARTITIONS = {f"{kind}_partition": "partition" for kind in ("iid", "iid_draw", "dirichlet", "shard")}  # one per run


def test_no_two_uses_draw_the_same_sequence(monkeypatch):
    """Records the words of every sequence the builder makes while every use draws, for two seeds
    (the run's seed may equal partition_seed): each sequence belongs to one stream only."""
    made: list[tuple[str, tuple[int, ...]]] = []  # (the use: the function that asked, the words)
    build = streams.seed_sequence

    def record(*words: int) -> np.random.SeedSequence:
        use = sys._getframe(2).f_code.co_name  # the caller of generator() or seed_int()
        made.append((_PARTITIONS.get(use, use), tuple(int(w) for w in words)))
        return build(*words)

    monkeypatch.setattr(streams, "seed_sequence", record)
    for seed in (0, 1):
        _every_use(seed)
    users: dict[tuple[int, ...], set[str]] = {}
    for use, words in made:
        users.setdefault(tuple(_state(list(words))), set()).add(use)
    assert [u for u in users.values() if len(u) > 1] == []
    uses = {
        "partition",
        "hold_out",
        "sample_schedule",
        "client_seed",
        "noise_seed",
        "statistics_indices",
        "order",
        "group_of",
    }
    assert {use for use, _ in made} == uses and {words[1] for _, words in made} == set(Stream)


# Where a seed is handed to an RNG outside the registry (torch, scikit-learn), the seed must come
# from it: a builder, a wrapper of one, or a fixed seed it declares.
_FROM_REGISTRY = ("seed_int(", "client_seed(", "noise_seed(", *(n for n in dir(streams) if n.endswith("_SEED")))
# The run's seed handed over bare (streams.py says why they are kept): file -> the line's text.
_BARE = {"fl/engine/models.py": "torch.manual_seed(settings.seed)", "fl/stages/probes.py": "random_state=self.seed"}
_NUMPY_RNG = re.compile(r"SeedSequence\(|default_rng\(|RandomState\(|np\.random\.\w+\(")
_SEEDED = re.compile(r"(?:manual_seed\(|random_state=)\s*(\w+)(\(?)")


def _sources() -> list[tuple[Path, str]]:
    return [(p, p.read_text()) for p in sorted(SRC.rglob("*.py")) if p.name != "streams.py" or p.parent != SRC]


def _seed_ok(text: str, name: str, call: str) -> bool:
    if f"{name}{call}".startswith(_FROM_REGISTRY):
        return True
    bound = re.search(rf"^\s*{name} = (\w+\()", text, re.MULTILINE)  # a local holding a registry seed
    return bound is not None and bound.group(1).startswith(_FROM_REGISTRY)


def test_every_random_generator_is_seeded_through_the_registry():
    numpy, unseeded, bare = [], [], []
    for path, text in _sources():
        name = path.relative_to(SRC).as_posix()
        for number, line in enumerate(text.splitlines(), 1):
            where = f"{name}:{number}: {line.strip()}"
            if _NUMPY_RNG.search(line):
                numpy.append(where)
            for match in _SEEDED.finditer(line):
                if _BARE.get(name, "\0") in line:
                    bare.append(name)
                elif not _seed_ok(text, *match.groups()):
                    unseeded.append(where)
    assert numpy == [], "NumPy generators are built by incofl.streams only"
    assert unseeded == [], "seeds come from incofl.streams"
    assert sorted(bare) == sorted(_BARE)  # each bare seed once, where streams.py says
