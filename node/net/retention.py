"""How long a node keeps its blobs: the last rounds' patches and payloads, the latest checkpoints,
and never more than a disk budget.

    keeper = Keeper(store, Retention(keep_rounds=8))
    keeper.tag(sha256, round_, "checkpoint")   # what the blob is and which round it belongs to
    removed = keeper.sweep(current_round)      # once a round (`Peer.heartbeat` calls it)

A blob nobody tagged (a payload a miner made, a submission the validator received, a blob left
from before a restart) is tagged with the round in which a sweep first saw it, so it ages out
like the rest.

Checkpoints are kept by checkpoint, not by blob: a checkpoint of round c is every blob tagged
"checkpoint" with round c (the BF16 state, its piece index, and the FP32 master of the state
W_c, which the validator tags with c too), and the newest `keep_checkpoints` checkpoints stay
whole, so an auditor, a standby or a joiner a few rounds behind finds all three. Patches of
rounds since the oldest checkpoint kept stay too: they lead from it to the current state.

A sweep removes, in this order: blobs of rounds older than `keep_rounds` (not checkpoints, nor
patches a kept checkpoint needs), checkpoints beyond the newest `keep_checkpoints`, then, while
the store is over `max_bytes`, the oldest blobs left except the newest checkpoint's. Tags live in
memory: after a restart every blob is new to the sweep.
"""

from __future__ import annotations

import logging
from typing import Literal

from pydantic import BaseModel, Field

from node.net.blobstore import BlobStore
from protocol.parsing import STRICT

log = logging.getLogger(__name__)

BlobKind = Literal["patch", "checkpoint", "payload", "other"]


class Retention(BaseModel):
    """What a node keeps on disk."""

    model_config = STRICT

    keep_rounds: int = Field(default=8, ge=1)
    """Patches, payloads and other blobs of this many recent rounds stay (a late joiner replays
    the patches since the newest checkpoint: keep at least `checkpoint_every` + 2)."""
    keep_checkpoints: int = Field(default=3, ge=1)
    """The newest checkpoints kept whole (every blob of each), whatever their age."""
    max_bytes: int = Field(default=32 << 30, ge=0)
    """Disk budget for all blobs; past it the oldest go first (never the newest checkpoint)."""


class Keeper:
    """Applies a `Retention` to one `BlobStore`."""

    def __init__(self, store: BlobStore, policy: Retention) -> None:
        self.store, self.policy = store, policy
        self.tags: dict[str, tuple[int, BlobKind]] = {}

    def tag(self, sha256: str, round_: int, kind: BlobKind) -> None:
        self.tags[sha256] = (round_, kind)

    def tag_new(self, sha256: str, round_: int, kind: BlobKind) -> None:
        """Tag `sha256` unless it already is (a fetch names the round, a later `tag` the kind)."""
        self.tags.setdefault(sha256, (round_, kind))

    def sweep(self, current_round: int) -> list[str]:
        """Remove what the policy no longer keeps; the blobs removed."""
        on_disk = set(self.store)
        self.tags = {sha: tag for sha, tag in self.tags.items() if sha in on_disk}
        for sha in on_disk - set(self.tags):
            self.tags[sha] = (current_round, "other")
        kept = self.checkpoint_rounds()[-self.policy.keep_checkpoints :]
        oldest_kept = current_round - self.policy.keep_rounds
        since = min(kept, default=current_round)  # patches from the oldest checkpoint kept onwards are needed
        doomed = [
            sha
            for sha, (r, k) in self.tags.items()
            if (k == "checkpoint" and r not in kept)
            or (k != "checkpoint" and r < oldest_kept and not (k == "patch" and r >= since))
        ]
        for sha in doomed:
            self._remove(sha)
        newest = {sha for sha, (r, k) in self.tags.items() if k == "checkpoint" and r == max(kept, default=-1)}
        return doomed + self._fit_budget(protected=newest)

    def checkpoint_rounds(self) -> list[int]:
        """The rounds of the checkpoints this store holds (any of their blobs), oldest first."""
        return sorted({r for r, k in self.tags.values() if k == "checkpoint"})

    def _fit_budget(self, protected: set[str]) -> list[str]:
        """Remove the oldest blobs (but `protected`: the newest checkpoint's) while the store is over `max_bytes`."""
        removed: list[str] = []
        sizes = {sha: self._size(sha) for sha in self.tags}
        total = sum(sizes.values())
        for sha in sorted(self.tags, key=self._round):
            if total <= self.policy.max_bytes:
                return removed
            if sha in protected:
                continue
            self._remove(sha)
            total -= sizes[sha]
            removed.append(sha)
        if total > self.policy.max_bytes:
            log.warning("the newest checkpoint alone (%d bytes) is over the blob budget", total)
        return removed

    def _round(self, sha256: str) -> int:
        return self.tags[sha256][0]

    def _size(self, sha256: str) -> int:
        try:
            return self.store.path(sha256).stat().st_size
        except FileNotFoundError:
            return 0

    def _remove(self, sha256: str) -> None:
        self.store.remove(sha256)
        self.tags.pop(sha256, None)
