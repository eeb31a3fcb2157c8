"""Codec kernels loaded before a node needs them (`protocol/warmup.py`)."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap

import pytest
import torch

from protocol.codec import make_codec
from protocol.warmup import warm_up_in_background

# a fresh interpreter: in this one every kernel has long been compiled by other tests
_FRESH = textwrap.dedent(
    """
    from protocol import syncpass
    from protocol.codec import make_codec
    from protocol.warmup import warm_up_in_background

    kernels = [syncpass.start_walk, syncpass.walk]  # the decoder a join's first patch runs
    before = [len(k.signatures) for k in kernels]
    warm_up_in_background([make_codec("sparseloco")]).join()
    print(before, [len(k.signatures) for k in kernels])
    """
)


def test_a_background_warm_up_loads_the_decoder_a_join_runs_first() -> None:
    out = subprocess.run([sys.executable, "-c", _FRESH], capture_output=True, text=True, check=True, timeout=300)
    assert out.stdout.split("\n")[0] == "[0, 0] [1, 1]"


class _Broken:
    """A codec that cannot compress: its error belongs to the round that uses it, not the node's start."""

    def compress(self, *_: object) -> object:
        raise RuntimeError("no kernel for this")

    def decompress(self, *_: object) -> object:
        raise AssertionError("never reached")


def test_a_failed_warm_up_is_logged_and_leaves_the_node_running(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="protocol.warmup")
    thread = warm_up_in_background([make_codec("sparseloco"), _Broken()], (torch.bfloat16,))  # type: ignore[list-item]
    thread.join(timeout=120)
    assert not thread.is_alive() and thread.daemon
    failures = [r for r in caplog.records if "warming the codec kernels failed" in r.getMessage()]
    assert len(failures) == 1 and failures[0].exc_info is not None
    assert "no kernel for this" in str(failures[0].exc_info[1])
