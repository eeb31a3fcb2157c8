"""Copy sketches compared by one merge pass: the same overlap and cosine as set intersection, and
the same copy groups as comparing every pair, at a fraction of the cost."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from validator.scoring import Sketch, copy_groups


def intersected(a: Sketch, b: Sketch) -> tuple[float, float]:
    """Overlap and cosine the plain way: numpy's set intersection."""
    smaller = min(len(a.positions), len(b.positions))
    if smaller == 0:
        return 0.0, 0.0
    _, mine, theirs = np.intersect1d(a.positions, b.positions, assume_unique=True, return_indices=True)
    norms = float(np.linalg.norm(a.values)) * float(np.linalg.norm(b.values))
    return len(mine) / smaller, float(a.values[mine] @ b.values[theirs]) / norms if norms > 0 else 0.0


def sketch(rng: np.random.Generator, n: int, density: float) -> Sketch:
    positions = np.flatnonzero(rng.random(n) < density).astype(np.int64)
    return Sketch(positions, rng.standard_normal(len(positions)))


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31), n=st.integers(0, 400), da=st.floats(0, 1), db=st.floats(0, 1))
def test_merge_gives_what_intersection_gives(seed: int, n: int, da: float, db: float) -> None:
    rng = np.random.default_rng(seed)
    a, b = sketch(rng, n, da), sketch(rng, n, db)
    for x, y in ((a, b), (b, a), (a, a)):
        overlap, cosine = x.compare(y)
        want_overlap, want_cosine = intersected(x, y)
        assert overlap == want_overlap and (x.overlap(y), x.cosine(y)) == (overlap, cosine)
        assert cosine == pytest.approx(want_cosine, rel=1e-12, abs=1e-15)


def test_copy_groups_match_every_pair_compared() -> None:
    """Near copies (a rescaled update with a few values changed) and exact copies (the same payload
    hash, re-signed) group as when every pair is compared; unrelated updates stay alone."""
    rng = np.random.default_rng(7)
    base = [sketch(rng, 5000, 0.3) for _ in range(4)]
    near = Sketch(base[1].positions, base[1].values * 1.5 + rng.standard_normal(len(base[1].values)) * 0.01)
    items = [
        ("a", base[0]),
        ("b", base[1]),
        ("c", base[2]),
        ("a", base[0]),
        ("n", near),
        ("d", base[3]),
        ("c", base[2]),
    ]
    got = copy_groups(items, 0.5, 0.9)
    parent = list(range(len(items)))  # every pair, the way the groups are defined

    def root(i: int) -> int:
        return i if parent[i] == i else root(parent[i])

    for j in range(len(items)):
        for i in range(j):
            o, c = intersected(items[i][1], items[j][1])
            if items[i][0] == items[j][0] or (o >= 0.5 and c >= 0.9):
                parent[root(j)] = root(i)
    want: dict[int, list[int]] = {}
    for i in range(len(items)):
        want.setdefault(root(i), []).append(i)
    assert sorted(got) == sorted(g for g in want.values() if len(g) > 1) == [[0, 3], [1, 4], [2, 6]]
