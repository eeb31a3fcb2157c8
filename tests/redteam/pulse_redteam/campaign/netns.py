"""A swarm across two Linux network namespaces: two hosts on one machine (`node/swarm/netns.py`).

Host A (10.231.0.1) runs the bootstrap peer and the validator; host B (10.231.0.2) runs the
miners and a follower. Nothing listens on 127.0.0.1, so every byte between roles crosses the
hosts' links (unshaped here), as it would cross a LAN. Needs root (or CAP_NET_ADMIN) and `ip`;
`available()` says why not where it cannot run.
"""

from __future__ import annotations

import time
from pathlib import Path

from node.swarm import netns
from node.swarm.demo import Proc
from pulse_redteam.campaign.swarms import (
    CampaignSwarm,
    Keys,
    RunReport,
    campaign_manifest,
    exit_codes,
    make_report,
    write_manifest,
)

NETWORK = netns.ShapedNetwork("pulse-host", "10.231.0", {"a": netns.Link(), "b": netns.Link()})


def available() -> str | None:
    """None when namespaces can be made here, else the reason they cannot."""
    return netns.available("pulse-host")


def create() -> None:
    NETWORK.create()


def remove() -> None:
    NETWORK.remove()


class HostSwarm(CampaignSwarm):
    """The campaign's roles on the two hosts, listening on their host's address only."""

    def start_on(self, host: str, name: str, role: str, key: Path | None) -> Proc:
        extra = ["--config", str(self.out / "run.toml"), "--threads", "1"] + (["--key", str(key)] if key else [])
        return self.spawn(name, role, [role, *self.net_args(name), *extra], host=host)

    def net_args(self, name: str) -> list[str]:
        args = super().net_args(name)
        at = args.index("--host")
        return [*args[:at], "--host", self.listen(self.host_of(name)), *args[at + 2 :]]

    @staticmethod
    def host_of(name: str) -> str:
        return "a" if name in ("bootstrap", "validator") else "b"


def netns_run(out: Path, keys: Keys, rounds: int, *, miners: int = 3, deadline: float = 20.0) -> RunReport:
    """Validator on host A, miners and a follower on host B; every node must end on one hash."""
    start = time.monotonic()
    manifest = campaign_manifest(deadline, keys.validator_hex())
    write_manifest(out, manifest)
    swarm = HostSwarm(out, manifest, rounds, net=NETWORK)
    create()
    try:
        swarm.start_bootstrap(timeout=90.0, host="a")
        validator = swarm.start_on("a", "validator", "validator", keys.validator)
        workers = [swarm.start_on("b", f"miner{i}", "miner", k) for i, k in enumerate(keys.honest[:miners])]
        workers.append(swarm.start_on("b", "follower", "follow", None))
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
