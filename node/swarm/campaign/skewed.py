"""Any `pulse` role with its clock shifted: `python -m node.swarm.campaign.skewed --offset=4 miner ...`.

Shifts `time.time` (and so heartbeats' `sent_at`, deadlines and DHT expirations) of this process
by `--offset` seconds, then runs the `pulse` program (`python -m node`) in this process; monotonic
clocks are left alone, as an NTP-less machine's would be.
"""

from __future__ import annotations

import runpy
import sys
import time


def main() -> int:
    if not sys.argv[1:] or not sys.argv[1].startswith("--offset="):
        print("usage: python -m node.swarm.campaign.skewed --offset=SECONDS ROLE [pulse flags]", file=sys.stderr)
        return 2
    offset = float(sys.argv[1].removeprefix("--offset="))
    real = time.time
    time.time = lambda: real() + offset  # every later `time.time()` call, in node and hivemind alike

    # run the program, as `python -m node` would: this shim starts a process, it is not a caller of
    # the command layer (a library import would run up the floors)
    sys.argv = ["pulse", *sys.argv[2:]]
    runpy.run_module("node", run_name="__main__", alter_sys=True)
    return 0  # not reached: node/__main__.py exits with pulse's status


if __name__ == "__main__":
    sys.exit(main())
