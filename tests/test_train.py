"""Training primitives, the base-model cache and update traces, on a tiny GPT (seconds in all)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

import node.bench.trace as trace
import node.learn.basecache as basecache
from node.learn.data import Corpus, stdlib_root
from node.learn.model import GPTConfig, build_gpt
from node.learn.train import (
    InnerOptimConfig,
    bf16_state,
    corpus_batches,
    evaluate,
    inner_train,
    load_bf16_state,
    make_optimizer,
    unique_state,
)
from protocol.statehash import state_hash

TINY = GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=32)


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    """~200 KB of real Python source: a fixed list of stdlib modules, last tenth held out."""
    names = ["argparse.py", "collections/__init__.py", "functools.py", "json/decoder.py", "pathlib.py", "typing.py"]
    text = b"".join((stdlib_root() / name).read_bytes()[:40_000] for name in names if (stdlib_root() / name).exists())
    tokens = torch.frombuffer(bytearray(text), dtype=torch.uint8)
    cut = len(tokens) * 9 // 10
    return Corpus(train=tokens[:cut].clone(), held_out=tokens[cut:].clone())


def held_out(corpus: Corpus, n: int = 4) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [corpus.batch(1000 + i, 16, TINY.block_size, "held_out") for i in range(n)]


def train_tiny(corpus: Corpus, seed: int, steps: int, lr: float = 3e-3) -> tuple[list[float], str]:
    model = build_gpt(TINY, seed=0)
    losses = inner_train(model, InnerOptimConfig(lr=lr), corpus_batches(corpus, seed, 16, TINY.block_size), steps)
    return losses, state_hash(bf16_state(model))


# --- inner loop -------------------------------------------------------------------------------


def test_inner_train_is_deterministic(corpus: Corpus) -> None:
    losses_a, hash_a = train_tiny(corpus, seed=7, steps=5)
    losses_b, hash_b = train_tiny(corpus, seed=7, steps=5)
    losses_c, hash_c = train_tiny(corpus, seed=8, steps=5)
    assert losses_a == losses_b and hash_a == hash_b
    assert losses_a != losses_c and hash_a != hash_c  # the seed names the batches


def test_inner_train_lowers_the_loss(corpus: Corpus) -> None:
    model = build_gpt(TINY, seed=0)
    before = evaluate(model, held_out(corpus))
    losses = inner_train(model, InnerOptimConfig(lr=3e-3), corpus_batches(corpus, 1, 16, TINY.block_size), 40)
    after = evaluate(model, held_out(corpus))
    assert len(losses) == 40
    assert after < before - 1.0, (before, after)  # ~5.5 nats at init
    assert sum(losses[-5:]) < sum(losses[:5])


def test_inner_train_keeps_optimizer_state_and_calls_hook(corpus: Corpus) -> None:
    batches = corpus_batches(corpus, 3, 8, TINY.block_size)
    cfg = InnerOptimConfig(lr=1e-3)
    whole = build_gpt(TINY)
    inner_train(whole, cfg, batches, 6)
    split = build_gpt(TINY)
    opt = make_optimizer(split, cfg)
    seen: list[int] = []
    inner_train(split, cfg, batches, 3, optimizer=opt, on_step=lambda step, _loss: seen.append(step))
    inner_train(split, cfg, batches, 3, optimizer=opt, first_step=3, on_step=lambda step, _loss: seen.append(step))
    assert seen == [0, 1, 2, 3, 4, 5]
    assert state_hash(unique_state(whole)) == state_hash(unique_state(split))


@pytest.mark.parametrize("clip", [1e-2, 1e3])
def test_gradients_are_clipped(corpus: Corpus, clip: float) -> None:
    model = build_gpt(TINY)
    inner_train(model, InnerOptimConfig(lr=1e-3, grad_clip=clip), corpus_batches(corpus, 0, 4, TINY.block_size), 2)
    norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters() if p.grad is not None]))
    if clip < 1:
        assert norm <= clip * (1 + 1e-4)  # the last step's gradient, as the optimizer saw it
    else:
        assert 1e-2 < norm < clip  # unclipped gradients are larger than the small clip above


def test_warmup_schedule() -> None:
    cfg = InnerOptimConfig(lr=1.0, warmup_steps=4)
    assert [cfg.lr_at(s) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert InnerOptimConfig(lr=0.5).lr_at(0) == 0.5


@pytest.mark.parametrize(
    "fields", [{"lr": 0.0}, {"lr": "1e-3"}, {"lr": 1e-3, "beta1": 1.0}, {"lr": 1e-3, "momentum": 0.9}, {}]
)
def test_inner_optim_config_rejects_bad_fields(fields: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        InnerOptimConfig(**fields)  # type: ignore[arg-type]


def test_evaluate_restores_mode_and_needs_batches(corpus: Corpus) -> None:
    model = build_gpt(TINY)
    model.train()
    assert evaluate(model, held_out(corpus, 1)) > 0
    assert model.training
    with pytest.raises(ValueError):
        evaluate(model, [])


# --- BF16 state -------------------------------------------------------------------------------


def test_bf16_state_is_a_detached_deduplicated_copy() -> None:
    model = build_gpt(TINY)
    state = bf16_state(model)
    assert "wte.weight" in state and "head.weight" not in state  # tied alias listed once
    assert set(state) == set(model.state_dict()) - {"head.weight"}
    for tensor in state.values():
        assert tensor.dtype == torch.bfloat16 and tensor.is_contiguous() and tensor.device.type == "cpu"
        assert not tensor.requires_grad
    snapshot = state_hash(state)
    with torch.no_grad():
        model.wte.weight.add_(1.0)
    assert state_hash(state) == snapshot  # a copy, not a view of the model


def test_bf16_round_trip_is_exact() -> None:
    source, target = build_gpt(TINY, seed=1), build_gpt(TINY, seed=2)
    state = bf16_state(source)
    load_bf16_state(target, state)
    assert state_hash(bf16_state(target)) == state_hash(state)
    assert target.head.weight is target.wte.weight  # still tied
    for name, tensor in unique_state(target).items():
        assert tensor.dtype == torch.float32
        assert torch.equal(tensor, state[name].float())  # BF16 -> FP32 is exact


@pytest.mark.parametrize("break_it", ["missing", "unexpected", "shape", "dtype"])
def test_load_bf16_state_rejects_mismatches_without_changing_the_model(break_it: str) -> None:
    model = build_gpt(TINY, seed=1)
    original = state_hash(unique_state(model))
    state = bf16_state(build_gpt(TINY, seed=2))
    if break_it == "missing":
        del state["ln_f.bias"]
    elif break_it == "unexpected":
        state["head.weight"] = state["wte.weight"]
    elif break_it == "shape":
        state["ln_f.bias"] = state["ln_f.bias"][:-1]
    else:
        state["ln_f.bias"] = state["ln_f.bias"].float()
    with pytest.raises(ValueError):
        load_bf16_state(model, state)
    assert state_hash(unique_state(model)) == original


# --- base model cache -------------------------------------------------------------------------


def test_base_cache_hit_returns_identical_weights_without_training(
    corpus: Corpus, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = basecache.load_or_train(TINY, 30, tmp_path, corpus=corpus)
    assert not first.from_cache and first.path.is_file()
    assert first.loss_after < first.loss_before - 0.3  # 30 steps, mostly warmup
    assert [p.name for p in first.path.parent.iterdir()] == [first.path.name]  # no temp files left

    def no_training(*_args: object) -> tuple[float, float]:
        raise AssertionError("a cache hit must not train")

    monkeypatch.setattr(basecache, "_pretrain", no_training)
    second = basecache.load_or_train(TINY, 30, tmp_path, corpus=corpus)
    assert second.from_cache and second.key == first.key
    assert (second.loss_before, second.loss_after) == (first.loss_before, first.loss_after)
    assert state_hash(unique_state(second.model)) == state_hash(unique_state(first.model))
    assert second.model.head.weight is second.model.wte.weight
    assert state_hash(unique_state(basecache.base_model(TINY, 30, tmp_path, corpus=corpus))) == state_hash(
        unique_state(first.model)
    )


def test_cache_key_sees_config_steps_seed_and_corpus(corpus: Corpus) -> None:
    key = basecache.cache_key(TINY, 30, 0, corpus)
    other_corpus = Corpus(train=corpus.train[:-1], held_out=corpus.held_out)
    others = {
        basecache.cache_key(TINY.model_copy(update={"n_embd": 64}), 30, 0, corpus),
        basecache.cache_key(TINY, 31, 0, corpus),
        basecache.cache_key(TINY, 30, 1, corpus),
        basecache.cache_key(TINY, 30, 0, other_corpus),
    }
    assert key == basecache.cache_key(TINY, 30, 0, corpus)
    assert key not in others and len(others) == 4


@pytest.mark.parametrize("damage", ["garbage", "truncated", "flipped_byte", "other_key"])
def test_corrupt_cache_is_rejected_and_rebuilt(corpus: Corpus, tmp_path: Path, damage: str) -> None:
    first = basecache.load_or_train(TINY, 10, tmp_path, corpus=corpus)
    raw = first.path.read_bytes()
    if damage == "garbage":
        first.path.write_bytes(b"not a safetensors file")
    elif damage == "truncated":
        first.path.write_bytes(raw[: len(raw) // 2])
    elif damage == "flipped_byte":
        first.path.write_bytes(raw[:-100] + bytes([raw[-100] ^ 0x01]) + raw[-99:])  # inside the tensor data
    else:
        other = basecache.load_or_train(TINY, 11, tmp_path, corpus=corpus)
        first.path.write_bytes(other.path.read_bytes())
    rebuilt = basecache.load_or_train(TINY, 10, tmp_path, corpus=corpus)
    assert not rebuilt.from_cache
    assert state_hash(unique_state(rebuilt.model)) == state_hash(unique_state(first.model))  # deterministic
    assert basecache.load_or_train(TINY, 10, tmp_path, corpus=corpus).from_cache


def test_default_cache_dir_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PULSE_CACHE_DIR", str(tmp_path))
    assert basecache.default_cache_dir() == tmp_path
    monkeypatch.delenv("PULSE_CACHE_DIR")
    assert basecache.default_cache_dir() == Path.home() / ".cache" / "pulse"


# --- traces -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_base(corpus: Corpus, tmp_path_factory: pytest.TempPathFactory) -> basecache.CachedBase:
    return basecache.load_or_train(TINY, 20, tmp_path_factory.mktemp("cache"), corpus=corpus)


def test_trace_files_round_trip_through_load_trace(
    corpus: Corpus, tiny_base: basecache.CachedBase, tmp_path: Path
) -> None:
    base_hash = state_hash(unique_state(tiny_base.model))
    written = trace.make_trace(tmp_path, tiny_base, corpus, 1e-3, 5)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [f"step_{i:04d}.safetensors" for i in range(6)] + ["trace.json"]
    manifest = json.loads((tmp_path / "trace.json").read_text())
    assert manifest["lr"] == 1e-3 and manifest["steps"] == 5 and manifest["base_cache_key"] == tiny_base.key
    assert manifest["model"] == TINY.model_dump()
    loaded = trace.load_trace(tmp_path)
    assert [state_hash(s) for s in loaded] == [state_hash(s) for s in written.states]
    assert loaded[0].keys() == bf16_state(tiny_base.model).keys()
    assert state_hash(loaded[0]) == state_hash(bf16_state(tiny_base.model))  # starts at the base
    assert state_hash(loaded[-1]) == state_hash(bf16_state(written.model))
    assert state_hash(loaded[0]) != state_hash(loaded[-1])  # lr 1e-3 moves BF16 weights
    assert state_hash(unique_state(tiny_base.model)) == base_hash  # the trace trained a copy


def test_shorter_trace_replaces_a_longer_one(corpus: Corpus, tiny_base: basecache.CachedBase, tmp_path: Path) -> None:
    trace.make_trace(tmp_path, tiny_base, corpus, 1e-3, 5)
    trace.make_trace(tmp_path, tiny_base, corpus, 1e-3, 2)
    assert len(trace.load_trace(tmp_path)) == 3
    assert not (tmp_path / "step_0003.safetensors").exists()


def test_damaged_trace_file_is_refused(corpus: Corpus, tiny_base: basecache.CachedBase, tmp_path: Path) -> None:
    trace.make_trace(tmp_path, tiny_base, corpus, 1e-3, 2)
    other = tmp_path / "other"
    trace.make_trace(other, tiny_base, corpus, 2e-3, 2)
    (tmp_path / "step_0002.safetensors").write_bytes((other / "step_0002.safetensors").read_bytes())
    with pytest.raises(ValueError, match="SHA-256"):
        trace.load_trace(tmp_path)


def test_unchanged_fraction_counts_bit_changes() -> None:
    zeros = torch.zeros(4, dtype=torch.bfloat16)
    states = [
        {"a": zeros.clone(), "b": zeros[:2].clone()},
        {"a": torch.tensor([1.0, 0, 0, 0], dtype=torch.bfloat16), "b": zeros[:2].clone()},
        {"a": torch.tensor([1.0, 0, 0, 0], dtype=torch.bfloat16), "b": torch.tensor([-0.0, 0], dtype=torch.bfloat16)},
    ]
    assert trace.unchanged_fraction(states, 1) == pytest.approx((5 / 6 + 5 / 6) / 2)  # -0.0 is a change
    assert trace.unchanged_fraction(states, 2) == pytest.approx(4 / 6)
    assert trace.unchanged_fraction(states, 3) is None


def test_bench_sweep_reports_every_lr_and_delay(
    corpus: Corpus, tiny_base: basecache.CachedBase, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(trace, "stdlib_corpus", lambda: corpus)
    monkeypatch.setattr(trace, "load_or_train", lambda *_a, **_k: tiny_base)
    options = trace.Options(out=tmp_path / "t", lr=2e-6, steps=33)
    summary = json.loads(json.dumps(trace.run(options).summary))
    assert set(summary["unchanged"]) == {"1e-06", "2e-06", "3e-06", "1e-05", "0.0001"}
    for row in summary["unchanged"].values():
        assert set(row) == {"1", "8", "32"} and all(0.0 <= v <= 1.0 for v in row.values())
    assert summary["unchanged"]["1e-06"]["1"] >= summary["unchanged"]["0.0001"]["1"]
    assert summary["unchanged"]["1e-06"]["1"] >= summary["unchanged"]["1e-06"]["32"]
    assert len(trace.load_trace(tmp_path / "t")) == 34
    assert json.loads((tmp_path / "t" / "trace.json").read_text())["lr"] == 2e-6


def test_bf16_master_drops_sub_ulp_updates(corpus: Corpus, tiny_base: basecache.CachedBase) -> None:
    """A BF16 master loses updates below half an ulp; an FP32 master accumulates them until a BF16 flip."""
    bf16 = trace.run_lr(tiny_base, corpus, 1e-6, 8, master="bf16")
    fp32 = trace.run_lr(tiny_base, corpus, 1e-6, 8, master="fp32")
    assert bf16.model.wte.weight.dtype == torch.bfloat16
    bf16_k1, bf16_k8 = trace.unchanged_fraction(bf16.states, 1), trace.unchanged_fraction(bf16.states, 8)
    fp32_k1, fp32_k8 = trace.unchanged_fraction(fp32.states, 1), trace.unchanged_fraction(fp32.states, 8)
    assert bf16_k1 is not None and bf16_k8 is not None and fp32_k1 is not None and fp32_k8 is not None
    assert bf16_k8 > fp32_k8
    assert bf16_k1 - bf16_k8 < fp32_k1 - fp32_k8  # the delay costs an FP32 master more sparsity
