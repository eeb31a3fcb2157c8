"""How long a node keeps its blobs: the last rounds' patches and payloads, the latest checkpoints,
and never more than a disk budget.

    keeper = Keeper(store, Retention(keep_rounds=8))
    keeper.tag(sha256, round_, "checkpoint")   # what the blob is and which round it belongs to
    removed = keeper.sweep(current_round)      # once a round (`Peer.heartbeat` calls it)

A blob nobody tagged (a payload a miner made, a submission the validator received, a blob left
from before a restart) is tagged with the round in which a sweep first saw it, so it ages out
like the rest. A sweep removes, in this order: blobs of rounds older than `keep_rounds` (not
checkpoints), checkpoints beyond the newest `keep_checkpoints`, then, while the store is over
`max_bytes`, the oldest blobs left except the newest checkpoint. Tags live in memory: after a
restart every blob is new to the sweep.
"""

from __future__ import annotations

import logging
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from node.net.blobstore import BlobStore

log = logging.getLogger(__name__)

BlobKind = Literal["patch", "checkpoint", "payload", "other"]


class Retention(BaseModel):
    """What a node keeps on disk."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True, use_attribute_docstrings=True)

    keep_rounds: int = Field(default=8, ge=1)
    """Patches, payloads and other blobs of this many recent rounds stay (a late joiner replays
    the patches since the newest checkpoint: keep at least `checkpoint_every` + 2)."""
    keep_checkpoints: int = Field(default=2, ge=1)
    """The newest checkpoints kept, whatever their age."""
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
        checkpoints = sorted((sha for sha, (_, k) in self.tags.items() if k == "checkpoint"), key=self._round)
        newest = set(checkpoints[-self.policy.keep_checkpoints :])
        oldest_kept = current_round - self.policy.keep_rounds
        doomed = [sha for sha, (r, k) in self.tags.items() if k != "checkpoint" and r < oldest_kept]
        doomed += [sha for sha in checkpoints if sha not in newest]
        for sha in doomed:
            self._remove(sha)
        return doomed + self._fit_budget(protected=set(checkpoints[-1:]))

    def _fit_budget(self, protected: set[str]) -> list[str]:
        """Remove the oldest blobs (but `protected`) while the store is over `max_bytes`."""
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
