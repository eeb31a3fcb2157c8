"""The RL warm start: trained once, cached by its recipe, a bad cache file rebuilt."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from node.learn.model import GPTConfig
from node.learn.rl import warmstart
from node.learn.rl.config import RLConfig
from node.learn.rl.warmstart import cache_path, warm_start

GPT = GPTConfig(block_size=16, n_layer=1, n_head=2, n_embd=32)
CFG = RLConfig(digits=2, warm_start_steps=3)


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return set(a) == set(b) and all(torch.equal(a[n], b[n]) for n in a)


def test_miss_then_hit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = warm_start(GPT, 0, CFG, tmp_path)
    path = cache_path(GPT, 0, CFG, tmp_path)
    assert path.exists() and all(t.dtype == torch.float32 for t in first.values())

    def no_training(*_: object) -> float:
        raise AssertionError("a cache hit must not train")

    monkeypatch.setattr(warmstart, "train_sft", no_training)
    assert _same(warm_start(GPT, 0, CFG, tmp_path), first)
    # everything that decides the weights is in the key
    assert cache_path(GPT, 1, CFG, tmp_path) != path
    assert cache_path(GPT, 0, CFG.model_copy(update={"warm_start_steps": 4}), tmp_path) != path
    assert cache_path(GPT, 0, CFG.model_copy(update={"digits": 3}), tmp_path) != path
    assert cache_path(GPT.model_copy(update={"n_embd": 64}), 0, CFG, tmp_path) != path
    # the held-out reward settings do not change W_0
    assert cache_path(GPT, 0, CFG.model_copy(update={"held_out_prompts": 7}), tmp_path) == path


@pytest.mark.parametrize("damage", ["garbage", "other_key", "flipped"])
def test_bad_cache_file_is_rebuilt(tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str) -> None:
    first = warm_start(GPT, 0, CFG, tmp_path)
    path = cache_path(GPT, 0, CFG, tmp_path)
    data = bytearray(path.read_bytes())
    if damage == "garbage":
        data = bytearray(b"not a safetensors file")
    elif damage == "other_key":
        data = data.replace(cache_path(GPT, 0, CFG).stem.encode(), b"0" * 64)
    else:
        data[-1] ^= 0x01  # a weight's last byte: the recorded SHA-256 no longer matches
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="node.learn.rl.warmstart"):
        again = warm_start(GPT, 0, CFG, tmp_path)
    assert "rebuilding" in caplog.text
    assert _same(again, first)  # training is deterministic: the rebuilt file holds the same weights
    assert _same(warm_start(GPT, 0, CFG, tmp_path), first)


def test_the_callers_thread_count_does_not_change_w0(tmp_path: Path) -> None:
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        two = warm_start(GPT, 0, CFG, tmp_path / "a")
        torch.set_num_threads(1)
        one = warm_start(GPT, 0, CFG, tmp_path / "b")
    finally:
        torch.set_num_threads(before)
    assert _same(one, two)
    assert torch.get_num_threads() == before
