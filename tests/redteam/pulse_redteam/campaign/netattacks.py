"""The campaign's attacks on the network layer: DHT floods and pinning, stream-slot holders, and
pushes to nodes that take none. Each returns what its targets did (`Played`), never raises on them.

- `dht_flood`: 64 fresh keys sign round results and checkpoints (kinds only validators write) for
  this round and the next, and 64 heartbeats; stored from the attacker's DHT process past its own
  record checks, as a modified node would. Refused if no peer kept a validator-only record and the
  validator's heartbeat is still the first one a reader finds.
- `dht_pin`: the validator's heartbeat of this round stored again to live 23 hours longer than
  signed. Refused if no peer kept it.
- `slot_silent` / `slot_trickle`: streams to the validator that send nothing, or a request a byte
  at a time. Dropped if the validator hung up on every one within its request deadline (+5 s).
- `push_miner`: a signed submission pushed to a miner and to a follower of the run. Refused if
  both answered that they take no submissions.
"""

from __future__ import annotations

import asyncio
import functools
import time
from dataclasses import dataclass
from typing import Any

from hivemind.p2p import PeerID

from node.net.dht import dht_key, sign_for
from node.net.p2ppeer import P2PPeer
from node.net.streams import DEFAULT_LIMITS, STREAM_ERRORS, Status, open_stream, read_reply, send_request
from node.net.transfer import FETCH, SUBMIT
from protocol.errors import ProtocolError, TransferError
from protocol.identity import Identity
from protocol.messages import BlobRef, CheckpointAnnouncement, Heartbeat, OuterStep, RoundResult, WireModel

FLOOD = 64
SLOT_STREAMS = 8
SLACK_SECONDS = 5.0  # beyond the validator's request deadline


@dataclass(frozen=True)
class Played:
    target: str
    outcome: str  # refused | dropped | breached | skipped
    detail: str
    seconds: float = 0.0


