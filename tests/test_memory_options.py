"""The inner loop's memory options: checkpointing is exact, BF16 moments track AdamW at half the
state, the chunked large-vocabulary loss equals the plain one."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from node.learn import train
from node.learn.data import Corpus, stdlib_corpus
from node.learn.model import GPTConfig, build_gpt
from node.learn.train import (
    InnerOptimConfig,
    MemoryConfig,
    apply_memory,
    bf16_state,
    corpus_batches,
    derive_seed,
    evaluate,
    inner_train,
    make_optimizer,
    pseudo_gradient,
    unique_state,
)
from node.run.manifest import load_manifest, parse_manifest
from node.run.presets import configs_dir
from protocol.errors import ConfigError

TINY = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=32)
OPT = InnerOptimConfig(lr=3e-3)


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    return stdlib_corpus(4 * 2**20)


def _losses(corpus: Corpus, memory: MemoryConfig, steps: int = 8) -> tuple[list[float], torch.optim.Optimizer]:
    model = build_gpt(TINY)
    apply_memory(model, memory)
    opt = make_optimizer(model, OPT, memory)
    return inner_train(model, OPT, corpus_batches(corpus, 1, 4, 32), steps, optimizer=opt), opt


def test_activation_checkpointing_gives_the_same_losses(corpus: Corpus) -> None:
    plain, _ = _losses(corpus, MemoryConfig())
    checkpointed, _ = _losses(corpus, MemoryConfig(checkpointing=True))
    assert checkpointed == plain


def test_bf16_moments_track_adamw_with_half_the_state(corpus: Corpus) -> None:
    plain, opt32 = _losses(corpus, MemoryConfig(), steps=16)
    light, opt16 = _losses(corpus, MemoryConfig(moments="bf16"), steps=16)
    assert light[-1] < light[0] - 0.3  # it trains
    assert abs(light[-1] - plain[-1]) < 0.02 * plain[-1]
    state_bytes = lambda opt: sum(  # noqa: E731
        t.nbytes for s in opt.state.values() for t in s.values() if isinstance(t, torch.Tensor) and t.dim() > 0
    )
    assert state_bytes(opt16) * 2 == state_bytes(opt32)


def test_bf16_moments_refuse_betas_whose_updates_round_away() -> None:
    with pytest.raises(ValueError, match="betas"):
        make_optimizer(build_gpt(TINY), InnerOptimConfig(lr=1e-3, beta2=0.999), MemoryConfig(moments="bf16"))
    with pytest.raises(ConfigError, match="betas"):
        parse_manifest({"name": "x", "train": {"inner": {"lr": 1e-3, "beta2": 0.999}, "memory": {"moments": "bf16"}}})


def test_the_chunked_loss_equals_the_plain_loss_and_its_gradients() -> None:
    pytest.importorskip("transformers")
    from node.learn.hfmodel import build_hf_from_config
    from tests.models import TINY_QWEN

    model = build_hf_from_config(TINY_QWEN, seed=0)
    model.loss_chunk = 7  # 3 x 16 tokens: chunks that do not divide the batch
    x = torch.randint(0, 300, (3, 16), generator=torch.Generator().manual_seed(1))
    y = torch.roll(x, -1, dims=1)
    chunked = model.loss(x, y)
    chunked.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    logits = model(x)
    plain = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
    plain.backward()
    assert torch.allclose(chunked, plain, rtol=1e-5)
    assert all(torch.allclose(g, p.grad, rtol=1e-4, atol=1e-7) for g, p in zip(grads, model.parameters(), strict=True))


def test_the_pseudo_gradient_is_computed_in_fp32_chunk_by_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    model = build_gpt(TINY)
    weights = bf16_state(model)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 1e-3)
    local = unique_state(model)
    whole = {n: w.float() - local[n].detach().float() for n, w in weights.items()}
    monkeypatch.setattr(train, "DELTA_CHUNK", 100)  # chunks that do not divide the tensors
    fp32, bf16 = pseudo_gradient(weights, model), pseudo_gradient(weights, model, torch.bfloat16)
    assert all(torch.equal(fp32[n], whole[n]) for n in weights)  # bit for bit the whole-tensor subtraction
    assert all(bf16[n].dtype == torch.bfloat16 and torch.equal(bf16[n], whole[n].to(torch.bfloat16)) for n in weights)


def test_a_bf16_pseudo_gradient_trains_as_the_fp32_one() -> None:
    """A few PULSELoCo rounds of 2 miners on the embedded GPT: the loss falls as far with the
    pseudo-gradient stored in BF16 (the codec's values are BF16 or coarser; error feedback keeps the rest)."""
    from node.bench import memory as bench

    options = bench.Options(replicas=2, rounds=4, inner_steps=4, batch_size=4, n_layer=2, n_embd=32)
    home = load_manifest(configs_dir() / "qwen2.5-0.5b-home-gpu.toml")
    cfg = GPTConfig(n_layer=2, n_head=2, n_embd=32)
    corpus = stdlib_corpus(4 * 2**20)
    held = [corpus.batch(derive_seed("held", i), 8, cfg.block_size, "held_out") for i in range(4)]
    init = {n: t.detach().float() for n, t in unique_state(build_gpt(cfg)).items()}
    start = evaluate(build_gpt(cfg), held)
    shared = bench.manifest(home, cfg, options, MemoryConfig(), False).run_id
    final = {
        kind: bench.run_variant(
            bench.manifest(home, cfg, options, MemoryConfig(pseudo_gradient=kind), False), shared, init, options, held
        ).final_loss
        for kind in ("fp32", "bf16")
    }
    assert final["bf16"] < start - 0.5  # it learns
    assert abs(final["bf16"] - final["fp32"]) < 0.01 * final["fp32"], final
