"""Process bookkeeping for swarm tests: find every descendant, make sure each one is gone."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

from tests.helpers import poll


def _stat(pid: int) -> tuple[int, str] | None:
    """(parent pid, state letter) of `pid`, or None if it no longer exists."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = text.rsplit(")", 1)[1].split()
    return int(fields[1]), fields[0]


def alive(pid: int) -> bool:
    stat = _stat(pid)
    return stat is not None and stat[1] != "Z"


def descendants(root: int | None = None) -> set[int]:
    """Pids of every living process below `root` (default: this process)."""
    root = os.getpid() if root is None else root
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None and stat[1] != "Z":
            children.setdefault(stat[0], []).append(int(entry.name))
    found: set[int] = set()
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


def wait_gone(pids: set[int], timeout: float) -> set[int]:
    """Poll until none of `pids` is alive or `timeout` passes; returns the survivors."""
    poll(lambda: not any(alive(pid) for pid in pids), timeout, interval=0.05)
    return {pid for pid in pids if alive(pid)}


def kill(pids: set[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def describe(pid: int) -> str:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        cmdline = "(gone)"
    return f"{pid} {cmdline[:120]}"


def is_torch_shm_manager(pid: int) -> bool:
    """torch's per-process shared-memory helper (hivemind's MPFuture state lives in torch shared
    memory). It is started once, outlives any one fixture by design and exits with this process."""
    return describe(pid).split(" ", 2)[1].endswith("torch_shm_manager")
