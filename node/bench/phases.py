"""Seconds and peak memory of named phases of a benchmark, nested, on the CPU or on CUDA.

    rec = PhaseRecorder(torch.device("cuda"))
    with rec.phase("miner.train"):
        ...
    rec.stats["miner.train"].seconds, .host_peak_mb, .host_start_mb, .device_peak_mb

Host memory is the process's resident set. Its peak (VmHWM) is reset by writing "5" to
/proc/self/clear_refs, so each phase reads its own peak; a nested phase hands its peak up to the
phase around it. Device memory on CUDA: `torch.cuda.max_memory_allocated`, reset the same way.
Peaks are of the whole process; a role's own memory is its peak minus what was resident when it
started (`host_start_mb`). Where clear_refs is not available the host peak is process-wide.

`timed_methods` times library functions (for example the steps `Validator.run_round` calls) as
phases while a block runs, without changing what they do: the benchmark measures the real code.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from node.events import peak_rss_mb

MB = 2**20
_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def resident_mb() -> float:
    """Resident memory of this process now (VmRSS), MiB; 0 where /proc is not there."""
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def reset_peak() -> bool:
    """Reset the resident peak to the current resident size; False where the kernel offers no way."""
    try:
        _CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return True


def release_memory() -> None:
    """Collect garbage and hand freed heap pages back to the OS (glibc), so resident sizes mean what is alive."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


@dataclass
class PhaseStats:
    name: str
    calls: int = 0
    seconds: float = 0.0  # wall seconds, summed over calls
    cpu_seconds: float = 0.0  # this process's CPU seconds (all threads): what a busy machine does not inflate
    host_start_mb: float = math.inf  # resident when the phase (first) began
    host_peak_mb: float = 0.0  # highest resident size during any call
    device_start_mb: float = math.inf
    device_peak_mb: float = 0.0

    @property
    def host_extra_mb(self) -> float:
        return max(self.host_peak_mb - self.host_start_mb, 0.0)

    @property
    def device_extra_mb(self) -> float:
        return max(self.device_peak_mb - self.device_start_mb, 0.0) if self.device_peak_mb else 0.0


class PhaseRecorder:
    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.stats: dict[str, PhaseStats] = {}
        self._open: list[list[float]] = []  # per open phase: [host peak so far, device peak so far]
        self.resettable = reset_peak()

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self._fold()  # the enclosing phase keeps its peak so far; the counters restart for this one
        stats = self.stats.setdefault(name, PhaseStats(name))
        stats.host_start_mb = min(stats.host_start_mb, resident_mb())
        stats.device_start_mb = min(stats.device_start_mb, self._device_now())
        self._open.append([0.0, 0.0])
        start, cpu_start = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            if self.cuda:
                torch.cuda.synchronize()
            stats.seconds += time.perf_counter() - start
            stats.cpu_seconds += time.process_time() - cpu_start
            stats.calls += 1
            self._fold()
            host, device = self._open.pop()
            stats.host_peak_mb = max(stats.host_peak_mb, host)
            stats.device_peak_mb = max(stats.device_peak_mb, device)
            if self._open:
                self._open[-1][0] = max(self._open[-1][0], host)
                self._open[-1][1] = max(self._open[-1][1], device)

    def _fold(self) -> None:
        if self._open:
            top = self._open[-1]
            top[0] = max(top[0], peak_rss_mb())
            if self.cuda:
                top[1] = max(top[1], torch.cuda.max_memory_allocated() / MB)
        reset_peak()
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()

    def _device_now(self) -> float:
        return torch.cuda.memory_allocated() / MB if self.cuda else 0.0

    def seconds(self, name: str) -> float:
        return self.stats[name].seconds if name in self.stats else 0.0

    def calls(self, name: str) -> int:
        return self.stats[name].calls if name in self.stats else 0


@contextlib.contextmanager
def timed_methods(rec: PhaseRecorder, targets: list[tuple[Any, str, str]]) -> Iterator[None]:
    """While the block runs, each `owner.attr` (a class's method or a module's function) is a phase `label`.

    Raises AttributeError at once if the library no longer has `attr`: the benchmark must follow it.
    """
    saved: list[tuple[Any, str, Any]] = []
    try:
        for owner, attr, label in targets:
            original = getattr(owner, attr)
            saved.append((owner, attr, owner.__dict__[attr]))
            setattr(owner, attr, _timed(rec, label, original))
        yield
    finally:
        for owner, attr, original in reversed(saved):
            setattr(owner, attr, original)


def _timed(rec: PhaseRecorder, label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with rec.phase(label):
            return fn(*args, **kwargs)

    return wrapper
