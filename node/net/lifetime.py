"""Children die with their node, and what an older crash left is named at start.

    watch_parent(creator_pid)          # in the DHT process: end it when the node that made it is gone
    with children_die_with_me(): ...   # subprocesses spawned inside (hivemind's p2pd) get a parent-death signal
    busy = listen_conflicts(maddrs)    # fixed tcp ports already taken, and by which process

A node runs hivemind's DHT in a forked process, which spawns the libp2p daemon (p2pd). hivemind
ends both on a clean shutdown, but a node killed with kill -9 (or by the OOM killer) left them
running: ~365 MB each, the metrics and listen ports held, the same restart command refused with
"Address already in use". Two links now tie each child to its parent:

- the DHT process polls its parent pid (`watch_parent`) and kills itself once the node is gone.
  Not Linux's parent-death signal: that one fires when the *thread* that forked the child exits,
  and a node starts its DHT from a worker thread;
- p2pd gets the parent-death signal (`children_die_with_me`, Linux): its parent is the DHT
  process's event loop thread, which lives as long as that process, so the DHT process's death
  (however it dies) ends the daemon at once.

What a crash from before these links left behind shows as a busy port: `listen_conflicts` names
the process that holds it (from /proc on Linux), so the user learns what to end, instead of a
daemon that starts beside the orphan and shares its port.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1  # <sys/prctl.h>
WATCH_SECONDS = 0.5  # how often the DHT process looks for its parent


def set_parent_death_signal(sig: int = signal.SIGKILL) -> bool:
    """Ask Linux to send `sig` to this process when its parent (thread) exits; False elsewhere."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _die_with_parent() -> None:
    """A `preexec_fn`: runs in the forked child before exec (p2pd keeps the setting across exec)."""
    set_parent_death_signal()


def watch_parent(creator: int, every: float = WATCH_SECONDS) -> threading.Thread:
    """End this process (SIGKILL, so its own children get their death signal) once `creator` is no
    longer its parent: the node died, however it died. A daemon thread; returns it."""

    def watch() -> None:
        while os.getppid() == creator:
            threading.Event().wait(every)
        log.warning("the node that started this process (pid %d) is gone: ending", creator)
        os.kill(os.getpid(), signal.SIGKILL)

    thread = threading.Thread(target=watch, name="watch-parent", daemon=True)
    thread.start()
    return thread


@contextlib.contextmanager
def children_die_with_me() -> Iterator[None]:
    """Within this block, every `asyncio.create_subprocess_exec` of this process gives its child a
    parent-death signal (hivemind spawns p2pd this way and offers no hook of its own)."""
    original = asyncio.subprocess.create_subprocess_exec

    async def spawn(*args: Any, **kwargs: Any) -> asyncio.subprocess.Process:
        kwargs.setdefault("preexec_fn", _die_with_parent)
        return await original(*args, **kwargs)

    asyncio.subprocess.create_subprocess_exec = spawn
    try:
        yield
    finally:
        asyncio.subprocess.create_subprocess_exec = original


def tcp_ports(maddrs: tuple[str, ...] | list[str]) -> list[tuple[str, int]]:
    """The (host, port) of each /ip4|ip6/<host>/tcp/<port> address with a fixed port (not 0)."""
    found = []
    for addr in maddrs:
        parts = addr.strip("/").split("/")
        pairs = dict(zip(parts[::2], parts[1::2], strict=False))
        port = pairs.get("tcp", "0")
        host = pairs.get("ip4") or pairs.get("ip6")
        if host is not None and port.isdigit() and int(port) != 0:
            found.append((host, int(port)))
    return found


def port_taken(host: str, port: int) -> bool:
    """Whether a listening socket already holds `host:port` (a bind there fails)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT leftovers are no conflict
        try:
            probe.bind((host, port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


def holder_of(port: int, proc: Path = Path("/proc")) -> str | None:
    """'pid N (name)' of the process listening on tcp `port`, where /proc tells; else None."""
    inodes = _listening_inodes(port, proc)
    if not inodes:
        return None
    for pid_dir in proc.iterdir():
        if not pid_dir.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in (pid_dir / "fd").iterdir():
                link = os.readlink(fd)
                if link.startswith("socket:[") and link[8:-1] in inodes:
                    name = (pid_dir / "comm").read_text().strip()
                    return f"pid {pid_dir.name} ({name})"
    return None


def _listening_inodes(port: int, proc: Path) -> set[str]:
    inodes: set[str] = set()
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            for line in (proc / "net" / table).read_text().splitlines()[1:]:
                fields = line.split()
                local, state, inode = fields[1], fields[3], fields[9]
                if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                    inodes.add(inode)
    return inodes


def listen_conflicts(maddrs: tuple[str, ...] | list[str], taken: Callable[[str, int], bool] = port_taken) -> list[str]:
    """One line per fixed listen port already in use, naming its holder where /proc tells."""
    lines = []
    for host, port in tcp_ports(maddrs):
        if taken(host, port):
            holder = holder_of(port)
            who = f" by {holder} (an orphan of an earlier run? end it first)" if holder else ""
            lines.append(f"tcp port {port} on {host} is already in use{who}")
    return lines