def _h(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()


def _junk(run_id: str, round_: int, me: Identity, peer_id: str) -> list[WireModel]:
    """What one fresh key signs: a round result and a checkpoint (validator-only), a heartbeat."""
    return [
        RoundResult(
            run_id=run_id,
            round=round_,
            selected=(),
            rejections=(),
            base_state_hash=_h(f"junk state {me.public_hex}"),
            patch_sha256=_h(f"junk patch {me.public_hex}"),
            patch_size=1,
            new_state_hash=_h(f"junk next {me.public_hex}"),
            master_before=_h(f"junk fp32 {me.public_hex}"),
            master_after=_h(f"junk fp32 next {me.public_hex}"),
            outer=OuterStep(lr=1.0, momentum=0.0, nesterov=False, steps=0),
            evidence=BlobRef(sha256=_h(f"junk evidence {me.public_hex}"), size=1),
            master_checkpoint=None,
        ),
        CheckpointAnnouncement(
            run_id=run_id,
            round=round_,
            state_hash=_h(f"junk state {me.public_hex}"),
            blob_sha256=_h(f"junk blob {me.public_hex}"),
            blob_size=1,
            format="safetensors",
        ),
        Heartbeat(run_id=run_id, round=round_, role="validator", peer_id=peer_id, state_hash=None, blobs=(), sent_at=0),
    ]


async def _store_inside(_dht: Any, node: Any, records: list[tuple[str, bytes, float, bytes]]) -> list[bool]:
    """Runs in the attacker's DHT process: ask every peer nearest each record's key to store it,
    past this node's own checks (as a modified node would). True where some peer kept it."""
    from hivemind.dht.routing import DHTID
    from hivemind.utils.serializer import MSGPackSerializer

    by_key: dict[DHTID, list[int]] = {}
    for i, (key, *_) in enumerate(records):
        by_key.setdefault(DHTID.generate(source=key), []).append(i)
    nearest = await node.find_nearest_nodes(list(by_key), k_nearest=node.num_replicas, exclude_self=True)
    kept = [False] * len(records)
    for key_id, indices in by_key.items():
        for peer_id in nearest.get(key_id, {}).values():
            answers = await node.protocol.call_store(
                peer_id,
                [key_id] * len(indices),
                [MSGPackSerializer.dumps(records[i][1]) for i in indices],
                [records[i][2] for i in indices],
                subkeys=[records[i][3] for i in indices],
            )
            for i, ok in zip(indices, answers or [], strict=False):
                kept[i] = kept[i] or bool(ok)
    return kept


async def _store_raw(peer: P2PPeer, records: list[tuple[str, bytes, float, bytes]]) -> list[bool]:
    future = peer.dht.dht.run_coroutine(functools.partial(_store_inside, records=records), return_future=True)
    return list(await asyncio.wait_for(asyncio.wrap_future(future), 120.0))


async def dht_flood(peer: P2PPeer, round_: int) -> Played:
    records: list[tuple[str, bytes, float, bytes]] = []
    kinds: list[str] = []
    for r in (round_, round_ + 1):
        for _ in range(FLOOD // 2):
            me = Identity.generate()
            for message in _junk(peer.run_id, r, me, peer.peer_id):
                signed = sign_for(me, message, 3600)
                key = dht_key(peer.run_id, signed.kind, r)
                records.append((key, signed.to_bytes(), signed.expires_at, me.public_key))
                kinds.append(signed.kind)
    stored = await _store_raw(peer, records)
    kept = sum(ok for ok, kind in zip(stored, kinds, strict=True) if kind != Heartbeat.KIND)
    beats_kept = sum(ok for ok, kind in zip(stored, kinds, strict=True) if kind == Heartbeat.KIND)
    beats = await peer.get(Heartbeat, round_)
    first = beats[0].sender_hex if beats else None
    validator_first = first in peer.run.validators
    detail = (
        f"{kept} of {2 * FLOOD} validator-only records kept; {beats_kept} of {FLOOD} heartbeats kept; "
        f"a reader's first heartbeat is {'the validator' if validator_first else repr(first)}'s"
    )
    return Played("dht", "refused" if not kept and validator_first else "breached", detail)


async def dht_pin(peer: P2PPeer, round_: int) -> Played:
    beats = [v for v in await peer.get(Heartbeat, round_) if v.sender_hex in peer.run.validators]
    if not beats:
        return Played("dht", "skipped", "no validator heartbeat to pin")
    signed = beats[0].signed
    record = (dht_key(peer.run_id, signed.kind, round_), signed.to_bytes(), time.time() + 23 * 3600, signed.sender)
    (stored,) = await _store_raw(peer, [record])
    detail = "a peer kept the re-timed record" if stored else "every peer refused the re-timed record"
    return Played("dht", "breached" if stored else "refused", detail)


async def _held_until_closed(peer: P2PPeer, name: str, trickle: bool) -> float:
    """Open a stream to the validator's `name` handler, send nothing (or a request a byte every
    0.5 s), and return how long the validator took to hang up."""
    assert peer.validator_peer is not None
    started = time.monotonic()
    limit = DEFAULT_LIMITS.request_timeout + SLACK_SECONDS + 30.0
    try:
        async with open_stream(peer.p2p, PeerID.from_base58(peer.validator_peer), name, DEFAULT_LIMITS) as (r, w):
            async with asyncio.timeout(limit):
                while True:
                    if trickle:
                        w.write(b"\x00")
                        await w.drain()
                    try:
                        if not await asyncio.wait_for(r.read(1 << 16), 0.5 if trickle else limit):
                            break  # the validator hung up
                    except TimeoutError:
                        continue
    except (TransferError, ProtocolError, TimeoutError, *STREAM_ERRORS):
        pass  # a reset is a hang-up too
    return time.monotonic() - started


async def slot_holders(peer: P2PPeer, trickle: bool) -> Played:
    if peer.validator_peer is None:
        return Played("validator", "skipped", "the validator's peer id is unknown")
    names = [SUBMIT] * SLOT_STREAMS if trickle else [FETCH, SUBMIT] * SLOT_STREAMS
    held = await asyncio.gather(*(_held_until_closed(peer, name, trickle) for name in names))
    longest = max(held)
    allowed = DEFAULT_LIMITS.request_timeout + SLACK_SECONDS
    detail = f"{len(held)} streams, the longest held {longest:.1f}s (allowed {allowed:.0f}s)"
    return Played("validator", "dropped" if longest <= allowed else "breached", detail, longest)


async def push_miner(peer: P2PPeer, round_: int, envelope: bytes) -> list[Played]:
    """Push `envelope` (a signed submission header, the body never sent) to one miner and one follower."""
    mine = {peer.identity.public_hex}
    targets: dict[str, str] = {}
    for r in (round_, round_ - 1):
        for v in await peer.get(Heartbeat, r):
            role = v.message.role
            other = v.sender_hex not in mine and v.message.peer_id != peer.peer_id
            if role in ("miner", "follower") and role not in targets and other:
                targets[role] = v.message.peer_id
    out = []
    for role in ("miner", "follower"):
        if role not in targets:
            out.append(Played(role, "skipped", f"no {role} heartbeat found"))
            continue
        status, reason = await _push_header(peer, targets[role], envelope)
        refused = status == Status.REJECTED.name and "takes no submissions" in reason
        out.append(Played(role, "refused" if refused else "breached", f"{status} {reason}"))
    return out


async def _push_header(peer: P2PPeer, target: str, envelope: bytes) -> tuple[str, str]:
    try:
        async with open_stream(peer.p2p, PeerID.from_base58(target), SUBMIT, DEFAULT_LIMITS) as (reader, writer):
            await send_request(writer, envelope, DEFAULT_LIMITS)
            status, _, reason = await read_reply(reader, DEFAULT_LIMITS.open_timeout)
            return status.name, reason
    except (TransferError, ProtocolError, TimeoutError, *STREAM_ERRORS) as exc:
        return "BROKEN", f"{type(exc).__name__}: {exc}"[:200]
