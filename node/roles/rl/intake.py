"""The validator's intake of pushed rollout batches (RL runs): each batch with its signed announcement.

    intake = RolloutIntake(folder / "rollout-inbox", cfg, identity, run_id, keeper.trusted, keeper.penalized)
    peer.take_rollouts(intake)            # a worker's push (`Peer.submit`) ends here
    intake.open(r)                        # round r's pool is being built: rounds r - max_staleness .. r + 1 taken
    for verified, path in intake.held(r): # what was pushed for round r, its bytes on disk
        ...

A worker pushes its batch to the validator over a stream, as a miner pushes a submission, and also
announces it in the DHT. The pool (`pool.py`) examines pushed batches first. An announcement is an
open record: any fresh key can sign one. A flood of them (naming blobs nobody serves, or from keys
ground to sort first) would compete with every honest worker for a place in the validator's read and
in its examination budget. A push is different:

- it carries the batch, so nothing has to be fetched from a holder that may never answer;
- its seats are admission's (`validator/admission.py`), not first come:
  - workers whose batches passed in recent rounds (the keeper's `trusted`) are the established keys,
    with seats no flood can take;
  - newcomers share the rest by a ticket drawn with the validator's secret for the round, whatever
    order they come in;
- every seat's bytes count against the round's budget (`pool_batches` batches at the size cap), so
  the inbox holds at most that per round, however many keys push;
- a seat whose body does not arrive within `pool_wait_seconds` is freed for others;
- a worker the pool left out (`pool.py`'s penalties) is refused before its bytes while no pool its
  batch could enter would take it.

Rounds outside the window are refused before their body. Those that leave it are emptied from the
inbox. Nothing is kept of a refused push. Every refusal goes back to the worker on its stream, with
the reason.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from node.learn.rl.checks import LIMITS, oversize
from node.learn.rl.config import RLConfig
from node.net.blobstore import BlobStore
from protocol.identity import Identity
from protocol.messages import RolloutAnnouncement
from protocol.signing import Verified
from validator.admission import Admission, AdmissionRules, Established
from validator.scoring import RoundSecret

log = logging.getLogger(__name__)

Pushed = tuple[Verified[RolloutAnnouncement], Path]
"""A pushed batch: its verified announcement and the file holding its bytes (checked against the hash)."""


def rollout_rules(cfg: RLConfig) -> AdmissionRules:
    """Seats for twice a pool's batches a round, half of them newcomers' at least, and the bytes of a
    pool's batches at the cap: a pool needs `pool_batches`, and workers with standing come first."""
    return AdmissionRules(
        capacity=2 * cfg.pool_batches,
        newcomer_seats=cfg.pool_batches,
        byte_budget=cfg.pool_batches * LIMITS.max_batch_bytes,
        body_grace_seconds=cfg.pool_wait_seconds,
    )


@dataclass
class _Round:
    admission: Admission
    arrived: dict[str, Pushed]  # by worker, in arrival order


class RolloutIntake:
    """Pushed rollout batches of the rounds a pool may draw on (see the module docstring)."""

    def __init__(
        self,
        inbox: Path,
        cfg: RLConfig,
        identity: Identity,
        run_id: str,
        trusted: Mapping[str, int],
        penalized: Mapping[str, int],
    ) -> None:
        """`trusted`: worker -> the last round one of its batches passed; `penalized`: worker -> the
        first round whose pool may take it again (both the keeper's, read live)."""
        self.inbox = BlobStore(inbox)
        self.inbox.clear_partials()
        for sha in list(self.inbox):  # batches of a run before a restart: their rounds start over
            self.inbox.remove(sha)
        self.cfg, self.identity, self.run_id = cfg, identity, run_id
        self.trusted, self.penalized = trusted, penalized
        self.rules = rollout_rules(cfg)
        self.current = -1  # the round whose pool is built next (or now)
        self.rounds: dict[int, _Round] = {}

    def window(self) -> range:
        """The rounds whose batches are taken: those the current pool may draw on, and the next."""
        return range(max(0, self.current - self.cfg.max_staleness), self.current + 2)

    def open(self, round_: int) -> None:
        """Round `round_`'s pool is being built: batches of rounds that left the window go."""
        self.current = max(self.current, round_)
        for r in [r for r in self.rounds if r not in self.window()]:
            for _, path in self.rounds.pop(r).arrived.values():
                self._discard(path.name)

    def held(self, round_: int) -> list[Pushed]:
        """The batches pushed for `round_` whose bytes arrived and still hold a seat."""
        slot = self.rounds.get(round_)
        return list(slot.arrived.values()) if slot is not None else []

    # -- what the transfer service calls -------------------------------------------------------------

    def accept(self, verified: Verified[RolloutAnnouncement]) -> str | None:
        """A verified announcement, before its bytes: None seats it, else the reason it is refused."""
        a, worker = verified.message, verified.sender_hex
        if a.round not in self.window():
            return (
                f"rollouts of round {a.round} are not taken now (rounds {self.window().start}-{self.current + 1} are)"
            )
        problem = oversize(a)
        if problem is not None:
            return problem
        back = self.penalized.get(worker, -1)
        if back > a.round + self.cfg.max_staleness:  # no pool this batch could enter would take it
            return f"worker left out of rollout pools until round {back} (an earlier batch was refused)"
        slot = self._round(a.round)
        verdict = slot.admission.offer(worker, a.blob_size)
        for other, reason in verdict.unseated:
            self._drop(a.round, other, reason)
        return verdict.refusal

    def on_rollouts(self, verified: Verified[RolloutAnnouncement], path: Path) -> str | None:
        """Its bytes arrived (hash-checked, at `path` in the inbox): None keeps the batch for the pool."""
        a, worker = verified.message, verified.sender_hex
        slot = self.rounds.get(a.round)
        refusal = (
            f"round {a.round} left the window while the batch arrived"
            if slot is None
            else slot.admission.arrive(worker)
        )
        if refusal is not None or slot is None:
            self._discard(path.name)
            return refusal
        slot.arrived[worker] = (verified, path)
        log.info("round %d: took a pushed rollout batch of %d bytes from worker %s", a.round, a.blob_size, worker[:12])
        return None

    def favoured(self, worker: str) -> bool:
        """Workers whose batches passed recently may use the reserved upload slots."""
        return worker in self.trusted

    # -- seats and files ---------------------------------------------------------------------------

    def _round(self, round_: int) -> _Round:
        slot = self.rounds.get(round_)
        if slot is None:
            secret = RoundSecret.derive(self.identity, self.run_id, round_).key("rollout-intake")
            standing = Established({w: float(r) for w, r in self.trusted.items()})  # the latest pass ranks first
            slot = self.rounds[round_] = _Round(Admission(self.rules, standing, secret), {})
        return slot

    def _drop(self, round_: int, worker: str, reason: str) -> None:
        """`worker` lost its seat: a batch of its that arrived leaves the round."""
        pushed = self.rounds[round_].arrived.pop(worker, None)
        log.info("round %d: worker %s's pushed rollouts %s", round_, worker[:12], reason)
        if pushed is not None:
            self._discard(pushed[1].name)

    def _discard(self, sha256: str) -> None:
        """Remove a batch from the inbox unless a seated push of the same bytes still holds it."""
        held = (path.name for slot in self.rounds.values() for _, path in slot.arrived.values())
        if sha256 not in set(held):
            self.inbox.remove(sha256)
