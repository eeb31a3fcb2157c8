"""Per-tensor work on all cores. numpy releases the GIL in its sorts and elementwise loops, so
threads are enough; results come back in input order, so output never depends on scheduling."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


@lru_cache(maxsize=1)
def _pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1), thread_name_prefix="pulse-codec")


def parallel_map(fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
    if len(items) < 2:
        return [fn(x) for x in items]
    return list(_pool().map(fn, items))
