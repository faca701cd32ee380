"""The random streams: one id per use of a seed, and the one builder of their seed sequences.

Every random draw that depends on the run's `seed` (or on `partition_seed`) comes from the
SeedSequence `[seed, stream, a, b]`: the stream's id and two counters (round, client, pass),
zero where unused. NumPy pads entropy shorter than four words with zeros, so `[s, 3, p]` and
`[s, 3, p, 0]` are the same sequence: fixing the length at four and giving every use its own
id is what keeps two uses apart. Each word must fit in 32 bits: NumPy splits a larger integer
into words, so `[2**32 + 1, 3]` would be `[1, 1, 3]`, another use's sequence.

Imports nothing from incofl, so the data layer and the engine both read it.
"""

from __future__ import annotations

from enum import IntEnum, unique

import numpy as np

WORD = 2**32  # each entry of a seed sequence is one 32-bit word


@unique
class Stream(IntEnum):
    """The stream ids, distinct. The draws of an id that committed results use must never change."""

    PARTITION = 0  # client partitions (partition_seed): a bare `default_rng(seed)` is this stream
    SAMPLING = 1  # the clients of every round
    TRAINING = 2  # one client's local training in one round: batches, augmentation
    NOISE = 3  # update noise (robustness study), per round and client
    HOLDOUT = 4  # each client's held-out split (partition_seed), per client
    STATIC_BN = 5  # the training images static BN gathers statistics from
    PART_ORDER = 6  # FedPart's random layer order, per pass (3 until it shared NOISE's sequences)
    WIDTH_LEVEL = 7  # dynamic width levels, per round and client (4 until it shared HOLDOUT's)


# Bare seeds: two uses hand the run's seed itself to a generator of another family, both
# Mersenne Twisters: torch's global generator (`torch.manual_seed(cfg.seed)`: the initial
# weights) and scikit-learn's t-SNE (`random_state=cfg.seed`, the feature-map analysis). Kept:
# changing them would change every committed run's initial weights and the committed maps.

# Fixed seeds: draws that are the same in every run, method and seed by design, so that every
# run is scored on the same things. They are not streams of the run's seed. PROBE_SEED and
# SYNTHETIC_SEED (NumPy, `default_rng(0)`) equal PARTITION's sequence at partition_seed 0;
# EVAL_ORDER_SEED (torch) equals the model initialisation's generator at seed 0. Kept: changing
# them would change committed partitions, data and analyses.
EVAL_ORDER_SEED = 0  # torch: the order of the test set's batches
PROBE_SEED = 0  # NumPy: the analyses' probe images
PROBE_INPUT_SEED = 0  # torch: the random inputs the cost estimate counts FLOPs on
SYNTHETIC_SEED = 0  # NumPy: the synthetic data set's templates and noise
DIGITS_SPLIT_SEED = 0  # scikit-learn: the digits data set's train/test split


def seed_sequence(seed: int, stream: Stream, a: int = 0, b: int = 0) -> np.random.SeedSequence:
    """The one builder: `[seed, stream, a, b]`, every word checked to fit in 32 bits."""
    words = (seed, stream, a, b)
    if not all(0 <= int(w) < WORD for w in words):
        raise ValueError(f"seed sequence {list(words)}: every entry must be an integer in [0, 2**32)")
    return np.random.SeedSequence([int(w) for w in words])


def generator(seed: int, stream: Stream, a: int = 0, b: int = 0) -> np.random.Generator:
    """A NumPy generator of one stream (what `default_rng` builds from the same words)."""
    return np.random.default_rng(seed_sequence(seed, stream, a, b))


def seed_int(seed: int, stream: Stream, a: int = 0, b: int = 0) -> int:
    """A 32-bit integer seed of one stream, for generators that take an integer (torch, scikit-learn)."""
    return int(seed_sequence(seed, stream, a, b).generate_state(1)[0])


def fixed_generator(seed: int) -> np.random.Generator:
    """A NumPy generator of a fixed seed (PROBE_SEED, SYNTHETIC_SEED): `[seed, 0, 0, 0]`, which
    is what `default_rng(seed)` draws, and PARTITION's sequence at partition_seed == seed."""
    return generator(seed, Stream.PARTITION)
