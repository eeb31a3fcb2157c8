"""The miner on the network: keeps W_r in step like a follower, trains, pushes its submission.

In every round r it holds W_r for while the round is open, a miner announces itself (heartbeat),
gets what its trainer needs from the network (`RoundInputs`: nothing for language modelling, the
round's rollout pool for RL), trains H steps from W_r on the data its key is assigned for the
round (`protocol.assignment`, `node/run/trainer.py`), compresses Delta + error feedback with the
run's codec, and pushes the signed header and payload to every validator that announced round r
(the active one and the standbys, which keep it in case they must close the round: `standby.py`;
`Peer.submit`). It holds
its model, its optimizer, one error buffer, the BF16 global weights and the payload it is sending:
nothing grows with the number of peers. Busy fraction = wall seconds in which it was training or
compressing (either or both: with `overlap` they run at once) / wall seconds since it first
trained, work still running included (`BusyClock`).

Deadlines: the validator's open heartbeat names the round's target (`roles/deadline.py`). A miner
times every push (`uplink.py`); when its whole payload would arrive after the target, it sends the
share that fits (fewer values per chunk, the rest kept in its error feedback), which the validator
decodes and checks by the run's codec rules like any other payload.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from node.events import Events, mb
from node.events.models import Final, Late, Missed, Started, Submitted, Training
from node.net.peer import Peer
from node.roles.catchup import Chain, Held
from node.roles.uplink import Uplink
from node.run.setup import RunSetup
from node.run.trainer import Trainer
from protocol.messages import SubmissionHeader
from protocol.signing import SignedMessage
from protocol.state import State

log = logging.getLogger(__name__)
POLL_SECONDS = 0.5


class RoundInputs:
    """What a trainer needs from the network before it can train round r: nothing, by default."""

    async def ready(self, round_: int) -> bool:
        """True once round `round_`'s inputs are in the trainer; False to look again later."""
        return True


def finishes_late(now: float, target: float, train_seconds: float | None, overlap: bool) -> bool:
    """Whether training that starts `now` and lasts `train_seconds` (None: not measured yet) ends after
    the round's `target` (unix time), with overlapped training to go to the next round instead."""
    return overlap and train_seconds is not None and now + train_seconds > target


class BusyClock:
    """Wall seconds during which at least one piece of work ran, counted up to now for work still
    running (a miner that reports while it trains ahead is busy, not idle)."""

    def __init__(self) -> None:
        self.first: float | None = None  # when the first work started
        self.since = 0.0  # when the current busy stretch started
        self.running = 0
        self.done_seconds = 0.0  # of the busy stretches that ended

    @contextlib.contextmanager
    def busy(self) -> Iterator[None]:
        now = time.monotonic()
        self.first = now if self.first is None else self.first
        if self.running == 0:
            self.since = now
        self.running += 1
        try:
            yield
        finally:
            self.running -= 1
            if self.running == 0:
                self.done_seconds += time.monotonic() - self.since

    def fraction(self) -> float:
        if self.first is None:
            return 0.0
        now = time.monotonic()
        busy = self.done_seconds + (now - self.since if self.running else 0.0)
        return busy / max(now - self.first, 1e-9)


@dataclasses.dataclass(frozen=True)
class Ahead:
    """Training for a later round, running: `stop` ends its filling steps (`train.fill_steps`)."""

    round: int
    task: asyncio.Task[State]
    stop: threading.Event


