"""Whether a round's signed result continues the state the round before ended on, and one line when not.

    forks = ForkWatch()
    if forks.forks(result, before):   # before: the state round `result.round - 1` ended on (None: unknown)
        ...                           # stay on the chain already followed; the fork was named (once a round)

Two processes signing with one validator key publish two chains (the DHT keeps one record per key
and owner, so readers see results that jump between them). Readers that already follow a chain (the
run page, a follower, a miner) stay on it and name the fork, rather than jumping or rejoining.
"""

from __future__ import annotations

import logging

from protocol.messages import RoundResult

log = logging.getLogger(__name__)


class ForkWatch:
    def __init__(self) -> None:
        self.named: int | None = None  # the round whose fork was last logged (once per round)

    def forks(self, result: RoundResult, before: str | None) -> bool:
        """Whether `result` starts from another state than `before`; names the fork in one line."""
        if before is None or before == result.base_state_hash:
            return False
        if self.named != result.round:
            self.named = result.round
            log.warning(
                "fork at round %d: its signed result starts from state %s, not from %s where round %d "
                "ended (two chains signed by one validator key); following the first",
                result.round,
                result.base_state_hash[:12],
                before[:12],
                result.round - 1,
            )
        return True
