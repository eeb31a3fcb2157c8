"""A swarm across two Linux network namespaces joined by a veth pair: two hosts on one machine.

Host A (10.231.0.1) runs the bootstrap peer and the validator; host B (10.231.0.2) runs the
miners and a follower. Nothing listens on 127.0.0.1, so every byte between roles crosses the
veth link, as it would cross a LAN. Needs root (or CAP_NET_ADMIN) and `ip`; `available()` says
why not where it cannot run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

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

HOSTS = {"a": ("pulse-host-a", "10.231.0.1"), "b": ("pulse-host-b", "10.231.0.2")}


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20)


def available() -> str | None:
    """None when namespaces can be made here, else the reason they cannot."""
    if shutil.which("ip") is None:
        return "no `ip` command"
    if os.geteuid() != 0:
        return "creating network namespaces needs root"
    probe = _ip("netns", "add", "pulse-probe")
    if probe.returncode != 0:
        return f"`ip netns add` failed: {probe.stderr.strip()}"
    _ip("netns", "del", "pulse-probe")
    return None


def create() -> None:
    remove()
    (ns_a, addr_a), (ns_b, addr_b) = HOSTS["a"], HOSTS["b"]
    steps = [
        ("netns", "add", ns_a),
        ("netns", "add", ns_b),
        ("link", "add", "pulse-veth-a", "type", "veth", "peer", "name", "pulse-veth-b"),
        ("link", "set", "pulse-veth-a", "netns", ns_a),
        ("link", "set", "pulse-veth-b", "netns", ns_b),
        ("-n", ns_a, "addr", "add", f"{addr_a}/24", "dev", "pulse-veth-a"),
        ("-n", ns_b, "addr", "add", f"{addr_b}/24", "dev", "pulse-veth-b"),
        ("-n", ns_a, "link", "set", "pulse-veth-a", "up"),
        ("-n", ns_b, "link", "set", "pulse-veth-b", "up"),
        ("-n", ns_a, "link", "set", "lo", "up"),
        ("-n", ns_b, "link", "set", "lo", "up"),
    ]
    for step in steps:
        done = _ip(*step)
        if done.returncode != 0:
            raise RuntimeError(f"ip {' '.join(step)}: {done.stderr.strip()}")


def remove() -> None:
    for ns, _ in HOSTS.values():
        _ip("netns", "del", ns)  # the veth pair goes with its namespaces


class HostSwarm(CampaignSwarm):
    """Roles started inside a namespace, listening on that host's address only."""

    def start_on(self, host: str, name: str, role: str, args: list[str]) -> Proc:
        ns, addr = HOSTS[host]
        events = self.out / "events" / f"{name}.jsonl"
        log = self.out / "logs" / f"{name}.log"
        for folder in (events.parent, log.parent):
            folder.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        cmd = ["ip", "netns", "exec", ns, sys.executable, "-m", "node", *args, "--host", f"/ip4/{addr}/tcp/0"]
        out = log.open("wb")
        popen = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        proc = Proc(name, role, popen, events, log)
        self.procs.append(proc)
        return proc

    def start_host_bootstrap(self, timeout: float = 90.0) -> None:
        proc = self.start_on("a", "bootstrap", "bootstrap", ["dht", "--config", str(self.out / "run.toml")])
        deadline = time.monotonic() + timeout
        prefix = f"/ip4/{HOSTS['a'][1]}/"
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
