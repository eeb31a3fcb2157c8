"""The validator's rollout pool: which workers' batches miners train on in a round, each one checked.

Before it opens round r, the validator gathers the rollout batches of rounds r - max_staleness .. r,
newest first: those workers pushed to it (`intake.py`, seated by standing and ticket, bytes already
here), then those only announced in the DHT, which it fetches (hash- and size-checked). It vets each with the
one rule `pulse bench rl` uses too (`node/learn/rl/checks.py`): right run, round and worker;
generated from the validator's own state of that round; exactly the prompts (run id, round,
worker key) derive; G completions each, none too long; and every claimed reward equal to the
recomputed one. Then a sample of its groups, drawn with the validator's secret, must look sampled
from the validator's weights of that round (`node/learn/rl/provenance.py`): fabricated completions
pass every public check, not this one. This file is only the network side. A batch that fails is
refused with its reason in the signed `RolloutPool`, and its worker is left out of pools for
`PENALTY_ROUNDS` rounds. Miners draw their groups from the pool with their assignment seeds,
so the validator knows exactly which rollouts each miner trained on (`evaluator.PoolSource`).

Which batches are looked at first must not be something a worker can choose: within a round,
pushed batches come first (their seats were not first come, and a flood of open DHT announcements
cannot add to them), then workers whose batches passed before, then the rest, each in the order of a
hash of the validator's secret for the round and the worker's key (key order would let keys ground
to sort first fill the pool). A batch's bytes name its worker, so a key that pushes or announces
another's batch is refused for it, and that refusal is its own: the owner's batch is still examined
and taken. At most `EXAMINED_PER_BATCH` x `pool_batches` new batches are fetched and checked per
gathering pass, each fetch within `pool_wait_seconds`, so a flood of announcements
costs a bounded amount of work per pass; a batch that cannot be fetched leaves its worker out for
`UNSERVED_PENALTY_ROUNDS` rounds (announcing blobs nobody serves costs a key its place, and the
next pass examines others). A restarted validator reads standing and penalties back from the
pools it published in the last `PENALTY_ROUNDS` rounds. Past `pool_wait_seconds` the pool closes with the batches it has
(a pass still examining stops at twice that); only with none at all (a pool needs one) does it
keep looking, a pass at a time.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from node.events import Events
from node.events.models import PoolWaiting, RolloutsRefused
from node.learn.rl.checks import LIMITS, oversize, vet
from node.learn.rl.config import RLConfig
from node.learn.rl.provenance import CHECKED_GROUPS, SamplingCheck
from node.net.peer import Peer
from node.roles.rl.intake import RolloutIntake
from protocol import rollouts
from protocol.errors import ProtocolError, TransferError
from protocol.messages import (
    MAX_POOL_BATCHES,
    MAX_REASON_CHARS,
    PoolEntry,
    PoolRejection,
    RolloutAnnouncement,
    RolloutPool,
)
from protocol.rollouts import RolloutBatch, RolloutGroup
from protocol.signing import Verified
from validator.scoring import RoundSecret

log = logging.getLogger(__name__)
PENALTY_ROUNDS = 10
UNSERVED_PENALTY_ROUNDS = 2  # a batch nobody served: maybe a worker's bad link, so a short penalty
POLL_SECONDS = 0.5
EXAMINED_PER_BATCH = 4
UNSERVED_REASON = "rollout batch not served"

Groups = tuple[RolloutGroup, ...]
Candidate = tuple[Verified[RolloutAnnouncement], Path | None]
"""An announced batch, and the file of its bytes when it was pushed (None: to fetch from a holder)."""


@dataclass
class PoolKeeper:
    """Builds and remembers the validator's pools; one per validator service."""

    peer: Peer
    cfg: RLConfig
    run_id: str
    events: Events
    penalized: dict[str, int] = field(default_factory=dict)  # worker -> first round it may return
    checked: dict[str, tuple[int, str, Groups]] = field(default_factory=dict)  # blob sha -> (round, worker, groups)
    refused: dict[tuple[str, str], PoolRejection] = field(default_factory=dict)  # (blob sha, worker) -> why
    poll: float = POLL_SECONDS  # seconds between looks for new announcements while the pool is short
    sampling: SamplingCheck | None = None  # None: rollouts are not checked against the weights (tests)
    trusted: dict[str, int] = field(default_factory=dict)  # worker -> last round one of its batches passed
    examined: int = 0  # batches fetched and checked in the current gathering pass
    closes_at: float = 0.0  # monotonic time past which the pool is built with what it has
    secret: bytes = b""  # the validator's secret for the round being built: the order of candidates
    intake: RolloutIntake | None = None  # batches workers pushed (None: only announced ones, fetched)
    remembered: bool = False  # standing and penalties read back from this validator's published pools

    async def build(self, round_: int, states: Mapping[int, str]) -> tuple[RolloutPool, list[Groups]]:
        """The pool of `round_`: the one this validator already published (after a restart), or a new one."""
        if not self.remembered:
            await self._remember(round_)
        if self.intake is not None:
            self.intake.open(round_)
        published = await self.peer.from_validator(RolloutPool, round_)
        if published is not None:
            groups = await self._reload(published)
            if groups is not None:
                return published, groups
        self.refused = {}
        self.secret = RoundSecret.derive(self.peer.identity, self.run_id, round_).key("rollout-pool")
        deadline = self.closes_at = time.monotonic() + self.cfg.pool_wait_seconds
        waited_long = False
        while True:
            entries = await self._gather(round_, states)
            if len(entries) >= self.cfg.min_pool_batches or (entries and time.monotonic() > deadline):
                break
            if not waited_long and time.monotonic() > deadline:
                self.events.emit(
                    PoolWaiting(round=round_), f"round {round_}: no checked rollout batch yet; waiting for workers"
                )
                waited_long = True
            await asyncio.sleep(self.poll)
        self._forget_before(round_ - self.cfg.max_staleness)
        pool = RolloutPool(
            run_id=self.run_id,
            round=round_,
            entries=tuple(e for e, _ in entries),
            rejections=tuple(self.refused.values())[:MAX_POOL_BATCHES],
        )
        return pool, [g for _, g in entries]

    async def _gather(self, round_: int, states: Mapping[int, str]) -> list[tuple[PoolEntry, Groups]]:
        entries: list[tuple[PoolEntry, Groups]] = []
        self.examined = 0  # the budget is per pass: one spent on a flood does not starve later passes
        for verified, pushed in await self._candidates(round_):
            if len(entries) >= self.cfg.pool_batches or (entries and time.monotonic() > self._hard_close()):
                break
            a = verified.message
            groups = await self._checked(verified, pushed, states, round_)
            if groups is not None:
                entry = PoolEntry(
                    worker=verified.sender_hex, round=a.round, blob_sha256=a.blob_sha256, blob_size=a.blob_size
                )
                entries.append((entry, groups))
        return entries

    def _hard_close(self) -> float:
        """Past this a pass stops examining once it has a batch: slow holders cannot keep a pool open."""
        return self.closes_at + self.cfg.pool_wait_seconds

    async def _candidates(self, round_: int) -> list[Candidate]:
        """Batches of the rounds a pool may draw on, newest round first; within one, pushed ones first,
        then workers with batches that passed before, each group in the order of the secret's hash;
        one candidate per blob and worker."""
        found: list[Candidate] = []
        for r in range(round_, max(-1, round_ - self.cfg.max_staleness - 1), -1):
            pushed = self.intake.held(r) if self.intake is not None else []
            announced: list[Candidate] = [(v, None) for v in await self.peer.get(RolloutAnnouncement, r)]
            found += sorted(
                pushed + announced,
                key=lambda c: (c[1] is None, c[0].sender_hex not in self.trusted, self._rank(c[0].sender_hex)),
            )
        seen: set[tuple[str, str]] = set()
        out: list[Candidate] = []
        for verified, path in found:
            named = (verified.message.blob_sha256, verified.sender_hex)
            if self.penalized.get(verified.sender_hex, -1) <= round_ and named not in seen:
                seen.add(named)
                out.append((verified, path))
        return out

    def _rank(self, worker: str, group: int = -1) -> bytes:
        """A hash of the secret and `worker`'s key (and a group index): an order nobody else can compute."""
        return hashlib.sha256(self.secret + bytes.fromhex(worker) + group.to_bytes(4, "big", signed=True)).digest()

    async def _checked(
        self, verified: Verified[RolloutAnnouncement], pushed: Path | None, states: Mapping[int, str], round_: int
    ) -> Groups | None:
        a, worker = verified.message, verified.sender_hex
        if a.blob_sha256 in self.checked:
            _, owner, groups = self.checked[a.blob_sha256]
            if owner == worker:
                return groups
            self._refuse(worker, a, f"a copy of worker {owner[:12]}'s batch", round_)
            return None
        if (a.blob_sha256, worker) in self.refused:
            return None
        problem = oversize(a)
        if problem is not None:
            self._refuse(worker, a, problem, round_)
            return None
        if self.sampling is not None and not self.sampling.can_check(a.round):
            log.info("rollout batch %s of round %d: its weights are no longer held here", a.blob_sha256[:12], a.round)
            return None  # not the worker's fault: neither taken nor refused
        if self.examined >= EXAMINED_PER_BATCH * self.cfg.pool_batches:
            return None  # this pool's work is spent; later candidates wait for another round
        self.examined += 1
        data = _read_pushed(pushed, worker) if pushed is not None else await self._fetched(worker, a, round_)
        if data is None:
            return None
        batch = vet(data, a, worker, self.run_id, states, self.cfg)
        if not isinstance(batch, str) and self.sampling is not None:
            batch = await self._sampled(batch) or batch
        if isinstance(batch, str):
            self.peer.store.remove(a.blob_sha256)
            self._refuse(worker, a, batch, round_)
            return None
        if pushed is not None:
            self.peer.store.put(data)  # served from here: miners fetch the pool's batches from the validator
        self.peer.hold(a.blob_sha256, round_, "other")  # miners may fetch it from the validator as well as the worker
        self.checked[a.blob_sha256] = (a.round, worker, batch.groups)
        self.trusted[worker] = round_
        self.peer.grant_standing([worker])  # its announcements are read first, whatever a flood of others
        return batch.groups

    async def _fetched(self, worker: str, a: RolloutAnnouncement, round_: int) -> bytes | None:
        """An announced batch's bytes from any holder, or None (its worker refused) when nobody serves it."""
        try:
            async with asyncio.timeout(self.cfg.pool_wait_seconds):
                path = await self.peer.fetch(a.blob_sha256, a.blob_size, a.round)
        except (TransferError, TimeoutError) as exc:
            log.info("rollout batch %s from %s not fetched: %s", a.blob_sha256[:12], worker[:12], exc or "timed out")
            self._refuse(worker, a, f"{UNSERVED_REASON}: {exc or 'timed out'}", round_, UNSERVED_PENALTY_ROUNDS)
            return None
        return path.read_bytes()

    async def _sampled(self, batch: RolloutBatch) -> str | None:
        """Why a sample of `batch`'s groups (drawn with the secret) was not sampled from its round's weights."""
        assert self.sampling is not None
        order = sorted(range(len(batch.groups)), key=lambda i: self._rank(batch.worker, i))
        sample = sorted(order[:CHECKED_GROUPS])
        return await asyncio.get_running_loop().run_in_executor(None, self.sampling.check, batch, sample)

    def _refuse(
        self, worker: str, a: RolloutAnnouncement, reason: str, round_: int, rounds: int = PENALTY_ROUNDS
    ) -> None:
        reason = reason[:MAX_REASON_CHARS]
        self.refused[a.blob_sha256, worker] = PoolRejection(worker=worker, blob_sha256=a.blob_sha256, reason=reason)
        self._penalize(worker, round_, rounds)
        self.events.emit(
            RolloutsRefused(round=round_, worker=worker, reason=reason),
            f"round {round_}: refused worker {worker[:12]}'s rollouts ({reason}); left out for {rounds} rounds",
        )

    def _penalize(self, worker: str, round_: int, rounds: int) -> None:
        """Leave `worker` out of the pools of the `rounds` rounds after `round_`."""
        self.penalized[worker] = max(self.penalized.get(worker, -1), round_ + rounds)
        if rounds >= PENALTY_ROUNDS:
            self.trusted.pop(worker, None)  # a lie costs its standing: no seat kept for its pushes, not read first

    async def _remember(self, round_: int) -> None:
        """Standing and penalties from the pools this validator published in the rounds before
        `round_` (a restart keeps them: workers with standing keep their seats against a flood)."""
        self.remembered = True
        for r in range(max(0, round_ - PENALTY_ROUNDS), round_):
            pool = await self.peer.from_validator(RolloutPool, r)
            if pool is None:
                continue
            for entry in pool.entries:
                self.trusted[entry.worker] = max(self.trusted.get(entry.worker, -1), r)
            for refusal in pool.rejections:
                unserved = refusal.reason.startswith(UNSERVED_REASON)
                self._penalize(refusal.worker, r, UNSERVED_PENALTY_ROUNDS if unserved else PENALTY_ROUNDS)
        if self.trusted:
            self.peer.grant_standing(list(self.trusted))
            log.info("rollout pools: %d workers with standing read back from published pools", len(self.trusted))

    async def _reload(self, pool: RolloutPool) -> list[Groups] | None:
        """The groups of a pool published before a restart, from this node's store (or any holder)."""
        groups: list[Groups] = []
        for entry in pool.entries:
            try:
                path = await self.peer.fetch(entry.blob_sha256, entry.blob_size, entry.round)
                groups.append(rollouts.decode(path.read_bytes(), LIMITS).groups)
            except (TransferError, ProtocolError) as exc:
                log.warning("the published pool of round %d cannot be reloaded (%s): building anew", pool.round, exc)
                return None
            self.checked[entry.blob_sha256] = (entry.round, entry.worker, groups[-1])
        return groups

    def _forget_before(self, oldest: int) -> None:
        for worker in [w for w, until in self.penalized.items() if until < oldest]:
            del self.penalized[worker]  # served its penalty: a flood of refused keys does not pile up here
        for worker in [w for w, r in self.trusted.items() if r < oldest - PENALTY_ROUNDS]:
            del self.trusted[worker]  # long silent: a newcomer again
        for sha, (r, _, _) in list(self.checked.items()):
            if r < oldest:
                del self.checked[sha]
                self.peer.store.remove(sha)


def _read_pushed(path: Path, worker: str) -> bytes | None:
    """A pushed batch's bytes; None when its file is gone: pushes arrive while a pool is built, and one
    that unseats a listed batch removes its bytes (neither taken nor refused: not its worker's fault)."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        log.info("rollout batch from %s lost its seat while the pool was built: passed over", worker[:12])
        return None
