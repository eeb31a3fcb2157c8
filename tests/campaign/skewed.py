"""Any `pulse` role with its clock shifted: `python -m tests.campaign.skewed --offset=4 miner ...`.

Shifts `time.time` (and so heartbeats' `sent_at`, deadlines and DHT expirations) of this process
by `--offset` seconds before `node.cli` runs; monotonic clocks are left alone, as an NTP-less
machine's would be.
"""

from __future__ import annotations

import sys
import time


def main() -> int:
    if not sys.argv[1:] or not sys.argv[1].startswith("--offset="):
        print("usage: python -m tests.campaign.skewed --offset=SECONDS ROLE [pulse flags]", file=sys.stderr)
        return 2
    offset = float(sys.argv[1].removeprefix("--offset="))
    real = time.time
    time.time = lambda: real() + offset  # every later `time.time()` call, in node and hivemind alike

    from node.cli import main as pulse

    return pulse(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
