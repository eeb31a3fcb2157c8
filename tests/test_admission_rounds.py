"""Admission and the validator's payloads, in whole in-process rounds of the real validator service.

Two honest miners work rounds 0 and 1 (a round of standing each is enough here: by round 2 those
whose update gained with own-data indicator +1 are established). The test holds them back at the
start of rounds 1 and 2 and meanwhile plays:

- round 1: one key pushes two bodies at once (the second must be refused, and leave nothing on
  disk); another key pushes, as its payload, the bytes of the round-0 patch the validator serves
  (the payload must not replace or remove the served blob);
- round 2: a flood of fresh keys pushes junk before the honest miners, more keys than the round
  has seats, against a small byte budget. The junk is payloads of the run's codec (dense here:
  86 KB each) carrying a NaN: they read whole and fail only once decoded, so each holds its seat
  and bytes until the round is scored (random bytes are refused as they land,
  `test_standby_intake.py`).

Then: the honest miners are seated and evaluated (not silently ignored behind the flood); every
flood push was refused with a reason on the stream, dropped with a reason, or named in the round;
the payloads held on disk never exceeded the budget and no payload is held in memory; after the
rounds the validator holds nothing but its patches and checkpoints.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import math
import os
import struct
import tracemalloc
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from node.events import EventLog, Events, read_events
from node.events.models import Dropped, Missed, RoundClosed
from node.net.memory import MemoryNetwork, MemoryPeer
from node.roles.intake import RoundIntake
from node.roles.miner import Miner, RoundInputs
from node.roles.records import run_records
from node.roles.tasks import validator_for
from node.roles.validator_service import ValidatorService
from node.run.manifest import Manifest, codec_for
from node.run.setup import RunSetup
from node.run.task import task_for
from protocol.assignment import Assignment
from protocol.errors import TransferError
from protocol.identity import Identity
from protocol.messages import SubmissionHeader
from protocol.signing import sign
from protocol.state import State
from protocol.warmup import warm_up
from tests.helpers import apoll
from tests.rounds import (
    POLL,
    key,
    lm_manifest,
)
from validator.admission import AdmissionRules
from validator.newcomers import NOT_EXAMINED

ROUNDS = 3
FLOOD = 140  # more fresh keys than the round's 128 seats
SEATS_OF_BUDGET = 40  # round 2's payload budget, in flood payloads (the default is far larger)
STREAMS = 16  # the validator's stream slots: a body already on its way when its seat goes on arriving
DEADLINE = 90.0
TIMEOUT = 2 * DEADLINE


class Gate(RoundInputs):
    """Keeps a miner from training round r until the test sets `opened[r]`."""

    def __init__(self, opened: dict[int, asyncio.Event]) -> None:
        self.opened = opened

    async def ready(self, round_: int) -> bool:
        gate = self.opened.get(round_)
        return gate is None or gate.is_set()


@dataclass
class Observed:
    log: EventLog
    honest: list[str]
    flood: list[str]
    flood_refusals: dict[str, str] = field(default_factory=dict)  # sender -> reason answered on the stream
    double: list[str] = field(default_factory=list)  # the two answers to one key's two bodies
    patch_sha: str = ""
    patch_served_after: bool = False
    peak_held_bytes: int = 0
    traced_growth: int = 0
    leftovers: list[str] = field(default_factory=list)
    established: set[str] = field(default_factory=set)  # keys established when round 2 opened
    junk_bytes: int = 0  # the size of a flood payload


class Pusher:
    """A sybil's side: any number of keys pushing signed headers from a few in-memory peers."""

    def __init__(self, network: MemoryNetwork, root: Path, setup: RunSetup, peers: int = 3) -> None:
        self.setup = setup
        self.peers = [network.join(key(f"pusher{i}"), root / f"pusher{i}", role="miner") for i in range(peers)]

    async def push(self, me: Identity, payload: bytes, round_: int, base: str, peer: MemoryPeer) -> str | None:
        """Push one submission; None if the validator took it, else its answer."""
        batches = self.setup.manifest.selection.assignment_batches
        header = SubmissionHeader.for_payload(
            run_id=self.setup.run_id, round_=round_, base_hash=base, payload=payload,
            codec=self.setup.manifest.train.codec, sender=me.public_hex,
            data_digest=Assignment(self.setup.run_id, round_, me.public_hex, batches).digest,
        )  # fmt: skip
        path = peer.store.path(peer.store.put(payload))
        await peer.validator_heartbeat(round_)
        try:
            await peer.submit(sign(me, header), path)
        except TransferError as exc:
            return str(exc)
        return None


def late_failing(setup: RunSetup, weights: State, seed: int) -> bytes:
    """A dense payload for `weights` whose last value is a NaN: it reads whole and fails only once
    decoded."""
    g = torch.Generator().manual_seed(seed)
    delta = {name: torch.randn(t.shape, generator=g) * 1e-3 for name, t in weights.items()}
    payload = codec_for(setup.manifest).compress(delta, None, weights)[0]
    return payload[:-4] + struct.pack("<f", math.nan)


