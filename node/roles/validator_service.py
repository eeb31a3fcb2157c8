"""The validator on the network: opens rounds, takes pushed submissions, closes at the deadline, publishes.

Round r, as the validator runs it:

1. open: publish a heartbeat for r (its `sent_at` starts the deadline clock), and every
   `checkpoint_every` rounds (and at start-up) a full BF16 checkpoint as a blob plus its announcement;
2. collect: miners push signed headers and payloads over `rpc_submit`; one per miner, this round only;
3. close at the deadline, or earlier (after `min_seconds`) once every miner that announced itself
   for r (heartbeat) or submitted in r-1 has submitted: nobody is waited for beyond the deadline;
4. score, select, aggregate and step (`validator.core.Validator.run_round`, in a thread), store the
   PULSESync patch as a blob and publish the signed round result; report the held-out loss.

State lives in `folder/validator` (committed once per round) and patches in `folder/blobs`, so a
restarted validator resumes at its last committed round and continues the hash chain.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from pathlib import Path

from node.events import Events, mb
from node.learn.gpteval import GPTEvaluator
from node.learn.train import changed_fraction, evaluate, load_bf16_state
from node.net.netconfig import NetConfig
from node.net.peer import Peer
from node.roles.catchup import CHECKPOINT_FORMAT, checkpoint_bytes
from node.roles.records import run_records
from node.roles.rl.validation import RLValidation
from node.run.setup import RunSetup
from protocol.codec import default_max_bytes
from protocol.errors import ConfigError, NetworkError
from protocol.identity import Identity
from protocol.messages import CheckpointAnnouncement, Heartbeat, SubmissionHeader
from protocol.signing import Verified
from validator.core import RoundReport, Validator
from validator.intake import Submission
from validator.scoring import BatchFn, Evaluator
from validator.state import StateStore

log = logging.getLogger(__name__)
POLL_SECONDS = 0.5


class ValidatorService:
    def __init__(self, setup: RunSetup, identity: Identity, folder: Path, events: Events, device: str = "cpu") -> None:
        if identity.public_hex not in setup.manifest.validators:
            raise ConfigError("this key is not one of the manifest's validators; add its public key to `validators`")
        self.setup, self.identity, self.folder, self.events = setup, identity, folder, events
        # the model the held-out loss (or an RL run's reward, on the CPU) is measured with; in an LM run
        # also the Gauntlet's evaluator (used one after the other), so the weights are held on `device` once
        lm = setup.manifest.task == "lm"
        self.probe = setup.new_model(initial=False).to(device if lm else "cpu")
        self.rl = RLValidation(setup, events, self.probe) if setup.manifest.task == "rl" else None
        self.validator = self._open_state()
        self.peer: Peer | None = None
        self.received: dict[str, Submission] = {}  # by sender, this round
        self.previous_senders: set[str] = set()
        self.closed = True
        self.held_out = [(x.to(device), y.to(device)) for x, y in setup.held_out()] if lm else []
        self.dense_bytes = setup.dense_bytes()
        # refuse an oversize payload from its header, before its body is read or stored
        self.max_payload = setup.manifest.gauntlet().max_payload_bytes or default_max_bytes(self.validator.weights)

    @classmethod
    async def create(
        cls, setup: RunSetup, identity: Identity, folder: Path, config: NetConfig, events: Events, device: str = "cpu"
    ) -> ValidatorService:
        service = await asyncio.get_running_loop().run_in_executor(
            None, lambda: cls(setup, identity, folder, events, device)
        )
        service.peer = await Peer.create(
            config,
            run_records(setup.manifest),
            identity,
            folder,
            role="validator",
            accept=service._accept,
            on_submission=service._on_submission,
        )
        events.emit(
            "start",
            f"validator {identity.public_hex[:12]} at round {service.validator.round}, peer id {service.peer.peer_id}",
            round=service.validator.round,
        )
        return service

    def _open_state(self) -> Validator:
        s = self.setup
        evaluator: Evaluator = GPTEvaluator(self.probe) if self.rl is None else self.rl.evaluator()
        batch_fn: BatchFn = s.eval_batch if self.rl is None else self.rl.batches
        folder = self.folder / "validator"
        cfg, run_id = s.manifest.gauntlet(), s.run_id
        if StateStore(folder, cfg.keep_rounds).exists():
            return Validator.open(folder, cfg, run_id, self.identity, evaluator, batch_fn)
        return Validator.create(folder, cfg, run_id, self.identity, s.initial_master(), evaluator, batch_fn)

    @property
    def round(self) -> int:
        return self.validator.round

    # -- intake (runs on the event loop, called by the transfer service) --------------------------

    def _accept(self, header: SubmissionHeader) -> str | None:
        if self.closed or header.round != self.round:
            return f"round {header.round} is not open (the open round is {self.round}, closed={self.closed})"
        if header.sender in self.received:
            return "one submission per miner per round"
        if header.payload_size > self.max_payload:
            return f"oversize: {header.payload_size} bytes announced, the cap is {self.max_payload}"
        return None

    def _on_submission(self, verified: Verified[SubmissionHeader]) -> None:
        header = verified.message
        if self.closed or header.round != self.round or self.peer is None:
            return
        payload = self.peer.store.read(header.payload_sha256)
        self.received[header.sender] = Submission(verified.signed.to_bytes(), payload)
        self.events.emit(
            "received",
            f"round {header.round}: received {mb(header.payload_size)} from miner {header.sender[:12]}",
            round=header.round,
            sender=header.sender,
            bytes=header.payload_size,
        )

    # -- rounds ----------------------------------------------------------------------------------

    async def run(self, rounds: int | None = None) -> None:
        """Run rounds until `rounds` have completed in total (None: forever); then keep serving blobs."""
        assert self.peer is not None
        await self._republish()
        if self.held_out and self.validator.last_result is None:
            loss = await asyncio.get_running_loop().run_in_executor(None, self._held_out_loss)
            self.events.emit("baseline", f"held-out loss of the initial weights {loss:.4f}", loss=loss)
        if self.rl is not None and self.validator.last_result is None:
            loop = asyncio.get_running_loop()
            reward = await loop.run_in_executor(None, self.rl.held_out_reward, self.validator.weights)
            self.events.emit("baseline", f"held-out reward of the initial policy {reward:.4f}", reward=reward)
        first = True
        while rounds is None or self.round < rounds:
            await self._open(checkpoint=first or self.round % self.setup.manifest.round.checkpoint_every == 0)
            first = False
            await self._collect()
            await self._close()
        self.events.emit(
            "done",
            f"completed round {self.round - 1}; serving blobs until stopped",
            round=self.round,
            state_hash=self.validator.state_hash,
        )
        while True:
            await self.peer.heartbeat(self.round, self.validator.state_hash)
            await asyncio.sleep(5.0)

    async def _republish(self) -> None:
        """After a restart: the last result again (DHT records may have expired or never landed)."""
        assert self.peer is not None
        if self.validator.last_result is not None and self.validator.last_patch is not None:
            self.peer.hold(self.peer.store.put(self.validator.last_patch))
            await self.peer.publish_signed(self.validator.last_result)

    async def _open(self, *, checkpoint: bool) -> None:
        assert self.peer is not None
        r = self.round
        if checkpoint:
            data = checkpoint_bytes(self.validator.weights)
            sha = self.peer.store.put(data)
            self.peer.hold(sha)
            announcement = CheckpointAnnouncement(
                run_id=self.setup.run_id,
                round=r,
                state_hash=self.validator.state_hash,
                blob_sha256=sha,
                blob_size=len(data),
                format=CHECKPOINT_FORMAT,
            )
            try:
                await self.peer.publish(announcement)
            except NetworkError as exc:  # joiners use an older or the next checkpoint meanwhile
                log.warning("checkpoint of round %d not announced: %s", r, exc)
            else:
                self.events.emit("checkpoint", f"announced the checkpoint of round {r} ({mb(len(data))})", round=r)
        if self.rl is not None:
            # a heartbeat first, so that workers find the checkpoint and patch holders while the pool
            # is built; miners wait for the pool, and the heartbeat below restarts the deadline clock
            await self.peer.heartbeat(r, self.validator.state_hash)
            await self.rl.open_round(self.peer, r, self._recent_states())
        self.received = {}
        self.closed = False
        self.opened_at = time.time()
        await self.peer.heartbeat(r, self.validator.state_hash)
        self.events.emit("open", f"round {r} open, state {self.validator.state_hash[:12]}", round=r)

    async def _collect(self) -> None:
        assert self.peer is not None
        timing = self.setup.manifest.round
        deadline = self.opened_at + timing.deadline_seconds
        while time.time() < deadline:
            await asyncio.sleep(POLL_SECONDS)
            if time.time() < self.opened_at + timing.min_seconds or not self.received:
                continue
            announced = {v.sender_hex for v in await self.peer.get(Heartbeat, self.round) if v.message.role == "miner"}
            if (announced | self.previous_senders) <= set(self.received):
                return
        log.info("round %d: deadline reached with %d submissions", self.round, len(self.received))

    async def _close(self) -> None:
        assert self.peer is not None
        self.closed = True
        r, submissions = self.round, list(self.received.values())
        loop = asyncio.get_running_loop()
        before = self.validator.weights
        report = await loop.run_in_executor(None, lambda: self.validator.run_round(submissions))
        changed = changed_fraction(before, self.validator.weights)
        sha = self.peer.store.put(report.patch)
        self.peer.hold(sha)
        try:
            await self.peer.publish_signed(report.envelope)
        except NetworkError as exc:
            log.warning("round %d result not stored in the DHT yet (%s); retrying once", r, exc)
            await asyncio.sleep(1.0)
            await self.peer.publish_signed(report.envelope)
        for sub in submissions:
            self.peer.store.remove(hashlib.sha256(sub.payload).hexdigest())
        self.previous_senders = set(self.received)
        loss = await loop.run_in_executor(None, self._held_out_loss) if self.held_out else None
        reward = None
        if self.rl is not None and self.rl.reward_due(r):
            reward = await loop.run_in_executor(None, self.rl.held_out_reward, self.validator.weights)
        self._report(report, submissions, loss, reward, changed)

    def _recent_states(self) -> dict[int, str]:
        """Round -> state hash for the rounds the validator's book still names (newest is this round's)."""
        states = self.validator.book.states
        return {self.round - len(states) + 1 + i: h for i, h in enumerate(states)}

    def _held_out_loss(self) -> float:
        load_bf16_state(self.probe, self.validator.weights)
        return evaluate(self.probe, self.held_out)

    def _report(
        self,
        report: RoundReport,
        submissions: list[Submission],
        loss: float | None,
        reward: float | None,
        changed: float,
    ) -> None:
        sent = sum(len(s.payload) for s in submissions)
        selected = report.selected()
        ranked = sorted(report.result.selected, key=lambda s: -s.score)
        scores = {s.sender: s.score for s in ranked}
        self.events.emit(
            "round",
            f"round {report.round} closed: {len(submissions)} submissions, {len(selected)} aggregated, "
            f"{mb(sent)} received ({self.dense_bytes * max(len(submissions), 1) / max(sent, 1):.0f}x smaller "
            f"than dense), patch {mb(len(report.patch))}, new state {report.state_hash[:12]}"
            + (f", held-out loss {loss:.4f}" if loss is not None else "")
            + (f", held-out reward {reward:.4f}" if reward is not None else ""),
            round=report.round,
            submissions=len(submissions),
            selected=len(selected),
            bytes=sent,
            dense_bytes=self.dense_bytes * len(submissions),
            patch_bytes=len(report.patch),
            state_bytes=self.dense_bytes // 2,  # the BF16 weights, what a dense sync would ship
            loss=loss,
            reward=reward,
            changed_fraction=changed,
            scores=scores,
            rejections={r.sender: r.reason for r in report.result.rejections},
            state_hash=report.state_hash,
            seconds=report.seconds,
        )

    async def shutdown(self) -> None:
        if self.peer is not None:
            await self.peer.shutdown()
