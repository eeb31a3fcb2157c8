"""A second validator with the same key: seen on the run's head, and refused in one line.

    watch = KeyClashWatch(identity.public_hex, peer.peer_id)
    await watch.check(peer, round_, state_hash)   # before the validator publishes its head: raises SameKeyElsewhere

The DHT keeps one record per (key, owner): two processes signing with one key overwrite each
other's head and round results, and readers see a chain that jumps between two states (a fresh
second validator published a signed round-0 result while the run was at round 134, and the run
page said "chain BROKEN" for an hour). Nothing else can tell them apart: both signatures are
valid. So each validator reads the head before it writes its own and stops if a head signed by
its key is one it did not write:

- ahead of it (an `open_round` past its own: it is the newcomer, and stops before it publishes);
- at its round with another state (the two diverged);
- signed since it started by another libp2p peer (a second process with this key, at any round).

A head this validator wrote in an earlier life (before a kill -9 and restart from the same state
folder) passes: it is at or behind the state on disk, at the same state, and older than this start.
"""

from __future__ import annotations

import time

from node.net.peer import RunView
from protocol.errors import ConfigError
from protocol.messages import HEAD_ROUND, RunHead
from protocol.signing import Verified


class SameKeyElsewhere(ConfigError):
    """Another process signs the run's head with this validator's key."""


class KeyClashWatch:
    """One validator's look at the heads signed with its key (`check` once a round)."""

    def __init__(self, key_hex: str, peer_id: str, started: int | None = None) -> None:
        self.key, self.peer_id = key_hex, peer_id
        self.started = int(time.time()) if started is None else started

    def foreign(self, head: RunHead, round_: int, state_hash: str) -> str | None:
        """Why `head` (signed with this key) was not written by this validator; None if it may have been."""
        if head.open_round > round_:
            return f"it is at round {head.open_round}, this validator at round {round_}"
        if head.open_round == round_ and head.state_hash != state_hash:
            return f"its state at round {round_} is {head.state_hash[:12]}, this validator's {state_hash[:12]}"
        if head.sent_at > self.started and head.validator_peer != self.peer_id:
            return f"peer {head.validator_peer} published it at round {head.open_round} since this validator started"
        return None

    def clash(self, heads: list[Verified[RunHead]], round_: int, state_hash: str) -> str | None:
        """The one line to stop with, if one of `heads` is another signer's of this key."""
        for verified in heads:
            if verified.sender_hex != self.key:
                continue
            why = self.foreign(verified.message, round_, state_hash)
            if why is not None:
                return (
                    f"another validator signs this run's head with this key ({self.key[:12]}...): {why}; "
                    "stopping (run one validator per key; a restart must use the same --state-dir)"
                )
        return None

    async def check(self, view: RunView, round_: int, state_hash: str) -> None:
        """Read the head; `SameKeyElsewhere` if another process signs it with this key."""
        why = self.clash(await view.get(RunHead, HEAD_ROUND), round_, state_hash)
        if why is not None:
            raise SameKeyElsewhere(why)
