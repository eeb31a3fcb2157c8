"""A standby validator's intake is the active validator's: the same admission and header checks.

A run with two validators; validator B stands by for round 2 (its auditor's replica holds W_2, and
its book says miner M earned standing in rounds 0 and 1: M is established). Pushed to B, over the
in-memory network's real submit conversation:

- headers that claim another base state or another codec are refused before any body byte is read
  (nothing lands in the inbox, no seat is taken);
- a payload larger than the round's byte budget is refused from its header;
- a flood of fresh keys fills the newcomer seats (the rest are "not drawn") without holding more
  than the byte budget on disk;
- a body that is no payload of the run's codec is refused as it lands and its seat freed: junk
  from fresh keys that came first does not keep later newcomers out;
- then M, established, is seated all the same (a newcomer is unseated and reported), and the
  service B would start on takeover is handed the same intake with what it collected.
"""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import torch

from node.events import Events, read_events
from node.events.models import Dropped
from node.net.memory import MemoryNetwork, MemoryPeer
from node.roles.intake import RoundIntake
from node.roles.records import run_records
from node.roles.tasks import validator_role_for
from node.run.manifest import Manifest, codec_for
from node.run.setup import RunSetup
from node.run.task import task_for
from protocol.assignment import Assignment
from protocol.errors import TransferError
from protocol.identity import Identity
from protocol.messages import SubmissionHeader
from protocol.signing import sign
from protocol.state import State
from validator.admission import AdmissionRules
from validator.audit import Replica
from validator.core import initial_snapshot

FLOOD = 24  # fresh keys, three times the round's seats
SEATS = 8
NEWCOMER_SEATS = 4
BODY = 1000  # bytes of a junk body
BUDGET = 16 * BODY  # above SEATS payloads of the run's codec (each under BODY) ...
BIG = BUDGET + 1  # ... and below this
EARLIER = "e" * 64  # the state of round 0, as B's book names it
ROUND = 2  # the round B opens: M earned standing in rounds 0 and 1 (`established_rounds`)


def key(label: str) -> Identity:
    return Identity.from_seed(hashlib.sha256(f"pulse-test-standby-intake/{label}".encode()).digest())


def manifest() -> Manifest:
    return Manifest.model_validate(
        {
            "name": "standby-intake",
            "validators": [key("a").public_hex, key("b").public_hex],
            "model": {"gpt": {"block_size": 16, "n_layer": 1, "n_head": 2, "n_embd": 16}},
            "data": {"batch_size": 2, "seq_len": 16},
            "selection": {"assignment_batches": 1},
        }
    )


