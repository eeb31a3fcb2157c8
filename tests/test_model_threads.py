"""W_0 is the same when several nodes of one process build the model at once, in threads (the
in-process swarm tests run every role's start-up in executor threads)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from node.learn.model import GPTConfig, build_gpt
from node.learn.train import unique_state
from protocol.statehash import state_hash

CFG = GPTConfig(block_size=32, n_layer=2, n_head=2, n_embd=64)


def _w0(_: int) -> str:
    return state_hash({n: t.detach() for n, t in unique_state(build_gpt(CFG, seed=3)).items()})


def test_models_built_in_threads_at_once_have_the_seeds_weights() -> None:
    alone = _w0(0)
    with ThreadPoolExecutor(8) as pool:
        hashes = set(pool.map(_w0, range(32)))
    assert hashes == {alone}
