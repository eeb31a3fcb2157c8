"""The norms, the aggregate and the outer step give the same bytes whatever the thread count.

An auditor recomputes the validator's step on its own machine (`validator/audit.py`), so the step
must not depend on how torch splits work over threads. Each case runs in fresh processes with 1
and with 2 torch threads (`torch.set_num_threads`), on tensors large enough that torch does split
elementwise work (its grain is 32768 elements) and of odd sizes, so chunk boundaries and vector
tails fall in different places.
"""

from __future__ import annotations

import subprocess
import sys

SCRIPT = r"""
import hashlib, sys
import torch
torch.set_num_threads(int(sys.argv[1]))
from protocol.statehash import state_hash
from validator.aggregate import aggregate, global_norm
from validator.outer import OuterConfig, OuterOptimizer

gen = torch.Generator().manual_seed(7)
shapes = {"a": (300_007,), "b": (517, 263), "c": (65_537 * 3 + 5,)}
master = {n: torch.randn(s, generator=gen) * 0.02 for n, s in shapes.items()}
updates = [{n: torch.randn(s, generator=gen) * (0.001 * (i + 1)) for n, s in shapes.items()} for i in range(5)]
for u in updates[:2]:  # sparse ones too, as SparseLoCo's
    for t in u.values():
        t[torch.rand(t.shape, generator=gen) > 0.05] = 0
table = {str(i).encode(): u for i, u in enumerate(updates)}
norms = [global_norm(u) for u in updates]
for momentum, nesterov in CASES:
    outer = OuterOptimizer(OuterConfig(lr=0.7, momentum=momentum, nesterov=nesterov), master)
    for _ in range(3):
        result = aggregate(list(table), table.__getitem__, norms=norms)
        outer.step(result.update)
    print(state_hash(result.update), state_hash(outer.fp32_state()), ",".join(n.hex() for n in norms))
"""
CASES = [(0.0, False), (0.9, True), (0.9, False)]  # plain SGD, Nesterov momentum, heavy-ball momentum


def start(threads: int) -> subprocess.Popen[str]:
    """A process printing (aggregate hash, FP32 state hash after three steps) per case, on `threads` torch threads."""
    command = [sys.executable, "-c", f"CASES = {CASES!r}\n" + SCRIPT, str(threads)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def hashes(proc: subprocess.Popen[str]) -> list[list[str]]:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-2000:]
    return [line.split() for line in out.strip().splitlines()]


def test_norms_aggregate_and_outer_step_are_the_same_bytes_on_1_and_2_threads() -> None:
    procs = [start(1), start(2)]  # side by side: the two share nothing but the machine
    one, two = (hashes(p) for p in procs)
    assert len(one) == len(two) == len(CASES)
    for case, a, b in zip(CASES, one, two, strict=True):
        assert a[0] == b[0], f"momentum {case}: the aggregate differs between 1 and 2 threads"
        assert a[1] == b[1], f"momentum {case}: the FP32 state after the outer steps differs between 1 and 2 threads"
        assert a[2] == b[2], "the norms differ between 1 and 2 threads"