def unserved_files(folder: Path, served: set[str]) -> list[Path]:
    """Files under the validator's blob folders that are not blobs it serves (patches, checkpoints)."""
    return [
        Path(dirpath) / name
        for sub in ("blobs", "inbox")
        for dirpath, _, files in os.walk(folder / sub)
        for name in sorted(set(files) - served)
    ]


def held_payload_bytes(folder: Path, served: set[str]) -> int:
    total = 0
    for path in unserved_files(folder, served):
        with contextlib.suppress(FileNotFoundError):  # a reception may finish or fail meanwhile
            total += path.stat().st_size
    return total


async def play(root: Path) -> Observed:
    fields = lm_manifest().model_dump()
    fields["train"].update(codec="dense", codec_options={})  # payloads large enough to weigh on disk
    manifest = Manifest.model_validate(fields)
    # a long deadline: rounds close early once the miners they wait for submitted, and a loaded
    # machine (or the codecs' first compile) must not make the miners miss rounds 0 and 1
    manifest = manifest.model_copy(update={"round": manifest.round.model_copy(update={"deadline_seconds": DEADLINE})})
    setup = RunSetup.from_manifest(manifest)
    task = task_for(setup)
    network = MemoryNetwork(run_records(manifest))
    me = key("validator")
    events = Events("validator", root / "events" / "validator.jsonl")
    intake = RoundIntake(setup, events, root / "validator" / "inbox")
    vpeer = network.join(me, root / "validator", role="validator", intake=intake)
    service: ValidatorService = validator_for(setup, task, me, root / "validator", vpeer, events, intake, poll=POLL)
    # one earned round establishes a miner here: two rounds of two miners are all this test has
    service.validator.cfg = service.validator.cfg.model_copy(update={"established_rounds": 1})
    opened = {1: asyncio.Event(), 2: asyncio.Event()}
    miners = []
    for i in range(2):
        ident = key(f"miner{i}")
        peer = network.join(ident, root / f"miner{i}", role="miner")
        miner_events = Events("miner", root / "events" / f"miner{i}.jsonl")
        miners.append(Miner(setup, peer, miner_events, task.trainer(ident), Gate(opened), poll=POLL))
    pusher = Pusher(network, root, setup)
    flood = [Identity.from_seed(hashlib.sha256(f"flood/{i}".encode()).digest()) for i in range(FLOOD)]
    seen = Observed(EventLog([]), [key(f"miner{i}").public_hex for i in range(2)], [f.public_hex for f in flood])
    running = [asyncio.ensure_future(service.run(ROUNDS))]
    work = [asyncio.ensure_future(m.run(ROUNDS)) for m in miners]
    running += work

    async def round_open(r: int) -> None:
        assert await apoll(lambda: service.round == r and not service.closed, TIMEOUT, POLL), f"round {r} never opened"

    try:
        await round_open(1)
        base = service.validator.state_hash
        twice = key("twice")
        seen.double = [
            str(answer)
            for answer in await asyncio.gather(
                pusher.push(twice, late_failing(setup, service.validator.weights, 1), 1, base, pusher.peers[0]),
                pusher.push(twice, late_failing(setup, service.validator.weights, 2), 1, base, pusher.peers[1]),
            )
        ]
        patch = service.validator.last_patch
        assert patch is not None
        seen.patch_sha = hashlib.sha256(patch).hexdigest()
        await pusher.push(key("patch-bytes"), patch, 1, base, pusher.peers[2])
        opened[1].set()

        await round_open(2)
        # the two probe keys of round 1 sent bytes that never decoded: round 2 does not wait for them
        # (it would, until its deadline, for every key of a flood that sent once)
        probes = {twice.public_hex, key("patch-bytes").public_hex}
        assert not service.previous_senders & probes
        assert service.previous_senders <= {key(f"miner{i}").public_hex for i in range(2)}
        junk = [late_failing(setup, service.validator.weights, 100 + i) for i in range(FLOOD)]
        seen.junk_bytes = max(len(j) for j in junk)
        intake.rules = AdmissionRules(capacity=128, newcomer_seats=16, byte_budget=SEATS_OF_BUDGET * seen.junk_bytes)
        # round 2's seats were made when it opened: make them again under the small budget
        intake.admission = type(intake.admission)(intake.rules, intake.admission.established, intake.admission.secret)
        seen.established = set(intake.admission.established)
        base = service.validator.state_hash
        served = set(vpeer.held)
        gates = [asyncio.Semaphore(3) for _ in pusher.peers]  # under the 4 streams a peer may hold
        tracemalloc.start()
        start = tracemalloc.get_traced_memory()[0]

        async def one(i: int, sybil: Identity) -> None:
            async with gates[i % len(gates)]:
                payload, junk[i] = junk[i], b""
                answer = await pusher.push(sybil, payload, 2, base, pusher.peers[i % len(gates)])
                del payload
                if answer is not None:
                    seen.flood_refusals[sybil.public_hex] = answer
                seen.peak_held_bytes = max(seen.peak_held_bytes, held_payload_bytes(root / "validator", served))

        await asyncio.gather(*(one(i, s) for i, s in enumerate(flood)))
        seen.traced_growth = tracemalloc.get_traced_memory()[0] - start
        tracemalloc.stop()
        opened[2].set()
        await asyncio.wait_for(asyncio.gather(*work), TIMEOUT)
        last = lambda: read_events(root / "events").has(RoundClosed, "validator", ROUNDS - 1)  # noqa: E731
        assert await apoll(last, TIMEOUT, POLL, blocking=True), "the last round was never reported closed"
        seen.patch_served_after = vpeer.store.has(seen.patch_sha)
        seen.leftovers = [p.name for p in unserved_files(root / "validator", set(vpeer.held))]
    finally:
        if tracemalloc.is_tracing():
            tracemalloc.stop()
        for future in running:
            future.cancel()
        for future in running:
            with contextlib.suppress(asyncio.CancelledError):
                await future
        await network.shutdown()
    seen.log = read_events(root / "events")
    return seen


