"""A swarm across two Linux network namespaces: two hosts on one machine (`node/swarm/netns.py`).

Host A (10.231.0.1) runs the bootstrap peer and the validator; host B (10.231.0.2) runs the
miners and a follower. Nothing listens on 127.0.0.1, so every byte between roles crosses the
hosts' links (unshaped here), as it would cross a LAN. Needs root (or CAP_NET_ADMIN) and `ip`;
`available()` says why not where it cannot run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from node.swarm import netns
from node.swarm.campaign.swarms import (
    CampaignSwarm,
    Keys,
    RunReport,
    campaign_manifest,
    exit_codes,
    make_report,
    write_manifest,
)
from node.swarm.demo import Proc

NETWORK = netns.ShapedNetwork("pulse-host", "10.231.0", {"a": netns.Link(), "b": netns.Link()})


def available() -> str | None:
    """None when namespaces can be made here, else the reason they cannot."""
    return netns.available("pulse-host")


def create() -> None:
    NETWORK.create()


def remove() -> None:
    NETWORK.remove()


class HostSwarm(CampaignSwarm):
    """Roles started inside a namespace, listening on that host's address only."""

    def start_on(self, host: str, name: str, role: str, args: list[str]) -> Proc:
        events = self.out / "events" / f"{name}.jsonl"
        log = self.out / "logs" / f"{name}.log"
        for folder in (events.parent, log.parent):
            folder.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        cmd = [*NETWORK.exec_prefix(host), sys.executable, "-m", "node", *args, "--host", NETWORK.maddr(host)]
        out = log.open("wb")
        popen = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        proc = Proc(name, role, popen, events, log)
        self.procs.append(proc)
        return proc

    def start_host_bootstrap(self, timeout: float = 90.0) -> None:
        proc = self.start_on("a", "bootstrap", "bootstrap", ["dht", "--run-id", self.manifest.run_id])
        deadline = time.monotonic() + timeout
        prefix = f"/ip4/{NETWORK.addr('a')}/"
        while time.monotonic() < deadline:
            text = proc.log.read_text(errors="replace")
            if "ready" in text:
                self.bootstrap = [line for line in text.splitlines() if line.startswith(prefix)][:1]
                return
            if proc.popen.poll() is not None:
                break
            time.sleep(0.2)
        raise RuntimeError(f"the bootstrap peer did not start; see {proc.log}")

    def role_args(self, name: str, role: str, key: Path | None) -> list[str]:
        args = [role, "--config", str(self.out / "run.toml"), "--threads", "1", *self.net_args(name)]
        args = [a for a in args if a not in ("--host", "/ip4/127.0.0.1/tcp/0")]
        return args + (["--key", str(key)] if key else [])


def netns_run(out: Path, keys: Keys, rounds: int, *, miners: int = 3, deadline: float = 20.0) -> RunReport:
    """Validator on host A, miners and a follower on host B; every node must end on one hash."""
    start = time.monotonic()
    manifest = campaign_manifest(deadline, keys.validator_hex())
    write_manifest(out, manifest)
    swarm = HostSwarm(out, manifest, rounds)
    create()
    try:
        swarm.start_host_bootstrap()
        args = swarm.role_args("validator", "validator", keys.validator)
        validator = swarm.start_on("a", "validator", "validator", args)
        workers = [
            swarm.start_on("b", f"miner{i}", "miner", swarm.role_args(f"miner{i}", "miner", k))
            for i, k in enumerate(keys.honest[:miners])
        ]
        workers.append(swarm.start_on("b", "follower", "follow", swarm.role_args("follower", "follow", None)))
        codes = exit_codes(workers, 120.0 + rounds * (deadline + 25.0))
        alive = validator.popen.poll() is None
        swarm.stop(validator)
        codes["validator"] = 0 if alive else validator.popen.returncode
    finally:
        swarm.stop_all()
        remove()
    report = make_report(out.name, swarm, codes, killed=set(), seconds=time.monotonic() - start)
    text = "".join(p.log.read_text(errors="replace") for p in swarm.procs)
    report.checks["no role listened on 127.0.0.1"] = "/ip4/127.0.0.1/" not in text
    return report
