"""`pulse doctor --device`: real inner steps on the device at the run's batch, peak memory, and the
machine's GPU memory, host RAM and disk against what the run needs (on the CPU here; CUDA alike)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from node.commands.cli import main
from node.roles.forecast import fit_advice
from node.roles.machinefit import Machine, needs, probe_machine
from node.run.manifest import load_manifest
from node.run.presets import preset
from node.run.setup import RunSetup
from node.run.task import task_for


@pytest.fixture(scope="module")
def machine(tmp_path_factory: pytest.TempPathFactory) -> Machine:
    torch.set_num_threads(1)
    setup = RunSetup.from_manifest(load_manifest(preset("tiny")))
    return probe_machine(setup, task_for(setup), device="cpu", steps=2, folder=tmp_path_factory.mktemp("state"))


def test_the_probe_trains_the_run_here_and_measures_it(machine: Machine) -> None:
    setup = RunSetup.from_manifest(load_manifest(preset("tiny")))
    assert machine.device == "cpu" and machine.steps == 2 and machine.step_seconds > 0
    assert machine.device_peak_bytes is None and machine.device_total_bytes is None  # no card to measure
    assert machine.params == setup.parameter_count() and machine.payload_bytes > 0
    assert machine.host_peak_bytes > 2 * machine.params  # at least the BF16 weights it trained from
    assert machine.data_digest == setup.corpus.digest() and not machine.data_pinned
    assert machine.train_tokens == len(setup.corpus.train)


def test_needs_compare_memory_and_disk_with_what_the_machine_has(machine: Machine) -> None:
    by_what = {need.what: need for need in needs(machine)}
    assert set(by_what) == {"host RAM", "disk"}  # GPU memory only on CUDA
    assert by_what["host RAM"].measured and by_what["host RAM"].needed == machine.host_peak_bytes
    assert by_what["disk"].fits is True  # a 0.5M-parameter run fits any disk the tests run on
    on_card = dataclasses.replace(machine, device_peak_bytes=30 * 2**30, device_total_bytes=24 * 2**30)
    gpu = next(n for n in needs(on_card) if n.what == "GPU memory")
    assert gpu.fits is False and gpu.available == int(24 * 2**30 * 0.95)
    manifest = load_manifest(preset("tiny"))
    advice = fit_advice(on_card, manifest)
    assert any(line.startswith("GPU memory: the steps' peak here was 30.0 GiB") for line in advice)
    assert any(f'digest = "{machine.data_digest}"' in line for line in advice)  # how to pin the data


def test_pulse_doctor_local_on_the_cpu(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code = main(["doctor", "--local", "--device", "cpu", "--steps", "1", "--json", "--state-dir", str(tmp_path)])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["machine"]["device"] == "cpu" and report["machine"]["step_seconds"] > 0
    assert any("data.digest is not set" in line for line in report["advice"])


def test_pulse_doctor_cuda_without_cuda_says_what_to_run(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", None)
    assert main(["doctor", "--local", "--device", "cuda"]) == 2
    assert "`make cuda`" in capsys.readouterr().err
