"""The layering rules are import-linter contracts: the tree keeps them, a wrong-way import breaks them."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).with_name("lint-imports")
pytestmark = pytest.mark.skipif(not LINT.is_file(), reason="import-linter is not installed beside this Python")


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    env = {"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [str(LINT), "--config", str(root / "pyproject.toml"), "--no-cache"],
        cwd=root, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def _copy(tmp: Path) -> Path:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("protocol", "validator", "node", "tests"):
        shutil.copytree(REPO / name, tmp / name, ignore=ignore)
    shutil.copy(REPO / "pyproject.toml", tmp / "pyproject.toml")
    return tmp


def test_the_tree_keeps_its_contracts(tmp_path: Path) -> None:
    done = _lint(_copy(tmp_path))
    assert done.returncode == 0, done.stdout[-3000:]


@pytest.mark.parametrize(
    ("module", "line", "broken"),
    [
        ("node/net/peer.py", "import node.roles.miner", "node's floors import only floors below them"),
        ("node/learn/train.py", "import node.run.manifest", "node's floors import only floors below them"),
        ("node/run/setup.py", "import node.net.peer", "node's floors import only floors below them"),
        ("protocol/errors.py", "import validator.config", "protocol is pure"),
        ("validator/core.py", "import node.learn.model", "validator never imports node"),
        ("node/bench/sync.py", "import tests.conftest", "the library never imports the test tree"),
    ],
)
def test_a_wrong_way_import_fails(tmp_path: Path, module: str, line: str, broken: str) -> None:
    root = _copy(tmp_path)
    path = root / module
    path.write_text(path.read_text() + f"\n{line}  # wrong way\n")
    done = _lint(root)
    assert done.returncode != 0
    assert broken in done.stdout and "BROKEN" in done.stdout
