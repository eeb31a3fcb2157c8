"""Decode a round's distinct payloads a few ahead of the one being inspected, on their own threads.

A PULSELoCo payload's two rANS streams decode serially, one thread each, so at 0.5B one payload
takes seconds (8 s for a 311 MB payload on a 16-core GPU machine) while most cores wait; a round of
8 distinct payloads spent most of its time there. Here the next `depth` payloads decode while the
current one is measured:

    for item, decoded in decode_ahead(decode, items, depth):
        update = decoded.result()   # the decoded update, or the decoder's error, raised here

Results come in input order and are the decoder's own (the codecs' output does not depend on the
thread that ran them). At most `depth` decoded updates wait beside the one in use, so memory is
bounded by `depth`, not by the number of submissions; depth 0 decodes each in turn, on the caller's
thread. Leaving the loop early cancels what has not started and waits for what has.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def decode_ahead(
    decode: Callable[[T], R], items: Sequence[T], depth: int
) -> Generator[tuple[T, Future[R]], None, None]:
    """(item, its decode's future) in input order, with up to `depth` later decodes running meanwhile."""
    if depth <= 0 or len(items) < 2:
        for item in items:
            yield item, _done(decode, item)
        return
    pool = ThreadPoolExecutor(max_workers=depth, thread_name_prefix="pulse-decode-ahead")
    pending: deque[Future[R]] = deque()
    try:
        ahead = iter(items)
        for item in items:
            while len(pending) < depth + 1:  # the one handed out next, and `depth` after it
                nxt = next(ahead, None)
                if nxt is None:
                    break
                pending.append(pool.submit(decode, nxt))
            yield item, pending.popleft()
    finally:
        for f in pending:
            f.cancel()
        pool.shutdown(wait=True)


def _done(decode: Callable[[T], R], item: T) -> Future[R]:
    """`decode(item)` run now, as a finished future (its error kept for `result()` to raise)."""
    out: Future[R] = Future()
    try:
        out.set_result(decode(item))
    except Exception as exc:  # handed to the caller by result(), as a pool's future does
        out.set_exception(exc)
    return out
