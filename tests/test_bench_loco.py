"""`pulse bench loco` end to end on a tiny GPT: every method trains, the JSON has the documented shape."""

from __future__ import annotations

import torch

from node.bench import loco, locospeed
from protocol.sparseloco import SparseLoCoCodec


def test_tiny_pretrain_run() -> None:
    options = loco.Options(
        regime="pretrain",
        replicas=2,
        rounds=2,
        inner_steps=2,
        batch_size=2,
        n_layer=1,
        n_embd=64,
        methods="ddp,diloco,sparseloco,pulseloco",
    )
    result = loco.run(options)
    rows = result.summary["pretrain"]
    assert set(rows) == {"ddp", "diloco", "sparseloco", "pulseloco"}
    for row in rows.values():
        assert set(row) == {"final_loss", "bytes_per_round", "bits_per_value"}
        assert 0 < row["final_loss"] < 6
    dense = rows["diloco"]["bytes_per_round"]  # one FP32 pseudo-gradient plus a small header
    assert 2 * dense - 64 < rows["ddp"]["bytes_per_round"] < 2 * dense  # H = 2 dense gradients
    assert rows["sparseloco"]["bits_per_value"] <= 10
    assert rows["sparseloco"]["bytes_per_round"] * 20 < rows["diloco"]["bytes_per_round"]
    assert len(result.tables) == 1


def test_speed_table_on_a_tiny_gpt() -> None:
    options = loco.Options(speed=True, speed_model="gpt", n_layer=1, n_embd=64, repeat=1)
    summary = loco.run(options).summary
    assert set(summary["codecs"]) == {"sparseloco", "pulseloco", "reference"}
    for row in summary["codecs"].values():
        assert row["compress_gbps"] > 0 and row["decompress_gbps"] > 0 and row["payload_bytes"] > 0
        assert row["compress_peak_extra_mb"] >= 0 and row["decompress_peak_extra_mb"] >= 0
    assert summary["sparseloco_vs_reference"] > 0
    assert isinstance(summary["sparseloco_no_slower_than_reference"], bool)
    # entropy coding of the same selection is smaller than its plain packing
    assert summary["codecs"]["sparseloco"]["payload_bytes"] < summary["codecs"]["reference"]["payload_bytes"]


def test_reference_encodes_sparselocos_own_selection() -> None:
    gen = torch.Generator().manual_seed(3)
    shapes = {"a.weight": (128, 192), "b.weight": (100, 50), "c.bias": (40,)}
    weights = {n: (torch.randn(s, generator=gen) * 0.02).bfloat16() for n, s in shapes.items()}
    delta = {n: torch.randn(s, generator=gen) * 1e-3 for n, s in shapes.items()}
    error = {n: torch.randn(s, generator=gen) * 1e-3 for n, s in shapes.items()}
    codec = SparseLoCoCodec()
    payload, ours_error, _ = codec.compress(delta, error, weights)
    ours = codec.decompress(payload, weights)
    ref_payload, ref_error = locospeed.reference_compress(delta, error)
    ref = locospeed.reference_decompress(ref_payload, weights)
    for name in shapes:
        assert torch.equal(ours[name] != 0, ref[name] != 0), name  # the same positions
        assert torch.allclose(ours[name], ref[name], rtol=1e-6, atol=0), name  # the same 2-bit values
        assert torch.allclose(ours_error[name], ref_error[name], rtol=1e-5, atol=1e-9), name
