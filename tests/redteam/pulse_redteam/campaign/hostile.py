"""A hostile miner process: `python -m pulse_redteam.campaign.hostile --attacks a,b --keys K1 K2 ...`.

It joins a run like a miner (DHT peer, checkpoint and patch chain, a heartbeat as a miner each
round, so the validator waits for it) and in every round pushes one hostile submission per key
over the real submit stream. Key i plays `attacks[i % n]`, or with `--rotate` attack
`attacks[(i + round * keys) % n]`, so a few keys meet every attack over a few rounds.

Attacks on the network layer itself (DHT floods and pinning, stream-slot holders, pushes to
miners and followers: `netattacks.py`) log one `net_attack` event per target instead.

Each push is logged as one `attack` event: the attack, round, signer, message id, payload hash
and what the validator answered on the stream (OK = stored and handed to the round; anything
else is a refusal with the validator's reason). The validator's own verdict on the stored ones is
in its `round` events; `ledger.py` joins the two.

Attacks that copy or combine honest updates (copy, near-copy, ALIE, IPM) fetch the honest
miners' payloads of the round from the miners themselves: a miner announces its signed header in
the DHT after submitting and keeps the payload fetchable, as any peer could see.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import torch
from hivemind.p2p import PeerID
from pydantic import Field, model_validator

from node.commands.options import script_options
from node.events import Events
from node.events.campaign import AttackSent, AttackSkipped, HostileDone, NetAttack, Uploading
from node.events.models import Started
from node.net.keyfile import load_key_file
from node.net.netconfig import NetOptions
from node.net.p2ppeer import P2PPeer
from node.net.transfer import call_fetch
from node.roles.catchup import Chain, Held
from node.roles.records import run_records
from node.run.manifest import load_manifest
from node.run.setup import RunSetup
from node.swarm.fakeminers import Miner, make_adversary
from protocol.errors import ProtocolError, TransferError
from protocol.identity import Identity
from protocol.messages import Heartbeat, SubmissionHeader
from protocol.signing import SignedMessage
from protocol.state import State
from pulse_redteam.campaign import budgetattacks, crafting, netattacks, standing
from pulse_redteam.campaign.attacks import ATTACKS, FLOOD, NEEDS_HONEST, NETWORK, NOISE_FLOOD, TRAINED
from pulse_redteam.campaign.crafting import Forge
from pulse_redteam.campaign.push import Answer, Trickle, push
from validator.intake import Submission

T = TypeVar("T")
log = logging.getLogger("pulse.hostile")
POLL_SECONDS = 0.5
SYBILS = 20
# pushes that keep to the stream cap and take no BUSY retry
FLOODS = ("flood", "standby-flood", "noise-flood", "late-flood")
STREAMS = 3
# a push answered BUSY (the newcomers' upload slots, which every hostile process of a swarm shares)
# is sent again after these pauses, as an honest miner's is: the attack then meets its own defence,
# not the upload budget; the sybil and the flood, whose point is the budget, take the first answer
BUSY_PAUSES = (0.5, 1.0, 2.0, 4.0)
STREAMED = ("public-slice", "median-whisper")  # a payload per derived key, each pushed once made


class Hostile:
    def __init__(self, setup: RunSetup, keys: list[Identity], attacks: list[str], rotate: bool, peer: P2PPeer) -> None:
        self.setup, self.keys, self.attacks, self.rotate, self.peer = setup, keys, attacks, rotate, peer
        self.events: Events = Events("hostile")
        self.fake = crafting.fake_setup(setup)
        self.trainers: dict[tuple[str, str], Miner] = {}
        self.history: list[tuple[int, Submission]] = []  # (round sent, submission) of stored pushes
        self.previous: tuple[State, str] | None = None
        self.training = threading.Lock()  # `_trained`
        self.deadline = 0.0
        self.tasks: list[asyncio.Task[None]] = []
        self.mine = {k.public_hex for k in keys}
        self.offset, self.stride = 0, 0
        self.victims: list[str] = []  # other miners' keys, from their heartbeats (a thief's victims)
        self.standby_peer: str | None = None  # a standby validator's peer id (`standby-flood`)

    def attack(self, i: int, round_: int) -> str:
        """Key i's attack in `round_`; `offset`/`stride` spread one rotation over several processes."""
        n, stride = len(self.attacks), self.stride or len(self.keys)
        return self.attacks[(i + self.offset + round_ * stride) % n if self.rotate else i % n]

    async def run(self, rounds: int) -> None:
        self.gate = asyncio.Semaphore(STREAMS)
        self.chain = Chain(self.peer, self.events)
        held = await self.chain.sync()
        done: set[tuple[int, str, int]] = set()
        while held.round < rounds:
            held = await self._advance(held)
            if held.round >= rounds:
                break
            r = held.round
            beat = await self.peer.validator_heartbeat(r)
            opened = (r, beat.peer_id, beat.sent_at) if beat is not None else None
            if opened is None or opened in done or await self.peer.round_result(r) is not None:
                await asyncio.sleep(POLL_SECONDS)
                continue
            done.add(opened)
            self.deadline = opened[2] + self.setup.manifest.round.deadline_seconds
            await self.peer.heartbeat(r, held.state_hash)
            forge = Forge(self.setup, r, held.weights, held.state_hash)
            for i, me in enumerate(self.keys):
                self.tasks.append(asyncio.ensure_future(self._play(self.attack(i, r), me, forge)))
        await asyncio.wait_for(asyncio.gather(*self.tasks), 180.0)
        self.events.emit(HostileDone(round=held.round, state_hash=held.state_hash), f"done at round {held.round}")

    async def _advance(self, held: Held) -> Held:
        new = await self.chain.sync()
        if new.round != held.round:
            self.previous = (held.weights, held.state_hash) if new.round == held.round + 1 else None
        return new

    async def _play(self, attack: str, me: Identity, forge: Forge) -> None:
        if attack in NETWORK or attack in budgetattacks.PLAYS:
            await self._network(attack, me, forge)
            return
        if attack in STREAMED:
            await self._stream(attack, me, forge)
            return
        try:
            sends = await self._craft(attack, me, forge)
        except (TransferError, ProtocolError) as exc:
            sends = []
            skipped = AttackSkipped(round=forge.round, attack=attack, sender=me.public_hex, reason=str(exc))
            self.events.emit(skipped, f"{attack}: {exc}")
        if not sends:
            return
        answers = await asyncio.gather(*(self._gated(attack, forge.round, *send) for send in sends))
        for (sub, _), answer in zip(sends, answers, strict=True):
            if answer.stored:
                self.history.append((forge.round, sub))

    async def _stream(self, attack: str, me: Identity, forge: Forge) -> None:
        """An attack of many payloads (`standing.py`), each pushed as soon as it is made."""
        if self.previous is None:  # no public step yet (the first round, or a round skipped)
            return
        step = self.previous[0]
        made = (
            standing.public_slices(forge, me, step)
            if attack == "public-slice"
            else standing.whispers(forge, me, step, _seed(me, forge.round))
        )
        sends: list[tuple[Submission, asyncio.Future[Answer]]] = []
        while (sub := await self._cpu(lambda: next(made, None))) is not None:
            sends.append((sub, asyncio.ensure_future(self._gated(attack, forge.round, sub, {}))))
        for sub, answer in sends:
            if (await answer).stored:
                self.history.append((forge.round, sub))

    async def _network(self, attack: str, me: Identity, forge: Forge) -> None:
        """An attack on the DHT or the streams (`netattacks.py`): one `net_attack` event per target."""
        r = forge.round
        if attack == "dht-flood":
            played = [await netattacks.dht_flood(self.peer, r)]
        elif attack == "dht-pin":
            played = [await netattacks.dht_pin(self.peer, r)]
        elif attack in budgetattacks.PLAYS:
            played = [await budgetattacks.PLAYS[attack](self.peer, r)]
        elif attack in ("slot-silent", "slot-trickle"):
            played = [await netattacks.slot_holders(self.peer, trickle=attack == "slot-trickle")]
        else:
            envelope = forge.submission(me, crafting.junk(r, 1 << 16)).envelope
            played = await netattacks.push_miner(self.peer, r, envelope)
        for p in played:
            event = NetAttack(
                round=r, attack=attack, sender=me.public_hex, target=p.target, outcome=p.outcome,
                detail=p.detail, seconds=p.seconds,
            )  # fmt: skip
            self.events.emit(event, f"round {r}: {attack} on the {p.target}: {p.outcome} ({p.detail})")

    async def _gated(self, attack: str, round_: int, sub: Submission, mode: dict[str, object]) -> Answer:
        """At most `STREAMS` pushes of this process at once (the validator's cap per peer is 4); the
        sybil is the exception: it opens all its streams at once. The flood keeps to the cap, so its
        pushes meet the round's admission rather than the stream limits."""
        if attack == "sybil":
            return await self._push(attack, round_, sub, mode)
        async with self.gate:
            return await self._push(attack, round_, sub, mode, () if attack in FLOODS else BUSY_PAUSES)

    async def _push(
        self, attack: str, round_: int, sub: Submission, mode: dict[str, object], pauses: tuple[float, ...] = ()
    ) -> Answer:
        signed = SignedMessage.from_bytes(sub.envelope)
        body = sub.read()
        uploading = asyncio.Event()
        watcher = asyncio.ensure_future(self._say_uploading(uploading, attack, round_, signed))
        target = self.standby_peer if attack == "standby-flood" else self.peer.validator_peer
        assert target is not None  # the round is open: its validators' heartbeats were read
        for pause in (*pauses, None):
            answer = await push(
                self.peer.p2p,
                PeerID.from_base58(target),
                sub.envelope,
                body,
                on_body=uploading,
                **mode,  # type: ignore[arg-type]
            )
            if answer.status != "BUSY" or pause is None:
                break
            await asyncio.sleep(pause)
        watcher.cancel()
        sent = AttackSent(
            round=round_,
            attack=attack,
            sender=signed.sender_hex,
            header_round=signed.round,
            message_id=signed.message_id,
            payload_sha256=hashlib.sha256(body).hexdigest(),
            status=answer.status,
            reason=answer.reason,
            body_sent=answer.body_sent,
            peer_id=self.peer.peer_id,
        )
        self.events.emit(
            sent, f"round {round_}: {attack} from {signed.sender_hex[:12]}: {answer.status} {answer.reason}"
        )
        return answer

    async def _say_uploading(self, started: asyncio.Event, attack: str, round_: int, signed: SignedMessage) -> None:
        await started.wait()
        sender = signed.sender_hex
        self.events.emit(Uploading(round=round_, attack=attack, sender=sender), f"{attack}: sending the body")

    # -- crafting --------------------------------------------------------------------------------

    async def _craft(self, attack: str, me: Identity, forge: Forge) -> list[tuple[Submission, dict[str, object]]]:
        """(submission, how to push it) for each push this attack makes this round."""
        seed = _seed(me, forge.round)
        if attack == "standby-flood" and await self._standby(forge.round) is None:
            raise TransferError("no standby validator announced the round")
        if attack in ("noise-flood", "late-flood"):
            return await self._cpu(lambda: self._noise_flood(me, forge, seed, late=attack == "late-flood"))
        if attack in ("sybil", *FLOODS):
            n = SYBILS if attack == "sybil" else FLOOD
            flood = [Identity.from_seed(hashlib.sha256(f"{attack}/{seed}/{i}".encode()).digest()) for i in range(n)]
            return [(forge.submission(s, crafting.junk(seed + i)), {}) for i, s in enumerate(flood)]
        if attack == "header-only":
            return [(forge.submission(me, forge.compress(forge.small_update(seed))), {"cut_at": 0})]
        if attack == "replay":
            old = [sub for r, sub in self.history if r < forge.round]
            return [(old[-1], {})] if old else []
        if attack in NEEDS_HONEST:
            honest = await self._honest_payloads(forge.round, 1 if attack in ("copy", "near-copy") else 2)
            if len(honest) < (1 if attack in ("copy", "near-copy") else 2):
                raise TransferError(f"only {len(honest)} honest payloads were fetchable in time")
            payload = await self._cpu(lambda: _from_honest(attack, forge, honest, seed))
            return [(forge.submission(me, payload), {})]
        if attack in TRAINED:
            if attack == "thief":
                await self._find_victims(forge.round)
            return [(await self._cpu(lambda: self._trained(attack, me, forge)), {})]
        return [_malformed(attack, forge, me, seed)]

    async def _standby(self, round_: int) -> str | None:
        """The peer id of a standby validator (any but the manifest's first) that announced `round_`."""
        standbys = self.setup.manifest.validators[1:]
        beats = await self.peer.validator_heartbeats(round_)
        found = [v.message.peer_id for v in beats if v.sender_hex in standbys]
        self.standby_peer = found[0] if found else None
        return self.standby_peer

    def _trained(self, attack: str, me: Identity, forge: Forge) -> Submission:
        # one at a time: a round that closes abandons its push, not the executor thread still training
        # for it, and the next round's run of the same attack must not step the same model meanwhile
        with self.training:
            return self._train(attack, me, forge)

    def _train(self, attack: str, me: Identity, forge: Forge) -> Submission:
        kind = TRAINED[attack]
        miner = self.trainers.get((attack, me.public_hex))
        if miner is None:
            miner = self.trainers[(attack, me.public_hex)] = make_adversary(kind, self.fake, me, ["0" * 64])
        if kind == "thief":
            miner.victims = self.victims or [me.public_hex]  # type: ignore[attr-defined]
        sub = miner.submit(forge.view(self.previous))
        assert sub is not None
        return sub

    def _noise_flood(
        self, me: Identity, forge: Forge, seed: int, *, late: bool = False
    ) -> list[tuple[Submission, dict[str, object]]]:
        """`NOISE_FLOOD` fresh keys, each a random update at the norm of the update `me` trained this
        round: one miner's work buys the norm, and each key's payload then costs a compression
        (`late`: its last byte changed, `crafting.noise_flood`)."""
        with self.training:  # one model per process steps at a time (`_trained`)
            miner = self.trainers.get(("noise-flood", me.public_hex))
            if miner is None:
                miner = self.trainers[("noise-flood", me.public_hex)] = Miner(self.fake, me)
            trained = miner.train(forge.weights, miner.assignment(forge.round))
        return crafting.noise_flood(forge, trained, seed, NOISE_FLOOD, late=late)

    async def _cpu(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(None, fn)

    async def _find_victims(self, round_: int) -> dict[str, str]:
        """Other miners of the round (key -> peer id), from their heartbeats."""
        beats = {
            v.sender_hex: v.message.peer_id
            for v in await self.peer.get(Heartbeat, round_)
            if v.message.role == "miner" and v.sender_hex not in self.mine
        }
        self.victims = sorted(beats) or self.victims
        return beats

    async def _honest_payloads(self, round_: int, want: int) -> list[bytes]:
        """Payloads other miners submitted this round, fetched from them; waits until 6 s before the deadline."""
        got: dict[str, bytes] = {}
        until = self.deadline - 6.0
        while len(got) < want and time.time() < until:
            beats = await self._find_victims(round_)
            for v in await self.peer.get(SubmissionHeader, round_):
                h = v.message
                if h.payload_sha256 in got or v.sender_hex not in beats:
                    continue
                try:
                    path = await call_fetch(
                        self.peer.p2p,
                        PeerID.from_base58(beats[v.sender_hex]),
                        h.payload_sha256,
                        self.peer.store,
                        max_size=h.payload_size,
                    )
                except (TransferError, ProtocolError) as exc:
                    log.info("could not fetch %s's payload: %s", v.sender_hex[:12], exc)
                    continue
                got[h.payload_sha256] = path.read_bytes()
            if len(got) < want:
                await asyncio.sleep(POLL_SECONDS)
        return list(got.values())


def _from_honest(attack: str, forge: Forge, honest: list[bytes], seed: int) -> bytes:
    if attack == "copy":
        return honest[0]
    if attack == "near-copy":
        return crafting.near_copy(forge, honest[0], seed)
    if attack == "alie":
        return crafting.alie(forge, honest)
    return crafting.inner_product_manipulation(forge, honest)


def _seed(me: Identity, round_: int) -> int:
    return int.from_bytes(hashlib.sha256(f"{me.public_hex}/{round_}".encode()).digest()[:4], "big")


def _malformed(attack: str, forge: Forge, me: Identity, seed: int) -> tuple[Submission, dict[str, object]]:
    small = lambda: forge.compress(forge.small_update(seed))  # noqa: E731
    makers: dict[str, Callable[[], tuple[Submission, dict[str, object]]]] = {
        "other-run": lambda: (crafting.other_run(forge, me, small()), {}),
        "other-round": lambda: (crafting.other_round(forge, me, small()), {}),
        "forged-sig": lambda: (crafting.forged_signature(forge, me, small()), {}),
        "size-lie": lambda: _size_lie(forge, me, small()),
        "truncated": lambda: (forge.submission(me, p := small()), {"cut_at": len(p) // 2}),
        "slow": lambda: (forge.submission(me, small()), {"trickle": Trickle(step=64, pause=0.5)}),
        "oversize": lambda: (forge.submission(me, crafting.oversize(forge, seed)), {}),
        "zstd-bomb": lambda: (forge.submission(me, crafting.zstd_bomb(forge)), {}),
        "tiny-dense": lambda: (forge.submission(me, crafting.tiny_dense(forge)), {}),
        "trailing": lambda: (forge.submission(me, crafting.trailing_bytes(forge, seed)), {}),
        "out-of-range": lambda: (forge.submission(me, crafting.tampered_positions(forge, seed, "range")), {}),
        "dup-positions": lambda: (forge.submission(me, crafting.tampered_positions(forge, seed, "duplicate")), {}),
        "nan": lambda: (forge.submission(me, crafting.poisoned_values(forge, seed, math.nan)), {}),
        "inf": lambda: (forge.submission(me, crafting.poisoned_values(forge, seed, math.inf)), {}),
    }
    return makers[attack]()


def _size_lie(forge: Forge, me: Identity, payload: bytes) -> tuple[Submission, dict[str, object]]:
    """The header names the whole payload's hash but half its size; the whole payload is sent."""
    return forge.submission(me, payload, payload_size=len(payload) // 2), {}


# -- process entry point -------------------------------------------------------------------------


class HostileOptions(NetOptions):
    """The hostile miner's options (`python -m pulse_redteam.campaign.hostile`)."""

    config: Path
    """run manifest TOML"""
    keys: list[Path] = Field(min_length=1)
    """one key file per hostile identity"""
    attacks: str
    """comma-separated attack names"""
    rotate: bool = False
    """key i plays a different attack each round"""
    offset: int = 0
    """with --rotate: key i starts at attack i + offset"""
    stride: int = Field(default=0, ge=0)
    """with --rotate: attacks skipped per round (default keys)"""
    rounds: int = Field(ge=0)
    """stop after this round"""
    events: Path
    """JSON lines of what it did"""
    state_dir: Path
    """folder for blobs"""
    threads: int = Field(default=1, ge=0)
    """torch CPU threads"""

    @property
    def attack_list(self) -> list[str]:
        return [a for a in self.attacks.split(",") if a]

    @model_validator(mode="after")
    def _known(self) -> HostileOptions:
        if unknown := sorted(set(self.attack_list) - set(ATTACKS)):
            raise ValueError(f"unknown attacks {unknown}, of {sorted(ATTACKS)}")
        return self


def main(argv: list[str] | None = None) -> int:
    options = script_options(HostileOptions, argv, "python -m pulse_redteam.campaign.hostile", __doc__)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(options.threads)
    setup = RunSetup.from_manifest(load_manifest(options.config))
    keys = [load_key_file(k) for k in options.keys]
    return asyncio.run(_run(options, setup, keys, options.attack_list))


async def _run(args: HostileOptions, setup: RunSetup, keys: list[Identity], attacks: list[str]) -> int:
    peer = await P2PPeer.create(args.net_config(), run_records(setup.manifest), keys[0], args.state_dir, role="miner")
    hostile = Hostile(setup, keys, attacks, args.rotate, peer)
    hostile.offset, hostile.stride = args.offset, args.stride
    hostile.events = Events("hostile", args.events)
    hostile.events.emit(
        Started(senders=[k.public_hex for k in keys], peer_id=peer.peer_id),
        f"hostile miner with {len(keys)} keys: {','.join(attacks)}",
    )
    try:
        await hostile.run(args.rounds)
    finally:
        await peer.shutdown()
        hostile.events.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
