"""`decode_ahead`: a round's next payloads decode on their own threads, results in input order,
errors raised where the caller asks for that item, never more than `depth` waiting."""

from __future__ import annotations

import threading
import time

import pytest

from validator.decodeahead import decode_ahead


class Decoder:
    """Slow decodes that count how many run or wait at once; item 3 is undecodable."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.started: list[int] = []
        self.threads: set[str] = set()

    def __call__(self, item: int) -> int:
        with self.lock:
            self.started.append(item)
            self.threads.add(threading.current_thread().name)
        time.sleep(0.05)
        if item == 3:
            raise ValueError("undecodable payload 3")
        return item * 10


@pytest.mark.parametrize("depth", [0, 1, 3])
def test_results_in_order_errors_at_their_item_and_bounded_lookahead(depth: int) -> None:
    decode, got, ahead = Decoder(), [], []
    for item, decoded in decode_ahead(decode, list(range(8)), depth):
        try:
            got.append(decoded.result())
        except ValueError as exc:
            got.append(str(exc))
        time.sleep(0.02)  # the caller's work on this item, while the next ones decode
        ahead.append(len(decode.started) - item - 1)  # decodes started past this one
    assert got == [0, 10, 20, "undecodable payload 3", 40, 50, 60, 70]
    assert max(ahead) <= depth and sorted(decode.started) == list(range(8))
    if depth:
        assert max(ahead) == depth  # the lookahead is used, on the pool's threads
        assert all(name.startswith("pulse-decode-ahead") for name in decode.threads)
    else:
        assert decode.threads == {threading.current_thread().name}


def test_decoding_ahead_overlaps_the_work_on_each_item() -> None:
    """Four 0.1 s decodes beside 0.1 s of work on each: one after the other 0.8 s, ahead about 0.5 s."""

    def slow(item: int) -> int:
        time.sleep(0.1)
        return item

    start = time.perf_counter()
    for _, decoded in decode_ahead(slow, [1, 2, 3, 4], 2):
        decoded.result()
        time.sleep(0.1)
    assert time.perf_counter() - start < 0.7


def test_leaving_early_cancels_what_has_not_started() -> None:
    decode = Decoder()
    for item, decoded in decode_ahead(decode, list(range(20)), 2):
        decoded.result()
        if item == 1:
            break
    time.sleep(0.2)
    assert len(decode.started) <= 5  # items 0 and 1, and at most the lookahead behind them
