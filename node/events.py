"""How each role reports: log lines a user understands, and the same events as JSON lines.

`Events` logs each step in words and, for `pulse demo` and the campaign ledger, also appends it
as one JSON line to a file they read.
"""

from __future__ import annotations

import json
import logging
import resource
import time
from pathlib import Path
from typing import Any


class Events:
    """Human log lines plus, optionally, machine-readable JSON lines for the demo."""

    def __init__(self, role: str, path: Path | None = None, logger: logging.Logger | None = None) -> None:
        self.role = role
        self.path = path
        self.log = logger or logging.getLogger(f"pulse.{role}")
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)

    def emit(self, event: str, text: str, **fields: Any) -> None:
        self.log.info(text)
        if self.path is None:
            return
        record = {"t": time.time(), "role": self.role, "event": event, **fields}
        with self.path.open("a") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")

    def finish(self, **fields: Any) -> None:
        """The last record: peak RSS of this process and anything the role adds."""
        rss_mb = peak_rss_mb()
        self.emit("exit", f"{self.role} exiting (peak RSS {rss_mb:.0f} MB)", peak_rss_mb=rss_mb, **fields)


def mb(n: int) -> str:
    return f"{n / 1e6:.2f} MB" if n >= 10_000 else f"{n} bytes"


def peak_rss_mb() -> float:
    """Peak resident memory of this process in MiB: VmHWM (Linux keeps `ru_maxrss` across fork+exec,
    so a child of a big parent would report the parent's size), else `ru_maxrss`."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
