"""A decoded update that counts how many of its kind are alive: for memory-bound tests."""

from __future__ import annotations

import weakref

import torch


class Tracked(dict[str, torch.Tensor]):
    """A decoded update that counts how many of its kind are alive (reset `alive` and `peak` per test)."""

    alive = 0
    peak = 0

    def __init__(self, data: dict[str, torch.Tensor]) -> None:
        super().__init__(data)
        Tracked.alive += 1
        Tracked.peak = max(Tracked.peak, Tracked.alive)
        weakref.finalize(self, Tracked._gone)

    @staticmethod
    def _gone() -> None:
        Tracked.alive -= 1
