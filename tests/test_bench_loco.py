"""`pulse bench loco` end to end on a tiny GPT: every method trains, the JSON has the documented shape."""

from __future__ import annotations

import argparse

from node.bench import loco


def test_tiny_pretrain_run() -> None:
    parser = argparse.ArgumentParser()
    loco.configure(parser)
    args = parser.parse_args(
        [
            *["--regime", "pretrain", "--replicas", "2", "--rounds", "2", "--inner-steps", "2", "--batch-size", "2"],
            *["--n-layer", "1", "--n-embd", "64", "--methods", "ddp,diloco,sparseloco,pulseloco"],
        ]
    )
    result = loco.run(args)
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
