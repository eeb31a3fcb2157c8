"""The torch that matches the card: the Makefile installs the build asked for; a missing CUDA names the command."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """The Makefile beside the two pyprojects, with a venv whose python only logs what pip was asked."""
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "tests" / "redteam").mkdir(parents=True)  # the red team's package, installed beside
    (tmp_path / "tests" / "redteam" / "pyproject.toml").write_text("")
    python = tmp_path / "v" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\necho "$*" >> {tmp_path / "log"}\n')
    python.chmod(0o755)
    return tmp_path


def _make(tree: Path, *args: str) -> list[str]:
    """What pip was asked to install by `make install ARGS` (its torch lines)."""
    log = tree / "log"
    log.write_text("")
    subprocess.run(["make", "-s", *args, "VENV=v", "PYTHON=false"], cwd=tree, check=True, timeout=60)
    return [line for line in log.read_text().splitlines() if "torch" in line]


def test_torch_follows_the_build_asked_for(tree: Path) -> None:
    (first,) = _make(tree, "install")
    assert "--index-url https://download.pytorch.org/whl/cpu" in first
    assert _make(tree, "install") == []  # installed: nothing to do
    (cuda,) = _make(tree, "install", "GPU=cu128")  # after a CPU install, the CUDA build replaces it
    assert "--force-reinstall" in cuda and "whl/cu128" in cuda
    assert _make(tree, "install") == []  # a plain make keeps the CUDA build
    (index,) = _make(tree, "install", "TORCH_INDEX=https://download.pytorch.org/whl/cpu")
    assert "whl/cpu" in index
    (word,) = _make(tree, "cuda")  # the one-word way
    assert "whl/cu128" in word


def test_no_cuda_prints_the_command_to_run(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from node.commands.roles import no_cuda

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", None)
    assert no_cuda("cpu") is None
    message = no_cuda("cuda") or ""
    assert "`make cuda`" in message and "--index-url https://download.pytorch.org/whl/cu128" in message
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    assert "nvidia-smi" in (no_cuda("cuda") or "")
