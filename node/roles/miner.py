"""The miner and the follower on the network.

A follower keeps bit-identical BF16 weights: it joins from the newest checkpoint, then applies
every round's PULSESync patch, verifying each state hash (`catchup.py`).

A miner does the same and, in every round r it holds W_r for while the round is open:
announces itself (heartbeat), trains H AdamW steps on its assignment from W_r (DESIGN.md
section 3), compresses Delta + error feedback with the run's codec, and pushes the signed header
and payload to the validator over `rpc_submit`. It holds its model, its optimizer, one error
buffer, the BF16 global weights and the payload it is sending: nothing grows with the number
of peers. Busy fraction = seconds spent training and compressing / wall seconds since the first
round it trained.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path

from node.events import Events, mb
from node.net.netconfig import NetConfig
from node.net.peer import Peer, Role
from node.net.transfer import call_submit
from node.roles.catchup import Held, advance, join
from node.roles.records import run_records
from node.roles.rl.miner import RLTrainer
from node.roles.rl.worker import RolloutWorker
from node.run.setup import RunSetup
from node.run.trainer import Trainer
from protocol.errors import ProtocolError, TransferError
from protocol.identity import Identity
from protocol.messages import SubmissionHeader
from protocol.signing import sign
from protocol.state import State

log = logging.getLogger(__name__)
POLL_SECONDS = 0.5


class Node:
    """A follower; with a `Trainer`, a miner."""

    def __init__(
        self,
        setup: RunSetup,
        identity: Identity,
        peer: Peer,
        events: Events,
        trainer: Trainer | None,
        worker: RolloutWorker | None = None,
    ) -> None:
        self.setup, self.identity, self.peer, self.events, self.trainer = setup, identity, peer, events, trainer
        self.worker = worker  # an RL run's follower generates rollouts
        self.held: Held | None = None
        self.busy_seconds = 0.0
        self.started: float | None = None
        self.submitted: set[tuple[int, str, int]] = set()  # (round, validator peer id, round opened at)
        self.dense_bytes = setup.dense_bytes()
        self.ahead: tuple[int, asyncio.Task[State]] | None = None  # training for a later round, running
        self.payload_sha: str | None = None  # the last payload sent, kept fetchable until the next one

    @classmethod
    async def create(
        cls,
        setup: RunSetup,
        identity: Identity,
        folder: Path,
        config: NetConfig,
        events: Events,
        *,
        mine: bool,
        device: str = "cpu",
    ) -> Node:
        role: Role = "miner" if mine else "follower"
        rl = setup.manifest.task == "rl"
        trainer: Trainer | None = None
        if mine:
            trainer = RLTrainer(setup, identity, device) if rl else Trainer(setup, identity, device)
        peer = await Peer.create(config, run_records(setup.manifest), identity, folder, role=role)
        worker = RolloutWorker(setup, identity, peer, events, device) if rl and not mine else None
        events.emit(
            "start", f"{role} {identity.public_hex[:12]} joined, peer id {peer.peer_id}", sender=identity.public_hex
        )
        return cls(setup, identity, peer, events, trainer, worker)

    @property
    def busy_fraction(self) -> float:
        if self.started is None:
            return 0.0
        return self.busy_seconds / max(time.monotonic() - self.started, 1e-9)

    async def run(self, rounds: int | None = None) -> Held:
        """Follow (and mine) until holding W_rounds (None: forever)."""
        me = self.identity.public_hex if self.trainer is not None else None
        self.held = await join(self.peer, self.events, me)
        while rounds is None or self.held.round < rounds:
            self.held = await advance(self.peer, self.held, self.events, me)
            if rounds is not None and self.held.round >= rounds:
                break
            if self.trainer is not None:
                await self._mine(self.held)
            else:
                if self.worker is not None:
                    await self.worker.serve(self.held)
                await asyncio.sleep(POLL_SECONDS)
        self.events.emit(
            "final",
            f"holding the state of round {self.held.round}, hash {self.held.state_hash[:12]}",
            round=self.held.round,
            state_hash=self.held.state_hash,
            busy_fraction=self.busy_fraction if self.trainer is not None else None,
        )
        return self.held

    async def _mine(self, held: Held) -> None:
        assert self.trainer is not None
        r = held.round
        beat = await self.peer.validator_heartbeat(r)
        opened = (r, beat.peer_id, beat.sent_at) if beat is not None else None
        if opened is None or opened in self.submitted or await self.peer.round_result(r) is not None:
            # the round is not open yet, is done here, or just closed (a restarted validator reopens it)
            await asyncio.sleep(POLL_SECONDS)
            return
        if isinstance(self.trainer, RLTrainer) and not await self.trainer.fetch_rollouts(self.peer, r):
            await asyncio.sleep(POLL_SECONDS)  # the round's rollout pool is not readable yet
            return
        self.submitted.add(opened)
        deadline = opened[2] + self.setup.manifest.round.deadline_seconds
        if time.time() > deadline:
            self.events.emit("late", f"round {r} is past its deadline: waiting for round {r + 1}", round=r)
            return
        await self.peer.heartbeat(r, held.state_hash)
        if self.ahead is not None and self.ahead[0] == r:
            delta = await self.ahead[1]
            self.ahead = None
            self.events.emit("train", f"joined round {r} with steps trained while round {r - 1} was scored", round=r)
        else:
            await self._drop_ahead()
            steps = self.setup.manifest.train.inner_steps
            self.events.emit("train", f"joined round {r}: training {steps} steps", round=r)
            delta = await self._train(r, held.weights)
        if self.setup.manifest.train.overlap:
            self.ahead = (r + 1, asyncio.ensure_future(self._train(r + 1, held.weights)))
        trainer = self.trainer
        header, payload = await asyncio.get_running_loop().run_in_executor(
            None, trainer.package, r, delta, held.weights, held.state_hash
        )
        await self._submit(header, payload)

    async def _train(self, round_: int, weights: State) -> State:
        assert self.trainer is not None
        self.started = self.started or time.monotonic()
        start = time.monotonic()
        try:
            return await asyncio.get_running_loop().run_in_executor(None, self.trainer.train, round_, weights)
        finally:
            self.busy_seconds += time.monotonic() - start

    async def _drop_ahead(self) -> None:
        """Discard training done for a round this miner will not submit (it waits for the model first)."""
        if self.ahead is not None:
            with contextlib.suppress(Exception):
                await self.ahead[1]
            self.ahead = None

    async def _submit(self, header: SubmissionHeader, payload: bytes) -> None:
        assert self.trainer is not None
        peer, r = self.peer, header.round
        sha = peer.store.put(payload)
        if self.payload_sha is not None and self.payload_sha != sha:
            peer.store.remove(self.payload_sha)  # one payload held at a time: the latest stays fetchable
        self.payload_sha = sha
        try:
            if peer.validator_peer is None:
                raise TransferError("the validator's peer id is unknown")
            signed = sign(self.identity, header)
            await call_submit(peer.p2p, peer.validator_peer, signed, peer.store.path(sha))
        except (TransferError, ProtocolError) as exc:
            self.events.emit("missed", f"round {r}: submission not taken: {exc}", round=r)
            return
        ratio = self.dense_bytes / max(header.payload_size, 1)
        self.events.emit(
            "submitted",
            f"round {r}: submitted {mb(header.payload_size)} ({ratio:.0f}x smaller than dense), "
            f"train loss {self.trainer.last_loss:.4f}, busy {self.busy_fraction:.0%}",
            round=r,
            bytes=header.payload_size,
            loss=self.trainer.last_loss,
            busy_fraction=self.busy_fraction,
        )
        await peer.announce(signed)  # the header also goes into the DHT (DESIGN.md section 3)

    async def shutdown(self) -> None:
        await self.peer.shutdown()