class Miner:
    def __init__(
        self,
        setup: RunSetup,
        peer: Peer,
        events: Events,
        trainer: Trainer,
        inputs: RoundInputs | None = None,
        *,
        poll: float = POLL_SECONDS,
    ) -> None:
        self.setup, self.peer, self.events, self.trainer = setup, peer, events, trainer
        self.inputs = inputs or RoundInputs()
        self.poll = poll
        self.key = trainer.identity.public_hex
        self.chain = Chain(peer, events, self.key, poll=2 * poll)
        self.clock = BusyClock()
        self.train_seconds: dict[int, tuple[float, int]] = {}  # round -> (seconds, inner steps) until submitted
        self.submitted: set[tuple[int, str, int]] = set()  # (round, validator peer id, its heartbeat's sent_at)
        self.packaged: tuple[int, SignedMessage, Path] | None = None  # this round's signed header and payload
        self.dense_bytes = setup.dense_bytes()
        self.ahead: Ahead | None = None  # training for a later round, running
        self.payload_sha: str | None = None  # the last payload sent, kept fetchable until the next one
        self.uplink = Uplink()
        self.compress_seconds: float | None = None  # the last compression's
        self.last_train_seconds: float | None = None  # the last H inner steps' (how long a round's training takes)

    @property
    def busy_fraction(self) -> float:
        return self.clock.fraction()

    async def run(self, rounds: int | None = None) -> Held:
        """Follow and mine until holding W_rounds (None: forever)."""
        peer_id = self.peer.peer_id
        self.events.emit(Started(sender=self.key, peer_id=peer_id), f"miner {self.key[:12]} joined, peer id {peer_id}")
        try:
            held = await self.chain.sync()
            while rounds is None or held.round < rounds:
                await self._mine(held)
                held = await self.chain.sync()
        except BaseException:  # Ctrl+C cancels this task: the training thread must not finish its round first
            self.trainer.stopping.set()
            if self.ahead is not None:
                self.ahead.stop.set()
            raise
        await self.peer.heartbeat(held.round, held.state_hash)  # the validator lingers until it sees this
        self.events.emit(
            Final(round=held.round, state_hash=held.state_hash, busy_fraction=self.busy_fraction),
            f"holding the state of round {held.round}, hash {held.state_hash[:12]}",
        )
        return held

    async def _mine(self, held: Held) -> None:
        r = held.round
        if self.ahead is not None and self.ahead.round <= r:
            self.ahead.stop.set()  # W_r is held: training for round r stops filling and r is submitted
        beats = [b.message for b in await self.peer.validator_heartbeats(r)]
        fresh = [b for b in beats if (r, b.peer_id, b.sent_at) not in self.submitted]
        if not fresh or await self.peer.round_result(r) is not None:
            # the round is not open yet, is done here, or just closed (a restarted validator reopens it)
            await asyncio.sleep(self.poll)
            return
        if not await self.inputs.ready(r):
            await asyncio.sleep(self.poll)  # e.g. the round's rollout pool is not readable yet
            return
        self.submitted.update((r, b.peer_id, b.sent_at) for b in fresh)
        deadline = self.setup.manifest.round.deadline_seconds
        live = [(b.peer_id, b.sent_at + deadline) for b in fresh if time.time() <= b.sent_at + deadline]
        # the payload is sized to the tightest target among them (adaptive deadlines), else to the deadline
        target = min((b.sent_at + (b.target_seconds or deadline) for b in fresh), default=time.time())
        if not live:
            self.events.emit(Late(round=r), f"round {r} is past its deadline: waiting for round {r + 1}")
            return
        if self.packaged is not None and self.packaged[0] == r:  # trained already: another validator announced r
            await self._push(r, live)
            return
        await self.peer.heartbeat(r, held.state_hash)
        if self.ahead is not None and self.ahead.round == r:
            delta = await self.ahead.task
            self.ahead = None
            self.events.emit(
                Training(round=r, ahead=True), f"joined round {r} with steps trained while round {r - 1} was scored"
            )
        else:
            await self._drop_ahead()
            await self._time_first_step(r, held.weights)
            if self._train_ahead_instead(r, target, held.weights):
                return
            steps = self.setup.manifest.train.inner_steps
            self.events.emit(Training(round=r, ahead=False), f"joined round {r}: training {steps} steps")
            delta = await self._train(r, held.weights)
        if self.setup.manifest.train.overlap:
            self.ahead = self._start_ahead(r + 1, held.weights)
        trainer = self.trainer
        fraction = self.uplink.fraction(target - time.time() - (self.compress_seconds or 0.0))
        start = time.monotonic()
        with self.clock.busy():
            header, payload = await asyncio.get_running_loop().run_in_executor(  # handed over: freed tensor by tensor
                None, lambda: trainer.package(r, delta, held.weights, held.state_hash, fraction, handover=True)
            )
        self.compress_seconds = time.monotonic() - start
        await self._submit(header, payload, live, compress_seconds=self.compress_seconds, fraction=fraction)

    def _train_ahead_instead(self, r: int, target: float, weights: State) -> bool:
        """A miner whose state is ready late in round r (a joiner, one that caught up) and whose steps
        would end after r's target: it trains round r+1 now instead, from W_r as overlapped training
        does, so it submits the moment r+1 opens (training r would be refused as "round not open",
        and r+1's steps would only start then)."""
        if not finishes_late(time.time(), target, self.last_train_seconds, self.setup.manifest.train.overlap):
            return False
        self.ahead = self._start_ahead(r + 1, weights)
        text = f"round {r} closes in {max(target - time.time(), 0):.1f}s, before {self.last_train_seconds:.1f}s of "
        self.events.emit(Late(round=r), text + f"training end: training round {r + 1} now")
        return True

    async def _time_first_step(self, r: int, weights: State) -> None:
        """A miner that has trained no round yet times one inner step now (x H steps): whether a joiner
        whose state is ready late ends its steps before round r's target is then known, not guessed
        (guessing "in time", a first late join lost its round to "round not open")."""
        if self.last_train_seconds is not None or not self.setup.manifest.train.overlap:
            return
        trainer, spec = self.trainer, self.trainer.spec
        trainer.spec = dataclasses.replace(spec, steps=1)  # nothing else trains now: the ahead task was dropped
        start = time.monotonic()
        try:
            with self.clock.busy():
                await asyncio.get_running_loop().run_in_executor(None, trainer.train, r, weights)
        finally:
            trainer.spec = spec
        self.last_train_seconds = (time.monotonic() - start) * spec.steps

    def _start_ahead(self, round_: int, weights: State) -> Ahead:
        """Train round `round_` from `weights` (W_{round_-1}) now: H steps, then (`train.fill_steps`)
        more until W_round is held, so the device works while the validator scores."""
        stop = threading.Event()
        return Ahead(round_, asyncio.ensure_future(self._train(round_, weights, stop.is_set)), stop)

    async def _train(self, round_: int, weights: State, until: Callable[[], bool] | None = None) -> State:
        start, trainer = time.monotonic(), self.trainer
        try:
            with self.clock.busy():
                return await asyncio.get_running_loop().run_in_executor(None, trainer.train, round_, weights, until)
        finally:
            seconds, steps = time.monotonic() - start, max(trainer.last_steps, 1)
            # what H steps take (a joiner's "in time?" asks that), whatever the steps filling the wait added
            self.last_train_seconds = seconds * trainer.spec.steps / steps
            self.train_seconds = {r: s for r, s in self.train_seconds.items() if r >= round_ - 1}  # rounds in flight
            self.train_seconds[round_] = (seconds, steps)

    async def _drop_ahead(self) -> None:
        """Discard training done for a round this miner will not submit (it waits for the model first)."""
        if self.ahead is None:
            return
        task = self.ahead.task
        self.ahead.stop.set()
        self.ahead = None
        await asyncio.wait([task])  # the thread still trains the model: let it finish before reusing it
        if not task.cancelled() and task.exception() is not None:
            log.warning("training ahead failed; the steps are discarded: %r", task.exception())

    async def _submit(
        self,
        header: SubmissionHeader,
        payload: bytes,
        validators: list[tuple[str, float]],
        *,
        compress_seconds: float,
        fraction: float = 1.0,
    ) -> None:
        """Push the payload to each of `validators` (peer id, the round's deadline there: a busy one is
        asked again until then), then announce the header in the DHT."""
        peer, r = self.peer, header.round
        sha = peer.store.put(payload)
        if self.payload_sha is not None and self.payload_sha != sha:
            peer.store.remove(self.payload_sha)  # one payload held at a time: the latest stays fetchable
        self.payload_sha = sha
        signed = peer.sign(header)
        self.packaged = (r, signed, peer.store.path(sha))
        start = time.monotonic()  # the pushes go one after the other: the uplink is timed over all of them
        if not await self._push(r, validators):
            return
        upload = time.monotonic() - start
        self.uplink.measured(header.payload_size, upload, fraction)
        ratio = self.dense_bytes / max(header.payload_size, 1)
        loss, busy = self.trainer.last_loss, self.busy_fraction
        trained = self.train_seconds.pop(r, None)
        step = trained[0] / trained[1] if trained is not None else None
        self.events.emit(
            Submitted(
                round=r,
                bytes=header.payload_size,
                loss=loss,
                busy_fraction=busy,
                compress_seconds=compress_seconds,
                step_seconds=step,
                upload_seconds=upload,
                fraction=fraction,
            ),
            f"round {r}: submitted {mb(header.payload_size)} ({ratio:.0f}x smaller than dense"
            f"{f', {fraction:.0%} of a full payload to fit the round' if fraction < 1 else ''}) in {upload:.1f}s, "
            f"train loss {loss:.4f}, busy {busy:.0%}",
        )
        # the signed header also goes into the DHT, beside the push: a public record of what this key
        # sent for the round
        await peer.announce(signed)

    async def _push(self, r: int, validators: list[tuple[str, float]]) -> bool:
        """Push this round's submission to each of `validators` (peer id, deadline); True if any took it."""
        assert self.packaged is not None and self.packaged[0] == r
        _, signed, path = self.packaged
        failures = [why for _, why in await self.peer.submit_to_each(signed, path, validators)]
        if len(failures) == len(validators):
            reason = "; ".join(failures)
            self.events.emit(Missed(round=r, reason=reason), f"round {r}: submission not taken: {reason}")
            return False
        for failure in failures:
            log.info("round %d: a validator did not take the submission: %s", r, failure)
        return True

    async def shutdown(self) -> None:
        await self.peer.shutdown()
