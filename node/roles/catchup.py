"""Keeping the BF16 global weights in step with the validator: patches, and checkpoints to catch up.

    chain = Chain(peer, events)
    held = await chain.sync()          # the cheapest checkpoint (hash-checked) if holding nothing,
                                       # then every round result published since; call again to advance

A join (`_join`) prices every recent checkpoint by the bytes still to fetch (`joinplan.py`), fetches
the chosen one piece by piece from every holder at once when the validator published its piece
index (`net/pieces.py`: each piece checked against the announced state as it arrives; a partial
download resumes), and the patches after it meanwhile, showing bytes, rate, holders and time left.

Invariant: `Held.weights` always hashes to `Held.state_hash`, the hash the validator announced
for `Held.round`. A patch that fails to fetch, apply or verify changes nothing; a node that
cannot apply the chain rejoins from the newest checkpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Final

from node.events import Events, mb, progress
from node.events.models import CheckpointLoaded, Joined, PatchApplied, Scored
from node.net.peer import Peer
from node.net.pieces import STREAMS_PER_HOLDER, Piece
from node.net.streams import DEFAULT_LIMITS
from node.roles.chainstate import apply_patch, load_checkpoint, load_pieces
from node.roles.forks import ForkWatch
from node.roles.joinplan import JoinPlan, plan_join
from node.roles.joinreport import JoinReport, QuietWatch, fetch_showing
from protocol.errors import ProtocolError, TransferError
from protocol.messages import RoundResult
from protocol.pieces import PieceIndex
from protocol.state import State

log = logging.getLogger(__name__)

CHECKPOINT_FORMAT = "safetensors"
# patches fetched at once while the checkpoint arrives: beside the checkpoint's own streams to a
# holder, no more than a holder grants one peer (more were refused as busy, and the join waited)
PREFETCH_STREAMS = max(1, DEFAULT_LIMITS.max_streams_per_peer - STREAMS_PER_HOLDER)
QUIET_SECONDS = 30.0  # a node that finds nothing of its run for this long says so (then after 2x, 4x, ...)
# a checkpoint that no holder delivered is tried again after the poll, then after twice as long each
# time, up to this: a node started after its run ended (every holder gone) does not dial dead peers
# once a second for ever, and one started while the validator restarts still joins within a minute
RETRY_MAX_SECONDS = 60.0


class Broken(Enum):
    """The chain broke at this node: rejoin from a checkpoint."""

    BROKEN = "broken"


BROKEN: Final = Broken.BROKEN


@dataclass
class Held:
    round: int  # this node holds W_round
    weights: State  # BF16
    state_hash: str
    linked: bool = False  # reached by applying a signed round result (not a checkpoint or a state from disk)


async def _cpu(fn: Callable[..., State], *args: object) -> State:
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


class Chain:
    """This node's place in the patch chain: one loop, a small state machine.

        holding nothing --join--> holding W_c (the newest checkpoint, hash-checked)
        holding W_r --patch r applies and verifies--> holding W_{r+1}
        holding W_r --result r starts from another state, or its patch fails its checks--> holding nothing
        holding W_r reached by a patch --result r starts from another state--> a fork: named, W_r kept
        holding W_r, no result for r yet (or its patch not fetchable yet) --> done for now

    `sync()` runs the loop until the last case and returns what it holds. `me` (a miner's public
    key) also reports how that miner's submission fared in each round it applies.
    """

    def __init__(
        self,
        peer: Peer,
        events: Events,
        me: str | None = None,
        *,
        poll: float = 1.0,
        quiet_seconds: float = QUIET_SECONDS,
    ) -> None:
        self.peer, self.events, self.me, self.poll, self.quiet_seconds = peer, events, me, poll, quiet_seconds
        self.held: Held | None = None
        self.behind = 0  # patches to apply after the last join
        self.joining: tuple[float, int, int] | None = None  # (started, round it reaches, bytes planned)
        self.unusable: set[str] = set()  # checkpoints no holder delivered: not planned again (but the head's)
        self.fork_watch = ForkWatch()

    async def sync(self) -> Held:
        """Join if holding nothing, then apply every published patch; a broken chain rejoins."""
        fresh = False  # holding a checkpoint just loaded, nothing applied on it yet
        with contextlib.ExitStack() as bars:
            applied: Callable[[float], None] = lambda n: None  # noqa: E731
            while True:
                if self.held is None:
                    self.held, fresh = await self._join(), True
                    behind = self.behind
                    if behind > 1:  # a patch chain to replay: show it on a terminal
                        applied = bars.enter_context(progress(f"patch chain from round {self.held.round}", behind))
                self._joined(self.held)
                step = await self._apply_next(self.held)
                if step is None:
                    return self.held
                if isinstance(step, Held):
                    self.held, fresh = step, False
                    applied(1)
                    continue
                if fresh:  # even the newest checkpoint does not continue: look again later, not in a tight loop
                    await asyncio.sleep(self.poll)
                self.held = None

    async def _join(self) -> Held:
        """The cheapest announced checkpoint (`joinplan.py`); waits until the validator has announced one that loads.

        Where the run is comes from the validator's head (one read at any round, `Peer.position`); the
        head's checkpoint is priced beside the other recent ones. While nothing of the run is found,
        the wait is reported (`Quiet`), never silent."""
        start = time.monotonic()
        quiet = QuietWatch(self.events, self.peer, self.quiet_seconds)
        failed = 0  # loads in a row that no holder delivered
        retry = self.poll  # the wait after the next such load: doubles, up to RETRY_MAX_SECONDS
        while True:
            current, announcement, head = await self.peer.position()
            if head is not None:
                self.peer.validator_peer = head.validator_peer  # it serves the checkpoint and the patches
            skip = frozenset(self.unusable)
            plan = await plan_join(self.peer, current, announcement, skip) if announcement is not None else None
            wait = self.poll
            if plan is not None:
                held = await self._load(plan, current, failed + 1, time.monotonic() - start)
                if held is not None:
                    self.behind = current - held.round  # patches published since the checkpoint
                    self.joining = (start, current, plan.bytes_needed)
                    return held
                failed += 1
                wait, retry = retry, min(2 * retry, max(RETRY_MAX_SECONDS, self.poll))
            elif announcement is None:
                quiet.check()
            await asyncio.sleep(wait)

    def _joined(self, held: Held) -> None:
        """Report a join once it holds the state that was current when it started."""
        if self.joining is None or held.round < self.joining[1]:
            return
        start, _, planned = self.joining
        self.joining = None
        seconds = time.monotonic() - start
        self.events.emit(
            Joined(round=held.round, seconds=seconds, bytes=planned, patches=self.behind),
            f"joined at round {held.round} in {seconds:.1f}s ({mb(planned)} fetched, {self.behind} patches applied)",
        )

    async def _load(self, plan: JoinPlan, current: int, attempt: int, waited: float) -> Held | None:
        """The plan's checkpoint, its patches fetched meanwhile (they are applied by `sync`); None, with
        the reason logged, when no holder delivered it (`attempt`: the loads tried in a row, this one
        included, over `waited` seconds)."""
        a, start = plan.checkpoint, time.monotonic()
        patches = asyncio.ensure_future(self._prefetch(plan))
        try:
            stored = self.peer.store.has(a.blob_sha256)  # from an earlier run: its pieces are not checked now
            path, index, holders, resumed = await self._fetch_checkpoint(plan, current)
            if index is None or stored:
                weights = await _cpu(load_checkpoint, path.read_bytes(), a.state_hash)
            else:  # every piece checked on arrival against the index, which commits to the state hash
                weights = await _cpu(load_pieces, path, index, a.state_hash)
        except (TransferError, ProtocolError) as exc:
            gone = " (every holder gone? the validator may be down or the run over)" if attempt > 1 else ""
            log.warning(
                "checkpoint of round %d unusable (try %d, %.0f s since the join began)%s: %s; retrying",
                a.round, attempt, waited, gone, exc,
            )  # fmt: skip
            self.unusable.add(a.blob_sha256)
            return None
        finally:  # patches in flight now are fetched again by `_apply_next`: a missing one must not hold a load up
            patches.cancel()
            await asyncio.wait([patches])
        self.peer.hold(a.blob_sha256, a.round, "checkpoint")
        if a.index_sha256 is not None:
            self.peer.hold(a.index_sha256, a.round, "checkpoint")
        event = CheckpointLoaded(
            round=a.round,
            state_hash=a.state_hash,
            bytes=a.blob_size,
            behind=plan.behind,
            seconds=time.monotonic() - start,
            holders=holders,
            resumed=resumed,
            planned_bytes=plan.bytes_needed,
        )
        text = f"loaded the checkpoint of round {a.round} ({mb(a.blob_size)}) in {event.seconds:.1f}s"
        self.events.emit(event, f"{text}, state hash {a.state_hash[:12]} verified")
        return Held(a.round, weights, a.state_hash)

    async def _fetch_checkpoint(self, plan: JoinPlan, current: int) -> tuple[Path, PieceIndex | None, int | None, int]:
        """(the checkpoint blob, its piece index, most holders at once, bytes resumed): piece by piece
        from every holder when the validator published a piece index, else whole from one holder at a
        time (no index)."""
        a, now = plan.checkpoint, current - 1  # holders heartbeat the rounds they are at, not the checkpoint's
        what = f"checkpoint of round {a.round}"
        if a.index_sha256 is None or a.index_size is None:
            return await fetch_showing(self.peer, a.blob_sha256, a.blob_size, now, what), None, None, 0
        index_path = await self.peer.fetch(a.index_sha256, a.index_size, now)
        index = PieceIndex.from_bytes(index_path.read_bytes(), size=a.blob_size)
        index.check_root(a.state_hash)  # every piece is then checked against the announced state
        pieces = [Piece(offset, length, digest) for offset, length, digest in index.pieces()]
        with JoinReport(what, plan) as report:
            path = await self.peer.fetch_pieces(
                a.blob_sha256, a.blob_size, now, pieces, _check_piece, on_progress=report.update
            )
        return path, index, report.most_holders, report.resumed

    async def _prefetch(self, plan: JoinPlan) -> None:
        """The plan's patches, a few at a time, while the checkpoint arrives (a failure is fetched again later)."""
        slots = asyncio.Semaphore(PREFETCH_STREAMS)

        async def one(round_: int, sha: str, size: int) -> None:
            async with slots:
                try:
                    await self.peer.fetch(sha, size, round_)
                except (TransferError, ProtocolError) as exc:
                    log.info("patch of round %d not prefetched: %s", round_, exc)

        await asyncio.gather(*(one(*patch) for patch in plan.patches))

    async def _apply_next(self, held: Held) -> Held | Broken | None:
        """W_{r+1} from round r's patch; `BROKEN` to rejoin; None when there is nothing to apply yet.

        The patch applied is the counted result's (the chain rule, `node/net/peer.py`): among the
        validators' results for round r that start from the state held, the first in priority order.
        """
        results = await self.peer.from_validators(RoundResult, held.round)
        if not results:
            return None
        result = next((v.message for v in results if v.message.base_state_hash == held.state_hash), None)
        if result is None:
            if held.linked and self.fork_watch.forks(results[0].message, held.state_hash):
                return None  # a second chain signed by the key of the one followed: stay on the first
            log.warning("round %d result starts from another state than ours: rejoining", held.round)
            return BROKEN
        try:
            path = await self.peer.fetch(result.patch_sha256, result.patch_size, held.round)
            start = time.monotonic()
            data = path.read_bytes()
            weights = await _cpu(apply_patch, held.weights, held.state_hash, data, result.new_state_hash)
            seconds = time.monotonic() - start
        except TransferError as exc:
            log.warning("patch of round %d not available yet: %s", held.round, exc)
            return None
        except ProtocolError as exc:
            log.warning("patch of round %d failed its checks (%s): rejoining from a checkpoint", held.round, exc)
            return BROKEN
        self.peer.hold(result.patch_sha256, held.round)
        if self.me is not None:
            _report_placement(self.events, result, self.me)
        self.events.emit(
            PatchApplied(
                round=held.round, patch_bytes=result.patch_size, state_hash=result.new_state_hash, seconds=seconds
            ),
            f"patch of round {held.round} applied ({mb(result.patch_size)}), "
            f"state hash {result.new_state_hash[:12]} verified",
        )
        return Held(held.round + 1, weights, result.new_state_hash, linked=True)


def _check_piece(piece: Piece, data: bytes) -> bool:
    return PieceIndex.check(piece.digest, data)


def _report_placement(events: Events, result: RoundResult, me: str) -> None:
    ranked = sorted(result.selected, key=lambda s: -s.score)
    total = len(ranked) + len(result.rejections)
    place = next((i for i, s in enumerate(ranked) if s.sender == me), None)
    if place is not None:
        score = ranked[place].score
        text = f"round {result.round}: scored {ordinal(place + 1)} of {total} (score {score:.4g}), aggregated"
        events.emit(Scored(round=result.round, of=total, place=place + 1, score=score), text)
        return
    reason = next((r.reason for r in result.rejections if r.sender == me), None)
    # not named at all: nothing of this key reached the round in time, or (a key without standing) its
    # seat went to a newcomer with a lower admission ticket after it was taken; the validator's log says which
    missing = "not named in the result: nothing of this key counted (late, or a newcomer's seat lost to a lower ticket)"
    text = f"round {result.round}: not aggregated ({reason})" if reason else f"round {result.round}: {missing}"
    events.emit(Scored(round=result.round, of=total, reason=reason), text)


def ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"
