"""Does the run fit this machine? Real inner steps of the run's model, timed on the device, and what
they took, against what the machine has. The first half of `pulse doctor`; needs no network.

    machine = probe_machine(setup, task, device="cuda", steps=3, folder=state_dir)
    machine.step_seconds, machine.device_peak_bytes, machine.host_peak_bytes
    fit = needs(machine)               # each resource: needed, available, fits

What is measured, on the device the miner will use (`--device`):

- two rounds of `steps` inner steps of the run's model at the run's batch (`data.batch_size` x
  `data.seq_len`) and memory options (the miner's own `Trainer`), from W_0; the first round warms
  the allocator and kernels and is not timed; the second is, and its device memory peak is read
  (CUDA: the caching allocator's reserved peak, what the card must hold);
- the pseudo-gradient those steps give, compressed with the run's codec (payload bytes, seconds);
- the process's peak resident memory after it all: the model (on a CPU), W_r in BF16, the FP32
  delta and error-feedback buffer, the codec's working memory, the memory-mapped data it touched;
- the run's data: its token cache (built now if missing), token counts and digest;
- free disk where the node would keep its state, GPU memory and host RAM in total and available.

What the run needs, from those figures: the device peak (on CUDA) against the card's memory;
the host peak against available RAM; on disk two BF16 states (the live one and a checkpoint) and a
few patches (the token cache is built before the free disk is read).
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from node.events import peak_rss_mb
from node.run.setup import RunSetup
from node.run.task import Task
from protocol.identity import Identity

DEVICE_HEADROOM = 0.95  # of the card's memory a run may plan on (the driver and context take the rest)
PATCHES_KEPT = 4  # patches a node keeps beside its two states, each at most one BF16 state (a bound)


@dataclass
class Machine:
    device: str
    device_name: str
    steps: int  # timed inner steps
    step_seconds: float
    device_peak_bytes: int | None  # CUDA: reserved peak over the timed steps; None on a CPU
    device_total_bytes: int | None
    host_peak_bytes: int  # this process's peak resident memory after the steps and the compression
    host_available_bytes: int | None
    host_total_bytes: int | None
    disk_free_bytes: int
    payload_bytes: int
    compress_seconds: float
    params: int
    train_tokens: int
    held_out_tokens: int
    data_digest: str
    data_pinned: bool  # the manifest names `data.digest` (and these tokens matched it)


@dataclass(frozen=True)
class Need:
    what: str
    needed: int
    available: int | None
    measured: bool  # needed is a measurement here (else a bound from the run's sizes)

    @property
    def fits(self) -> bool | None:
        return None if self.available is None else self.needed <= self.available


def probe_machine(setup: RunSetup, task: Task, *, device: str, steps: int, folder: Path) -> Machine:
    """Train, time and measure here (see the module docstring); `folder` is where state would go."""
    corpus = setup.corpus  # the token cache built or opened first: its time is not a step's
    with contextlib.suppress(OSError):  # nor its memory: the resident peak restarts here (Linux)
        Path("/proc/self/clear_refs").write_text("5")
    dev = torch.device(device)
    weights = {name: t.to(torch.bfloat16) for name, t in task.initial_master().items()}
    trainer = task.trainer(Identity.generate(), device)
    trainer.spec = dataclasses.replace(trainer.spec, steps=steps)
    trainer.train(0, weights)  # warm-up: the allocator, the kernels, autotuning
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
    start = time.monotonic()
    delta = trainer.train(1, weights)  # ends with the delta copied to the host: the device is done
    step = (time.monotonic() - start) / steps
    device_peak = torch.cuda.max_memory_reserved(dev) if dev.type == "cuda" else None
    start = time.monotonic()
    payload = trainer.compress(delta, weights, handover=True)  # as a miner does: freed tensor by tensor
    compress = time.monotonic() - start
    memory = _meminfo()
    return Machine(
        device=device,
        device_name=torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        steps=steps,
        step_seconds=step,
        device_peak_bytes=device_peak,
        device_total_bytes=torch.cuda.get_device_properties(dev).total_memory if dev.type == "cuda" else None,
        host_peak_bytes=int(peak_rss_mb() * 2**20),
        host_available_bytes=memory.get("MemAvailable"),
        host_total_bytes=memory.get("MemTotal"),
        disk_free_bytes=shutil.disk_usage(folder).free,
        payload_bytes=len(payload),
        compress_seconds=compress,
        params=sum(t.numel() for t in weights.values()),
        train_tokens=len(corpus.train),
        held_out_tokens=len(corpus.held_out),
        data_digest=corpus.digest(),
        data_pinned=setup.manifest.data.digest is not None,
    )


def needs(machine: Machine) -> list[Need]:
    """GPU memory (on CUDA), host RAM and disk: what a miner of this run needs here, and what there is."""
    state = 2 * machine.params  # one BF16 state
    out = []
    if machine.device_peak_bytes is not None and machine.device_total_bytes is not None:
        usable = int(machine.device_total_bytes * DEVICE_HEADROOM)
        out.append(Need("GPU memory", machine.device_peak_bytes, usable, measured=True))
    out.append(Need("host RAM", machine.host_peak_bytes, machine.host_available_bytes, measured=True))
    disk = (2 + PATCHES_KEPT) * state
    out.append(Need("disk", disk, machine.disk_free_bytes, measured=False))
    return out


def _meminfo() -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("MemAvailable", "MemTotal"):
                out[key] = int(value.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return out
