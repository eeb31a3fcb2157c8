"""Host memory a GPU node hands back to the system as soon as it frees it.

glibc serves a large allocation with its own mapping, returned at `free`, but raises that threshold
each time such a block is freed (up to 32 MiB), after which tensors of a few MiB come from the heap
and stay with the process when freed. A miner's codec frees the pseudo-gradient tensor by tensor
while it builds the payload (`Codec.compress(handover=True)`), so on the heap the freed tensors are
held beside the payload's arrays: at 0.5B, 22.1 bytes per parameter above the BF16 weights at the
codec's peak against 14.0 with the threshold fixed at 64 KiB (`pulse bench scale` measures it).

Only where the device trains: on the CPU, each step's activations would then be fresh mappings
(inner steps about a third slower), while on a GPU the host allocates little besides the codec's
and the chain's large, short-lived buffers.
"""

from __future__ import annotations

import ctypes
import logging

log = logging.getLogger(__name__)

M_MMAP_THRESHOLD = -3  # mallopt's parameter number (glibc malloc.h)
THRESHOLD_BYTES = 64 * 1024


def return_large_frees(device: str) -> bool:
    """On a node whose `device` trains (cuda): serve allocations from 64 KiB up with their own mappings
    (given back on free), for the rest of the process. False where it does not apply: a CPU node, or a
    C library without the setting (not glibc)."""
    if device != "cuda":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        done = bool(libc.mallopt(M_MMAP_THRESHOLD, THRESHOLD_BYTES))
    except (OSError, AttributeError):
        return False
    if done:
        log.info("host blocks from %d KiB go back to the system when freed", THRESHOLD_BYTES // 1024)
    return done
