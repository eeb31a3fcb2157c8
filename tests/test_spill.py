"""The validator's spill of decoded updates: exact round trip, a bounded budget, nothing left after close."""

from __future__ import annotations

from pathlib import Path

import torch

from validator.spill import DecodedSpill


def test_updates_come_back_exactly_within_the_budget_and_close_removes_them(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(0)
    update = {
        "b.odd": torch.randn(7, generator=g).bfloat16(),  # odd byte count: the next tensor stays aligned
        "a.matrix": torch.randn(5, 3, generator=g),
        "c.empty": torch.zeros(0),
    }
    other = {name: t * 2 for name, t in update.items()}
    with DecodedSpill(tmp_path / "spill", 2 * 4096) as spill:
        assert spill.put("one", update) and spill.put("one", update)  # a second put is a no-op
        assert spill.get("two") is None
        back = spill.get("one")
        assert back is not None and back.keys() == update.keys()
        assert all(back[n].dtype == t.dtype and torch.equal(back[n], t) for n, t in update.items())
        back["a.matrix"].add_(1)  # copy-on-write: the file, and the next read, are unchanged
        again = spill.get("one")
        assert again is not None and torch.equal(again["a.matrix"], update["a.matrix"])
        assert spill.put("two", other) and not spill.put("three", {"big": torch.zeros(4096)})
        assert spill.get("three") is None
        assert len(list(tmp_path.rglob("*.bin"))) == 2
    assert not (tmp_path / "spill").exists() and spill.get("one") is None


def test_no_folder_or_no_budget_spills_nothing(tmp_path: Path) -> None:
    update = {"w": torch.ones(3)}
    assert not DecodedSpill(None, 2**20).put("k", update)
    assert not DecodedSpill(tmp_path, 0).put("k", update) and not list(tmp_path.iterdir())
