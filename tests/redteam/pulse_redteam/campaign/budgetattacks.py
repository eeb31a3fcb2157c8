"""The campaign's attacks on what a node serves and stores for free: probes, ranges, open DHT kinds,
the RL pool. Each returns what its target did (`netattacks.Played`), never raises on it.

- `probe_flood`: download probes of 8 MiB (what `pulse doctor` asks) from fresh keys (a new one
  per probe), 4 streams at once, for `PROBE_WINDOW` seconds. Limited if the bytes the validator
  sent stay within its share for peers without standing (`unknown_probe_bytes_per_second` over
  the window, plus its burst); the detail reports bytes per second against that share.
- `range_flood`: 16 streams at once ask the validator for the current patch as a range, held
  open unread. Limited if no more were answered OK than the send slots open to peers without
  standing (`max_fetch_streams - reserved_fetch_streams`).
- `dht_future`: 64 fresh keys sign heartbeats, rollout announcements and submission headers for
  far rounds (head + 1000 and beyond) and for this round with a 20-hour expiry, stored past the
  attacker's own checks. Refused if no peer kept one.
- `dht_evict`: 320 fresh keys sign heartbeats of this round (more than a key keeps). Kept if
  every heartbeat of a miner with standing (one a validator's round result aggregated) that a
  reader found before the flood is still found after it. A newcomer's heartbeat may be displaced
  (at random, as a sybil's is): no round needs it (the validator waits for newcomers by ticket,
  `Admission.awaited`, and serves every patch itself); the detail counts those too.
- `rl_unserved`: 40 fresh keys announce rollout batches of this round naming blobs nobody serves
  (played in an RL swarm: the pool must still build every round).
- `rl_push_flood`: 40 fresh keys push rollout batches of this round (4 KiB of noise each) to the
  validator over its streams (played in an RL swarm). Its play is only sent: a push the validator
  took (OK) may lose its seat to a lower ticket later, unseen from here. What counts is the run's:
  every pool built, only honest batches in them, and the validator's inbox within its seats.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from collections.abc import Awaitable, Callable

from hivemind.p2p import PeerID

from node.net.dht import dht_key, sign_for
from node.net.p2ppeer import P2PPeer
from node.net.ranges import MAX_RANGE_BYTES, RANGE, sign_probe
from node.net.streams import DEFAULT_LIMITS, STREAM_ERRORS, Status, open_stream, read_reply, send_request
from node.net.transfer import FETCH
from protocol.errors import ProtocolError, TransferError
from protocol.identity import Identity
from protocol.messages import (
    Heartbeat,
    RolloutAnnouncement,
    RoundResult,
    ScoredSubmission,
    SubmissionHeader,
    WireModel,
)
from protocol.signing import SignedMessage, sign
from pulse_redteam.campaign.netattacks import Played, _store_raw

PROBE_WINDOW = 10.0
PROBE_STREAMS = 4
PROBE_BYTES = 8 << 20
PROBE_BURST_SECONDS = 16.0  # what the validator's probe budget may have saved up (`budget.ProbeGate`)
RANGE_STREAMS = 16
FUTURE_KEYS = 64
EVICT_KEYS = 320
UNSERVED_KEYS = 40
PUSH_FLOOD_KEYS = 40
PEER_ERRORS = (TransferError, ProtocolError, TimeoutError, *STREAM_ERRORS)


def _h(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


async def probe_flood(peer: P2PPeer, round_: int) -> Played:
    if peer.validator_peer is None:
        return Played("validator", "skipped", "the validator's peer id is unknown")
    target, limits = PeerID.from_base58(peer.validator_peer), DEFAULT_LIMITS
    got, answers = [0], {"ok": 0, "busy": 0, "other": 0}
    until = time.monotonic() + PROBE_WINDOW

    async def stream() -> None:
        while time.monotonic() < until:
            request = sign_probe(Identity.generate(), peer.run_id, b"P", PROBE_BYTES)  # a fresh key each time
            try:
                async with open_stream(peer.p2p, target, FETCH, limits) as (reader, writer):
                    await send_request(writer, request, limits)
                    status, _, _ = await read_reply(reader, limits.open_timeout)
                    answers["ok" if status is Status.OK else "busy" if status is Status.BUSY else "other"] += 1
                    while status is Status.OK and time.monotonic() < until:
                        chunk = await asyncio.wait_for(reader.read(1 << 20), max(0.1, until - time.monotonic()))
                        if not chunk:
                            break
                        got[0] += len(chunk)
            except PEER_ERRORS:
                pass
            await asyncio.sleep(0.2)

    started = time.monotonic()
    await asyncio.gather(*(stream() for _ in range(PROBE_STREAMS)))
    seconds = time.monotonic() - started
    share = limits.unknown_probe_bytes_per_second
    allowed = share * (seconds + PROBE_BURST_SECONDS)
    rate = got[0] / seconds
    detail = (
        f"{got[0]} probe bytes in {seconds:.1f}s = {rate / 2**20:.2f} MiB/s to the attacker; share for peers "
        f"without standing {share / 2**20:.2f} MiB/s (+{PROBE_BURST_SECONDS:.0f}s burst); answers {answers}"
    )
    return Played("validator", "limited" if got[0] <= allowed else "breached", detail, seconds)


async def range_flood(peer: P2PPeer, round_: int) -> Played:
    result = await peer.round_result(round_ - 1)
    if peer.validator_peer is None or result is None:
        return Played("validator", "skipped", "no validator peer or no patch to ask for")
    target, limits = PeerID.from_base58(peer.validator_peer), DEFAULT_LIMITS
    length = min(result.patch_size, MAX_RANGE_BYTES)
    request = RANGE.pack(b"R", bytes.fromhex(result.patch_sha256), 0, length)
    statuses: list[str] = []
    release = asyncio.Event()

    async def hold() -> None:
        try:
            async with open_stream(peer.p2p, target, FETCH, limits) as (reader, writer):
                await send_request(writer, request, limits)
                status, _, _ = await read_reply(reader, limits.open_timeout)
                statuses.append(status.name)
                if status is Status.OK:
                    await asyncio.wait_for(release.wait(), 5.0)  # held open, unread
        except PEER_ERRORS as exc:
            statuses.append(type(exc).__name__)

    tasks = [asyncio.ensure_future(hold()) for _ in range(RANGE_STREAMS)]
    await asyncio.sleep(3.0)
    release.set()
    await asyncio.gather(*tasks)
    ok = statuses.count("OK")
    open_slots = limits.max_fetch_streams - min(limits.reserved_fetch_streams, limits.max_fetch_streams // 2)
    detail = f"{ok} of {RANGE_STREAMS} ranges served at once (open send slots: {open_slots}); {sorted(statuses)}"
    return Played("validator", "limited" if ok <= open_slots else "breached", detail)


def _raw(signed: SignedMessage) -> tuple[str, bytes, float, bytes]:
    """A signed record as `netattacks._store_raw` stores it."""
    return dht_key(signed.run_id, signed.kind, signed.round), signed.to_bytes(), signed.expires_at, signed.sender


def _open_records(run_id: str, round_: int, me: Identity) -> list[WireModel]:
    """What one fresh key signs of each open kind for `round_`."""
    return [
        Heartbeat(run_id=run_id, round=round_, role="miner", peer_id="1" * 46, state_hash=None, blobs=(), sent_at=0),
        RolloutAnnouncement(
            run_id=run_id,
            round=round_,
            state_hash=_h(f"s{round_}"),
            blob_sha256=_h(f"b{me.public_hex}{round_}"),
            blob_size=1000,
            groups=1,
            mean_reward=0.0,
        ),
        SubmissionHeader(
            run_id=run_id,
            round=round_,
            base_state_hash=_h(f"s{round_}"),
            payload_sha256=_h(f"p{me.public_hex}"),
            payload_size=1000,
            codec="dense",
            data_digest=_h("d"),
            sender=me.public_hex,
        ),
    ]


async def dht_future(peer: P2PPeer, round_: int) -> Played:
    """Far-round records and 20-hour records of the current round from fresh keys. Both bounds hold at
    every storage from the start: one that has not yet learnt the head from a validator's records takes
    the run's start for it (`node/net/records.py`), so a far round kept anywhere, in any round, is a breach."""
    far_records: list[tuple[str, bytes, float, bytes]] = []
    long_records: list[tuple[str, bytes, float, bytes]] = []
    for i in range(FUTURE_KEYS):
        me = Identity.generate()
        far = round_ + 1000 + i
        long_lived = int((time.time() + 20 * 3600) * 1000)
        for message in _open_records(peer.run_id, far, me):
            signed = sign_for(me, message, 3600)
            far_records.append(
                (dht_key(peer.run_id, signed.kind, far), signed.to_bytes(), signed.expires_at, me.public_key)
            )
        for message in _open_records(peer.run_id, round_, me):
            signed = sign(me, message, expires_ms=long_lived)
            long_records.append(
                (dht_key(peer.run_id, signed.kind, round_), signed.to_bytes(), signed.expires_at, me.public_key)
            )
    kept = await _store_raw(peer, far_records + long_records)  # one store pass, as the DHT flood makes
    far_kept, long_kept = sum(kept[: len(far_records)]), sum(kept[len(far_records) :])
    detail = (
        f"{long_kept} of {len(long_records)} 20-hour and {far_kept} of {len(far_records)} far-round open records kept"
    )
    return Played("dht", "refused" if not (long_kept or far_kept) else "breached", detail)


