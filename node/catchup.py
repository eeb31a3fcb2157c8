"""Keeping the BF16 global weights in step with the validator: patches, and checkpoints to catch up.

    held = await join(peer)            # newest checkpoint (hash-checked), then the patch chain
    held = await advance(peer, held)   # apply every round result published since

Invariant: `Held.weights` always hashes to `Held.state_hash`, the hash the validator announced
for `Held.round`. A patch that fails to fetch, apply or verify changes nothing; a node that
cannot apply the chain rejoins from the newest checkpoint.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

from node.peer import Peer
from node.runtime import Events, mb
from protocol import pulsesync
from protocol.errors import MalformedPayload, ProtocolError, StateHashMismatch, TransferError
from protocol.statehash import state_hash

log = logging.getLogger(__name__)

State = dict[str, torch.Tensor]
CHECKPOINT_FORMAT = "safetensors"


@dataclass
class Held:
    round: int  # this node holds W_round
    weights: State  # BF16
    state_hash: str


def checkpoint_bytes(weights: State) -> bytes:
    return save_safetensors({n: t.contiguous() for n, t in weights.items()})


def load_checkpoint(data: bytes, expect_hash: str) -> State:
    """BF16 weights from checkpoint bytes (safetensors: never pickle), checked against `expect_hash`."""
    try:
        weights = dict(load_safetensors(data))
    except (SafetensorError, ValueError) as exc:
        raise MalformedPayload(f"checkpoint is not a safetensors file: {exc}") from exc
    if any(t.dtype != torch.bfloat16 for t in weights.values()):
        raise MalformedPayload("checkpoint holds tensors that are not BF16")
    got = state_hash(weights)
    if got != expect_hash:
        raise StateHashMismatch(f"checkpoint hashes to {got[:12]}..., announced {expect_hash[:12]}...")
    return weights


async def _cpu(fn: Callable[..., State], *args: object) -> State:
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


async def join(peer: Peer, events: Events, *, poll: float = 1.0) -> Held:
    """Load the newest announced checkpoint; waits until the validator has announced one."""
    while True:
        current = await peer.latest_result_round() + 1
        announcement = await peer.latest_checkpoint(current)
        if announcement is not None:
            try:
                path = await peer.fetch(announcement.blob_sha256, announcement.blob_size, announcement.round)
                data = path.read_bytes()
                weights = await _cpu(load_checkpoint, data, announcement.state_hash)
            except (TransferError, ProtocolError) as exc:
                log.warning("checkpoint of round %d unusable: %s; retrying", announcement.round, exc)
            else:
                peer.hold(announcement.blob_sha256)
                events.emit(
                    "checkpoint",
                    f"loaded the checkpoint of round {announcement.round} ({mb(announcement.blob_size)}), "
                    f"state hash {announcement.state_hash[:12]} verified",
                    round=announcement.round,
                    state_hash=announcement.state_hash,
                )
                return await advance(peer, Held(announcement.round, weights, announcement.state_hash), events)
        await asyncio.sleep(poll)


async def advance(peer: Peer, held: Held, events: Events) -> Held:
    """Apply every published round result from `held.round` on; rejoins from a checkpoint on a broken chain."""
    while (result := await peer.round_result(held.round)) is not None:
        if result.base_state_hash != held.state_hash:
            log.warning("round %d result starts from another state than ours: rejoining", held.round)
            return await join(peer, events)
        try:
            path = await peer.fetch(result.patch_sha256, result.patch_size, held.round)
            patch = path.read_bytes()
            weights = await _cpu(pulsesync.apply, held.weights, patch)
        except TransferError as exc:
            log.warning("patch of round %d not available yet: %s", held.round, exc)
            return held
        except ProtocolError as exc:
            log.warning("patch of round %d failed its checks (%s): rejoining from a checkpoint", held.round, exc)
            return await join(peer, events)
        if state_hash(weights) != result.new_state_hash:
            log.warning("round %d patch gave another state than the result names: rejoining", held.round)
            return await join(peer, events)
        peer.hold(result.patch_sha256)
        events.emit(
            "patch",
            f"patch of round {held.round} applied ({mb(result.patch_size)}), "
            f"state hash {result.new_state_hash[:12]} verified",
            round=held.round,
            patch_bytes=result.patch_size,
            state_hash=result.new_state_hash,
        )
        held = Held(held.round + 1, weights, result.new_state_hash)
    return held