@pytest.fixture(scope="module")
def observed(tmp_path_factory: pytest.TempPathFactory) -> Observed:
    torch.set_num_threads(1)
    warm_up()  # compile the codec kernels before the rounds: a cold compile must not cost the miners their rounds
    return asyncio.run(play(tmp_path_factory.mktemp("admission-rounds")))


def closed(seen: Observed, r: int) -> RoundClosed:
    return next(e for e in seen.log.events(RoundClosed, "validator") if e.round == r)


def test_established_miners_are_seated_behind_a_flood_of_fresh_keys(observed: Observed) -> None:
    r2 = closed(observed, 2)
    assert observed.established and observed.established <= set(observed.honest)
    assert r2.established == len(observed.established)
    for miner in observed.established:
        assert miner in r2.scores or miner in r2.rejections, "an established miner was silently ignored"
        why = r2.rejections.get(miner, "")
        assert "full" not in why and not why.startswith(NOT_EXAMINED), f"an established miner was not examined: {why}"


def test_an_honest_newcomer_behind_the_flood_is_told_why(observed: Observed) -> None:
    """A miner that earned no standing yet draws for a newcomer seat with the flood's fresh keys (it
    is seated in about one round in four here); either way it hears the outcome."""
    r2 = closed(observed, 2)
    for miner in set(observed.honest) - observed.established:
        if miner in r2.scores or miner in r2.rejections:
            continue
        name = f"miner{observed.honest.index(miner)}"  # honest[i] is miner i's key
        missed = [e for e in observed.log.events(Missed, name) if e.round == 2]
        assert missed and "not drawn" in missed[0].reason, "an honest newcomer was silently ignored"


def test_every_flood_push_has_one_outcome_with_a_reason(observed: Observed) -> None:
    r2 = closed(observed, 2)
    dropped = {e.sender: e.reason for e in observed.log.events(Dropped, "validator") if e.round == 2}
    assert len(observed.flood_refusals) >= FLOOD - 128, "more keys than seats, and none refused"
    for sybil in observed.flood:
        outcomes = [
            sybil in observed.flood_refusals,
            sybil in dropped,
            sybil in r2.scores or sybil in r2.rejections,
        ]
        assert sum(outcomes) == 1, (sybil[:12], outcomes)
    reasons = list(observed.flood_refusals.values()) + list(dropped.values())
    # drawn out by admission, or turned away by the upload budget before admission ("BUSY")
    assert all(any(why in r for why in ("not drawn", "budget", "unseated", "BUSY")) for r in reasons), set(reasons)
    assert any("not drawn" in r or "unseated" in r for r in reasons)
    assert r2.offered >= FLOOD and r2.refused + r2.unseated >= FLOOD - 128


def test_payloads_held_for_a_round_stay_within_the_budget_and_out_of_memory(observed: Observed) -> None:
    # seated payloads stay within the budget; a body whose seat went to another newcomer while it
    # was arriving is refused when it lands, so at most the stream slots' worth come on top
    junk = observed.junk_bytes
    assert 0 < observed.peak_held_bytes <= (SEATS_OF_BUDGET + STREAMS) * junk < FLOOD * junk / 2
    assert observed.traced_growth < FLOOD * junk / 4  # payloads stay on disk, not in the process


def test_a_refused_body_leaves_nothing_and_a_served_blob_is_never_touched(observed: Observed) -> None:
    answers = sorted(observed.double, key=lambda a: a != "None")
    # the second body is refused after it arrived, or before it starts while the first is arriving
    second = ("one submission per miner per round", "already arriving")
    assert answers[0] == "None" and any(why in answers[1] for why in second), answers
    assert observed.patch_served_after, "a payload equal to a served patch removed it from the store"
    assert observed.leftovers == []