async def dht_evict(peer: P2PPeer, round_: int) -> Played:
    async def miners() -> set[str]:
        return {v.sender_hex for v in await peer.get(Heartbeat, round_) if v.message.role == "miner"}

    before = await miners() - {peer.identity.public_hex}
    if not before:
        return Played("dht", "skipped", "no miner heartbeat of this round to evict")
    standing = {s.sender for r in range(max(0, round_ - 8), round_) for s in await _aggregated(peer, r)}
    records = []
    for _ in range(EVICT_KEYS):
        me = Identity.generate()
        records.append(_raw(sign_for(me, _open_records(peer.run_id, round_, me)[0], 600)))
    stored = sum(await _store_raw(peer, records))
    lost = before - await miners()
    needed = before & standing
    detail = (
        f"{stored} of {EVICT_KEYS} sybil heartbeats stored; {len(lost & standing)} of {len(needed)} heartbeats of "
        f"miners with standing lost ({len(lost - standing)} of {len(before - standing)} newcomers')"
    )
    if not needed:
        return Played("dht", "skipped", f"no miner with standing announced this round; {detail}")
    return Played("dht", "kept" if not lost & needed else "breached", detail)


async def _aggregated(peer: P2PPeer, round_: int) -> tuple[ScoredSubmission, ...]:
    result = await peer.from_validator(RoundResult, round_)
    return result.selected if result is not None else ()


