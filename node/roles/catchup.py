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

from node.events import Events, mb
from node.net.peer import Peer
from protocol import pulsesync
from protocol.errors import MalformedPayload, ProtocolError, StateHashMismatch, TransferError
from protocol.messages import RoundResult
from protocol.state import State
from protocol.statehash import state_hash

log = logging.getLogger(__name__)

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


async def join(peer: Peer, events: Events, me: str | None = None, *, poll: float = 1.0) -> Held:
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
                return await advance(peer, Held(announcement.round, weights, announcement.state_hash), events, me)
        await asyncio.sleep(poll)


async def advance(peer: Peer, held: Held, events: Events, me: str | None = None) -> Held:
    """Apply every published round result from `held.round` on; rejoins from a checkpoint on a broken chain.

    With `me` (a miner's public key), also says how that miner's submission fared in each round.
    """
    while (result := await peer.round_result(held.round)) is not None:
        if result.base_state_hash != held.state_hash:
            log.warning("round %d result starts from another state than ours: rejoining", held.round)
            return await join(peer, events, me)
        try:
            path = await peer.fetch(result.patch_sha256, result.patch_size, held.round)
            patch = path.read_bytes()
            weights = await _cpu(pulsesync.apply, held.weights, patch)
        except TransferError as exc:
            log.warning("patch of round %d not available yet: %s", held.round, exc)
            return held
        except ProtocolError as exc:
            log.warning("patch of round %d failed its checks (%s): rejoining from a checkpoint", held.round, exc)
            return await join(peer, events, me)
        if state_hash(weights) != result.new_state_hash:
            log.warning("round %d patch gave another state than the result names: rejoining", held.round)
            return await join(peer, events, me)
        peer.hold(result.patch_sha256)
        if me is not None:
            _report_placement(events, result, me)
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


def _report_placement(events: Events, result: RoundResult, me: str) -> None:
    ranked = sorted(result.selected, key=lambda s: -s.score)
    total = len(ranked) + len(result.rejections)
    place = next((i for i, s in enumerate(ranked) if s.sender == me), None)
    if place is not None:
        score = ranked[place].score
        text = f"round {result.round}: scored {_ordinal(place + 1)} of {total} (score {score:.4g}), aggregated"
        events.emit("scored", text, round=result.round, place=place + 1, of=total, score=ranked[place].score)
        return
    reason = next((r.reason for r in result.rejections if r.sender == me), None)
    text = (
        f"round {result.round}: not aggregated ({reason})" if reason else f"round {result.round}: recorded as missing"
    )
    events.emit("scored", text, round=result.round, place=None, of=total, reason=reason)


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"
