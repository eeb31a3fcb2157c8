"""Peak memory of one phase of a benchmark, in this process (Linux; None elsewhere).

    with PeakMemory() as peak:
        encode(old, new)
    peak.extra_bytes          # highest resident set size during the phase, above where it started

Before the phase, freed heap memory is returned to the system (`malloc_trim`) so that the phase
cannot hide its allocations in pages an earlier phase left resident; then the kernel's
high-water mark is reset (writing "5" to /proc/self/clear_refs) so that it records this phase
alone. With `device` set to a CUDA device, the device's own peak allocation above its start is
measured too.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
from pathlib import Path
from types import TracebackType

import torch

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def _status_kb(field: str) -> int | None:
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _trim() -> None:
    gc.collect()
    libc_name = ctypes.util.find_library("c")
    if libc_name:
        with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to trim
            ctypes.CDLL(libc_name).malloc_trim(0)


def reset_high_water() -> bool:
    """Reset VmHWM to the current RSS; False where the kernel does not allow it."""
    try:
        _CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return True


class PeakMemory:
    """Measures the extra peak resident memory (and CUDA memory) of the code inside `with`."""

    def __init__(self, device: torch.device | None = None) -> None:
        self.device = device if device is not None and device.type == "cuda" else None
        self.extra_bytes: int | None = None
        self.device_extra_bytes: int | None = None
        self._start_kb: int | None = None
        self._device_start = 0

    def __enter__(self) -> PeakMemory:
        _trim()
        self._start_kb = _status_kb("VmRSS") if reset_high_water() else None
        if self.device is not None:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._device_start = torch.cuda.memory_allocated(self.device)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        peak_kb = _status_kb("VmHWM")
        if self._start_kb is not None and peak_kb is not None:
            self.extra_bytes = max(0, peak_kb - self._start_kb) * 1024
        if self.device is not None:
            torch.cuda.synchronize(self.device)
            self.device_extra_bytes = torch.cuda.max_memory_allocated(self.device) - self._device_start