async def rl_unserved(peer: P2PPeer, round_: int) -> Played:
    records = []
    for _ in range(UNSERVED_KEYS):
        me = Identity.generate()
        a = RolloutAnnouncement(
            run_id=peer.run_id, round=round_, state_hash=_h(f"s{round_}"), blob_sha256=os.urandom(32).hex(),
            blob_size=4096, groups=1, mean_reward=0.0,
        )  # fmt: skip
        records.append(_raw(sign_for(me, a, 600)))
    stored = sum(await _store_raw(peer, records))
    return Played("validator", "sent", f"{stored} of {UNSERVED_KEYS} announcements of blobs nobody serves stored")


async def rl_push_flood(peer: P2PPeer, round_: int) -> Played:
    validator = peer.validator_peer
    if validator is None:
        return Played("validator", "skipped", "the validator's peer id is unknown")
    answers: list[str] = []
    for _ in range(PUSH_FLOOD_KEYS):
        me, data = Identity.generate(), os.urandom(4096)
        sha = peer.store.put(data)
        a = RolloutAnnouncement(
            run_id=peer.run_id, round=round_, state_hash=_h(f"s{round_}"), blob_sha256=sha, blob_size=len(data),
            groups=1, mean_reward=0.0,
        )  # fmt: skip
        try:
            await peer.submit(sign_for(me, a, 600), peer.store.path(sha), to=validator)
            answers.append("OK")
        except PEER_ERRORS as exc:
            answers.append(str(exc))
        finally:
            peer.store.remove(sha)
    taken = answers.count("OK")
    drawn = sum("not drawn" in a for a in answers)
    detail = f"{taken} of {PUSH_FLOOD_KEYS} pushes taken ({drawn} not drawn, {len(answers) - taken - drawn} other)"
    return Played("validator", "sent", detail)


PLAYS: dict[str, Callable[[P2PPeer, int], Awaitable[Played]]] = {
    "probe-flood": probe_flood,
    "range-flood": range_flood,
    "dht-future": dht_future,
    "dht-evict": dht_evict,
    "rl-unserved": rl_unserved,
    "rl-push-flood": rl_push_flood,
}
"""The attacks of this file by name (`attacks.ATTACKS`), as `hostile.py` plays them."""