class Pushers:
    def __init__(self, setup: RunSetup, peer: MemoryPeer, to: str, weights: State) -> None:
        self.setup, self.peer, self.to, self.weights = setup, peer, to, weights

    def payload(self, me: Identity) -> bytes:
        """A payload of the run's codec for W_2, from `me`'s own random update."""
        torch.manual_seed(int.from_bytes(bytes.fromhex(me.public_hex)[:4], "big"))
        delta = {name: torch.randn(t.shape) * 1e-3 for name, t in self.weights.items()}
        payload, _, _ = codec_for(self.setup.manifest).compress(delta, None, self.weights)
        assert len(payload) < BODY
        return payload

    async def push(self, me: Identity, base: str, *, junk: int = 0, codec: str | None = None) -> str | None:
        """One submission for round `ROUND` from `me` (`junk` bytes of no codec, or a real payload);
        None if B took it, else its answer."""
        digest = hashlib.sha256(me.public_hex.encode()).digest()
        payload = digest * (junk // 32) + b"x" * (junk % 32) if junk else self.payload(me)
        header = SubmissionHeader.for_payload(
            run_id=self.setup.run_id, round_=ROUND, base_hash=base, payload=payload,
            codec=codec or self.setup.manifest.train.codec, sender=me.public_hex,
            data_digest=Assignment(self.setup.run_id, ROUND, me.public_hex, 1).digest,
        )  # fmt: skip
        path = self.peer.store.path(self.peer.store.put(payload))
        try:
            await self.peer.submit(sign(me, header), path, to=self.to)
        except TransferError as exc:
            return str(exc)
        return None


def inbox_bytes(intake: RoundIntake) -> int:
    return sum(intake.inbox.path(sha).stat().st_size for sha in intake.inbox)


def test_a_standby_floods_like_the_active_validator_and_seats_an_established_miner(tmp_path: Path) -> None:
    setup = RunSetup.from_manifest(manifest())
    task = task_for(setup)
    network = MemoryNetwork(run_records(setup.manifest))
    b, m = key("b"), key("established")
    events = Events("validator", tmp_path / "events" / "b.jsonl")
    intake = RoundIntake(setup, events, tmp_path / "b" / "inbox")
    # the run's defaults (128 seats, 16 newcomer seats, 8 payloads at the cap) at a small scale
    intake.rules = AdmissionRules(capacity=SEATS, newcomer_seats=NEWCOMER_SEATS, byte_budget=BUDGET)
    peer = network.join(b, tmp_path / "b", role="validator", intake=intake)
    role = validator_role_for(setup, task, b, tmp_path / "b", peer, events, intake)
    cfg = setup.manifest.gauntlet()
    replica = Replica.from_snapshot(initial_snapshot(cfg, task.initial_master()), cfg)
    replica.book = replica.book.model_copy(
        update={
            "round": ROUND,
            "states": [EARLIER, "f" * 64, replica.state_hash],
            "gained": {m.public_hex: [0, 1]},
        }
    )
    role.auditor.replica = replica
    miners = network.join(key("pushers"), tmp_path / "pushers", role="miner")
    pushers = Pushers(setup, miners, peer.peer_id, replica.weights)
    base = replica.state_hash

    async def main() -> dict[str, str | None]:
        await role._open_intake(ROUND, role.auditor.held())  # the standby's own step: B reached its round
        answers: dict[str, str | None] = {
            "behind": await pushers.push(key("behind"), EARLIER),
            "codec": await pushers.push(key("codec"), base, codec="dense"),
            "over-budget": await pushers.push(key("big"), base, junk=BIG),
        }
        for i in range(FLOOD):  # junk first: it is refused as it lands, and its seat is free again
            answers[f"junk{i}"] = await pushers.push(key(f"junk{i}"), base, junk=BODY)
            answers[f"junk{i} again"] = await pushers.push(key(f"junk{i}"), base)
        seated_after_junk = len(intake.admission.seats)
        for i in range(FLOOD):
            answers[f"flood{i}"] = await pushers.push(key(f"flood{i}"), base)
        answers["established"] = await pushers.push(m, base)
        answers["seated after junk"] = str(seated_after_junk)
        return answers

    answers = asyncio.run(main())
    assert m.public_hex in peer.standing_keys  # its heartbeats name peers that may use the kept send slots

    # checked from the header, before any body: the Gauntlet's own reasons, no seat, no file
    assert "behind: trained from the state of round 0" in str(answers["behind"])
    assert "codec dense" in str(answers["codec"])
    assert "exceeds the round's budget" in str(answers["over-budget"])
    junk = [answers[f"junk{i}"] for i in range(FLOOD)]
    assert all("undecodable: UnknownVersion: not a sparseloco payload" in str(a) for a in junk), junk
    again = [answers[f"junk{i} again"] for i in range(FLOOD)]  # one payload per key and round, as ever
    assert all("its payload was refused this round" in str(a) for a in again), again
    assert answers["seated after junk"] == "0"  # each freed its seat as it landed
    flood = [answers[f"flood{i}"] for i in range(FLOOD)]
    assert all(a is None or "not drawn" in a for a in flood), flood
    # the first SEATS valid newcomers found every seat free, whatever their tickets
    assert all(a is None for a in flood[:SEATS])
    assert intake.admission.offered == 3 * FLOOD + 2  # behind and codec never reached admission
    # the established miner is seated behind the flood; a newcomer made room
    assert answers["established"] is None
    assert m.public_hex in intake.received and len(intake.received) <= SEATS
    dropped = read_events(tmp_path / "events").events(Dropped)
    assert [e.reason for e in dropped].count("unseated by an established miner") == 1
    reasons = {"unseated by an established miner", "unseated by a newcomer with a lower ticket"}
    assert {e.reason for e in dropped} <= reasons
    assert inbox_bytes(intake) <= BUDGET and intake.admission.held_bytes <= BUDGET
    assert {key(f"flood{i}").public_hex for i in range(FLOOD)} & set(intake.received)  # newcomers still drawn
    # on takeover, the service B starts holds this very intake, with what it collected
    service = role._new_service()
    assert service.intake is intake and m.public_hex in service.intake.received
