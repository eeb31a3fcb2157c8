"""What a new user meets first: key files, the run id, `pulse --help`.

- a miner or follower whose key is one of the run's validator keys warns (the README used to have
  every node sign with the default key file, so a miner on the validator's machine signed as the
  validator, silently);
- `pulse run-id --config` prints the manifest's run id (the README's one-liner needed the source
  tree on the path and crashed without the virtual environment);
- `pulse --help` imports neither torch nor any command module (it took seconds), and the help
  line of each command is the one its module registers.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import importlib
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from node.commands.cli import COMMANDS, main
from node.commands.status import nothing_found
from node.events import Events
from node.net.memory import MemoryNetwork
from node.net.peer import Role
from node.roles.records import run_records
from node.roles.status import read_status
from node.roles.tasks import follower_for, miner_for
from node.run.manifest import Manifest, load_manifest
from node.run.presets import preset
from node.run.setup import RunSetup
from node.run.task import task_for
from protocol.identity import Identity


def key(label: str) -> Identity:
    return Identity.from_seed(hashlib.sha256(f"pulse-test-newcomer/{label}".encode()).digest())


def small_manifest(validator: Identity) -> Manifest:
    return Manifest.model_validate(
        {
            "name": "newcomer",
            "validators": [validator.public_hex],
            "model": {"gpt": {"block_size": 32, "n_layer": 1, "n_head": 2, "n_embd": 32}},
            "data": {"batch_size": 4, "seq_len": 32},
            "train": {"inner_steps": 2},
            "selection": {"assignment_batches": 2, "held_out_batches": 1},
        }
    )


@pytest.mark.parametrize("role", ["miner", "follower"])
def test_a_node_signing_with_a_validator_key_warns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, role: Role
) -> None:
    validator = key("validator")
    manifest = small_manifest(validator)
    setup = RunSetup.from_manifest(manifest)
    task = task_for(setup)
    net = MemoryNetwork(run_records(manifest))
    build = miner_for if role == "miner" else follower_for
    with caplog.at_level(logging.WARNING):
        build(setup, task, key("own"), net.join(key("own"), tmp_path / "own", role=role), Events(role))
    assert not [r for r in caplog.records if "VALIDATOR" in r.getMessage()]  # its own key: no word
    with caplog.at_level(logging.WARNING):
        build(setup, task, validator, net.join(validator, tmp_path / "v", role=role), Events(role))
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("one of the run's VALIDATOR keys" in text and "--key" in text for text in warned), warned


def test_run_id_command(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["run-id", "--config", str(preset("tiny"))]) == 0
    assert capsys.readouterr().out.strip() == load_manifest(preset("tiny")).run_id
    assert main(["run-id", "--config", str(tmp_path / "missing.toml")]) == 2
    assert "missing.toml" in capsys.readouterr().err


def test_help_imports_no_command_module() -> None:
    probe = (
        "import sys\n"
        "from node.commands.cli import build_parser\n"
        "text = build_parser().format_help()\n"
        "heavy = sorted(m for m in sys.modules if m in ('torch', 'hivemind') or m.startswith('node.commands.')"
        " and m != 'node.commands.cli')\n"
        "print(heavy, 'bench' in text and 'run-id' in text)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "[] True", done.stdout


def test_each_commands_help_is_the_one_its_module_registers() -> None:
    parser = argparse.ArgumentParser()
    subparsers = parser.add_subparsers()
    for module in dict.fromkeys(module for module, _ in COMMANDS.values()):
        importlib.import_module(module).register(subparsers)
    registered = {action.dest: action.help for action in subparsers._choices_actions}
    assert registered == {name: text for name, (_, text) in COMMANDS.items()}


def test_status_of_a_run_with_nothing_found_says_why(tmp_path: Path) -> None:
    """`pulse status` with no peer used to print "round 0 is the open round" and exit 0."""
    manifest = small_manifest(key("validator"))
    net = MemoryNetwork(run_records(manifest))
    status = asyncio.run(read_status(net.join(key("reader"), tmp_path / "r", role="follower")))
    assert not status.found
    assert "is your manifest the validator's" in nothing_found(manifest.run_id, True, True)
    assert "no --initial-peers" in nothing_found(manifest.run_id, True, False)
    assert "names no validator" in nothing_found(manifest.run_id, False, True)
