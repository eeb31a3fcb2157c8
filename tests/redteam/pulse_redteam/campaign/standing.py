"""Attacks on standing: what fresh keys can send without training, hoping to be established.

    public-slice    SLICE_KEYS keys each send a disjoint slice of the public previous step
                    W_{r-1} - W_r, rescaled to that step's norm: each gains on random data and no
                    two share a position (no copy group). Caught by the public-step copy check.
    median-whisper  the same keys send random updates at 1/100 of that norm: had the slices made
                    them established, they would own the norm gate's median. Free riders.
    header-only     a header whose body never comes (the stream hangs up at once): its seat and
                    bytes are freed when the body is overdue (`validator.admission`).

The keys are derived from the attacking key, the same every round, so that a rotation which plays
`public-slice` in one round and `median-whisper` in the next speaks with the keys that would have
earned standing. Each key's payload is made when it is asked for (the functions are generators):
the hostile process pushes each as soon as it is made, as an attacker would, rather than all of
them once the last is compressed (after the round had closed, when its CPU is shared).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import torch

from node.swarm.fakeminers import decoded_scale
from protocol.identity import Identity
from protocol.state import State
from pulse_redteam.campaign.crafting import Forge
from validator.aggregate import global_norm
from validator.intake import Submission

SLICE_KEYS = 40


def slice_keys(me: Identity) -> list[Identity]:
    return [
        Identity.from_seed(hashlib.sha256(f"standing/{me.public_hex}/{i}".encode()).digest()) for i in range(SLICE_KEYS)
    ]


def public_step(forge: Forge, previous: State) -> State:
    """W_{r-1} - W_r, as every node that applied the round's patch can compute it."""
    return {n: previous[n].float() - forge.weights[n].float() for n in forge.weights}


def public_slices(forge: Forge, me: Identity, previous: State) -> Iterator[Submission]:
    """One submission per derived key: slice i of the public step (flat index i mod n), at the step's norm."""
    step = public_step(forge, previous)
    norm = global_norm(step)
    if norm == 0:
        return
    for i, key in enumerate(slice_keys(me)):
        part = {n: _slice(t, i, SLICE_KEYS) for n, t in step.items()}
        yield forge.submission(key, forge.compress(_at_norm(forge, part, norm)))


def whispers(forge: Forge, me: Identity, previous: State, seed: int) -> Iterator[Submission]:
    """One random update per derived key at 1/100 of the public step's norm."""
    norm = global_norm(public_step(forge, previous)) / 100
    if norm == 0:
        return
    gen = torch.Generator().manual_seed(seed)
    for key in slice_keys(me):
        noise = {n: torch.randn(t.shape, generator=gen) for n, t in forge.weights.items()}
        yield forge.submission(key, forge.compress(_at_norm(forge, noise, norm)))


def _slice(t: torch.Tensor, part: int, parts: int) -> torch.Tensor:
    flat = t.reshape(-1)
    return (flat * (torch.arange(flat.numel()) % parts == part)).reshape(t.shape)


def _at_norm(forge: Forge, update: State, norm: float) -> State:
    """`update` rescaled so that what the validator decodes has `norm`."""
    scale = decoded_scale(forge.codec, update, forge.weights, norm)
    return {n: t * scale for n, t in update.items()}
