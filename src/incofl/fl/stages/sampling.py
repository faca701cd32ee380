"""Client sampling and per-client seeds: a pure function of the run seed, identical for every method;
and how many local steps a client's share makes (both sides count them: the server checks a reply's)."""

from __future__ import annotations

import numpy as np

from incofl.streams import Stream, generator, seed_int


def clients_per_round(num_clients: int, ratio: float) -> int:
    return max(1, int(round(ratio * num_clients)))


def sample_schedule(seed: int, num_clients: int, ratio: float, rounds: int) -> np.ndarray:
    """(rounds, m) client ids, uniformly without replacement each round. Drawn round by round
    from one stream, so a longer run starts with the same rounds as a shorter one."""
    rng = generator(seed, Stream.SAMPLING)
    m = clients_per_round(num_clients, ratio)
    return np.stack([np.sort(rng.choice(num_clients, size=m, replace=False)) for _ in range(rounds)])


def group_of(client: int, num_clients: int, groups: int) -> int:
    """Client i belongs to model group i * G // K (0 = smallest model)."""
    return client * groups // num_clients


def client_seed(seed: int, round_: int, client: int) -> int:
    """Seed of one client's local training in one round: batches and augmentation depend on
    nothing else, which makes a resumed run bit-identical to an uninterrupted one."""
    return seed_int(seed, Stream.TRAINING, round_, client)


def noise_seed(seed: int, round_: int, client: int) -> int:
    """Seed of the noise added to one client's update in one round (`update_noise`)."""
    return seed_int(seed, Stream.NOISE, round_, client)


def trains_on(size: int, batch_size: int, drop_last: bool) -> bool:
    """Whether a client trains on a batch of `size` samples: a trailing batch of one is skipped
    (BatchNorm cannot train on it); with `drop_last` every incomplete batch is (the release's
    loaders: a client with fewer samples than a batch does not train)."""
    return size >= (batch_size if drop_last else 2)


def local_steps(samples: int, epochs: int, batch_size: int, drop_last: bool) -> int:
    """The local steps of a client with `samples` training samples (one a batch of `client_batches`)."""
    full, rest = divmod(samples, batch_size)
    sizes = [batch_size] * full + ([rest] if rest else [])
    return epochs * sum(trains_on(size, batch_size, drop_last) for size in sizes)
