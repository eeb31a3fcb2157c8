"""`pulse receipt`: a miner checks what became of its submission in a round, from public data only.

    found = await receipt_for(setup, task, peer, miner, round_, payload)

1. W_r: the newest validator checkpoint at or before round r, then the counted results' patches up
   to r, each hash-checked (`state_at`);
2. the counted result of round r from W_r (the chain rule, `node/net/peer.py`) and its evidence blob;
3. the verdict and what the validator measured (`validator/receipt.py: explain`);
4. if the validator measured gains and the payload is at hand (`payload`, this node's blob store,
   or fetched by hash while the validator or an auditor keeps it), the gains measured again here
   (`recompute`), within the stated tolerance.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from node.net.peer import Peer
from node.roles.catchup import Held
from node.roles.chainstate import apply_patch, load_checkpoint
from node.run.setup import RunSetup
from node.run.task import Task
from protocol.errors import ProtocolError, TransferError
from protocol.messages import BlobRef, RoundResult, SubmissionHeader
from protocol.signing import SignedMessage, Verified
from validator.evidence import RoundEvidence
from validator.receipt import Receipt, Recomputed, explain, recompute

T = TypeVar("T")


@dataclass(frozen=True)
class Found:
    result: Verified[RoundResult]
    receipt: Receipt
    recomputed: Recomputed | None
    not_recomputed: str | None  # why the gains were not measured again (None if they were)


async def receipt_for(
    setup: RunSetup, task: Task, peer: Peer, miner: str, round_: int, payload: bytes | None = None
) -> Found:
    """The receipt of `miner`'s submission in `round_`; `TransferError` if the round's public data
    is not (or no longer) fetchable, `ProtocolError` if it fails its checks."""
    held = await state_at(peer, round_)
    verified = await peer.counted_result(round_, held.state_hash)
    if verified is None:
        raise TransferError(f"no validator's result for round {round_} starts from W_{round_} (not closed yet?)")
    result = verified.message
    evidence = RoundEvidence.from_bytes(await _fetch(peer, result.evidence, round_))
    if evidence.run_id != setup.run_id or evidence.round != round_:
        raise ProtocolError(f"the evidence of round {round_} names another run or round")
    receipt = explain(result, evidence, miner)
    if receipt.assessed is None or receipt.assessed.gains is None:
        why = (
            "the validator measured no gains for it on its own data (of an update that did not gain on random"
            " data, or gained there too little beside its reference, only the gains on random data)"
        )
        return Found(verified, receipt, None, why)
    if payload is None:
        try:
            payload = await _fetch(peer, _payload_ref(receipt, evidence), round_)
        except TransferError as exc:
            why = f"its payload is not at hand ({exc}); pass --payload FILE or the miner's --state-dir"
            return Found(verified, receipt, None, why)
    cfg = setup.manifest.gauntlet()
    signer = verified.signed.sender
    recomputed = await _cpu(
        lambda: recompute(receipt, evidence, signer, held.weights, payload, cfg, task.evaluator(), task.batch_fn())
    )
    return Found(verified, receipt, recomputed, None)


async def state_at(peer: Peer, round_: int) -> Held:
    """W_round in BF16: a checkpoint at or before it, then the counted patches, every hash checked."""
    a = await peer.latest_checkpoint(round_)
    if a is None:
        raise TransferError(f"no validator checkpoint at or before round {round_} is announced any more")
    data = await _fetch(peer, BlobRef(sha256=a.blob_sha256, size=a.blob_size), a.round)
    held = Held(a.round, await _cpu(lambda: load_checkpoint(data, a.state_hash)), a.state_hash)
    while held.round < round_:
        verified = await peer.counted_result(held.round, held.state_hash)
        if verified is None:
            raise TransferError(f"no result for round {held.round} continues the chain")
        result = verified.message
        patch = await _fetch(peer, BlobRef(sha256=result.patch_sha256, size=result.patch_size), held.round)
        # raises unless the patch continues the held state and gives the state the result names
        weights = await _cpu(lambda: apply_patch(held.weights, held.state_hash, patch, result.new_state_hash))  # noqa: B023
        held = Held(held.round + 1, weights, result.new_state_hash)
    return held


def _payload_ref(receipt: Receipt, evidence: RoundEvidence) -> BlobRef:
    """The payload's hash and size, from the miner's signed header in the evidence."""
    for envelope in evidence.headers:
        signed = SignedMessage.from_bytes(bytes.fromhex(envelope))
        header = SubmissionHeader.from_canonical(signed.body)
        if header.sender == receipt.miner:
            return BlobRef(sha256=header.payload_sha256, size=header.payload_size)
    raise TransferError("the evidence holds no header of this miner")


async def _fetch(peer: Peer, blob: BlobRef, round_: int) -> bytes:
    path = await peer.fetch(blob.sha256, blob.size, round_)
    return await _cpu(path.read_bytes)


async def _cpu(fn: Callable[[], T]) -> T:
    return await asyncio.get_running_loop().run_in_executor(None, fn)
