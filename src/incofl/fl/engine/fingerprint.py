"""A run's weights as one SHA-256 (summary.json's `state_sha256`): equal iff the weights are.

The server states' entries (name and bytes, in order), then each client that keeps entries of
its model (personal layers, local BN statistics): its id and the SHA-256 of those entries
(`state_sha256`). Hashed per client, so a real federation's server, to which each node reports
the hash of what its client keeps but never the entries, computes the simulator's value.
"""

from __future__ import annotations

import hashlib

from incofl.fl.contracts import State


def _update(digest: hashlib._Hash, state: State) -> None:
    for name, tensor in state.items():
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())


def state_sha256(state: State) -> str:
    """SHA-256 of a state's names and bytes, in order."""
    digest = hashlib.sha256()
    _update(digest, state)
    return digest.hexdigest()


def run_fingerprint(states: list[State], kept: dict[int, str]) -> str:
    """The server states, then each keeping client's id and `state_sha256` of its kept entries, in client order."""
    digest = hashlib.sha256()
    for state in states:
        _update(digest, state)
    for client, sha in sorted(kept.items()):
        digest.update(f"client {client} keeps ".encode())
        digest.update(bytes.fromhex(sha))
    return digest.hexdigest()
