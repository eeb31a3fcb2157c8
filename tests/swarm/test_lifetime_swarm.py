"""A node killed with kill -9 takes its DHT process and libp2p daemon with it; the same command then
starts again on the same port; a second node on that port is refused before its daemon starts,
with one line naming the holder.

One bootstrap (`pulse dht` on a fixed loopback port) plays all three: every role starts its DHT
the same way (`PulseDHT.start`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import poll
from tests.swarm import procs

pytestmark = [pytest.mark.swarm, pytest.mark.light]

RUN = hashlib.sha256(b"lifetime-swarm-run").hexdigest()
READY_S = 90.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _command(port: int) -> list[str]:
    return [sys.executable, "-m", "node", "dht", "--run-id", RUN, "--host", f"/ip4/127.0.0.1/tcp/{port}"]


@contextlib.contextmanager
def _bootstrap(port: int, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        proc = subprocess.Popen(_command(port), stdout=out, stderr=subprocess.STDOUT)
    try:
        ok = poll(lambda: b"ready" in log.read_bytes() or proc.poll() is not None, READY_S, interval=0.2)
        assert ok and proc.poll() is None, log.read_text()
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def test_kill_9_leaves_no_orphans_and_a_busy_port_is_refused(tmp_path: Path) -> None:
    port = _free_port()
    with _bootstrap(port, tmp_path / "first.log") as first:
        children = procs.descendants(first.pid)
        assert len(children) >= 2, [procs.describe(p) for p in children]  # the DHT process and p2pd
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
        survivors = procs.wait_gone(children, timeout=15.0)
        procs.kill(survivors)
        assert not survivors, f"orphans of a killed node: {[procs.describe(p) for p in survivors]}"

    with _bootstrap(port, tmp_path / "again.log"):  # the same command after kill -9: starts
        second = subprocess.run(_command(port), capture_output=True, timeout=60, text=True)
        assert second.returncode == 2
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1 and f"tcp port {port}" in lines[0] and "already in use" in lines[0], second.stderr
        assert "Traceback" not in second.stderr
