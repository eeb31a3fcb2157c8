"""Hosts on one machine: Linux network namespaces behind one switch, each with a rate-limited link.

    net = ShapedNetwork("plk", "10.232.7", {"validator": Link.both(1000), "miner0": Link(up=20, down=100)})
    with net:                                # creates every namespace; removes them on the way out
        net.addr("miner0")                   # "10.232.7.2"
        net.popen("miner0", [sys.executable, "-m", "node", ...], log)

Topology: a namespace per host and one switch namespace holding a Linux bridge. Each host is one
veth pair, `eth0` in the host's namespace and the other end on the bridge, so every byte between
two hosts crosses the sender's uplink and the receiver's downlink, as on the internet. Shaping is
`tc tbf` on egress: on the host's end for its uplink, on the switch's end for its downlink (a
`Link` without a rate is unshaped). Nothing is added for delay: this kernel has no netem, so the
only latency is the links' own queueing (`QUEUE_MS` at most), which is what a saturated home link
adds anyway.

Names: a network's namespaces are `<prefix>-<pid>-<n>-<host>` and `<prefix>-<pid>-<n>-switch`, where
`<pid>-<n>` is the owning process and a counter of the networks it made: two harnesses (two test
suites at once, a test beside a benchmark) never share or delete each other's namespaces, whatever
prefix they chose. `remove` deletes only the network's own; `create` also sweeps namespaces of the
same prefix whose owning process is dead (a crashed run's), never a live one's. Interface names
(`eth0`, `p<i>`, `br0`) are made directly inside the namespaces, so they stay short (the kernel's
limit is 15 characters) and never meet another network's. Subnets cannot collide either: each
network is its own bridge in its own switch namespace, with no address or route in the machine's
own namespace, so two networks may use the same /24. Needs root (or CAP_NET_ADMIN) and `ip`/`tc`;
`available(prefix)` says why not where it cannot run.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

QUEUE_MS = 50  # tbf queue: at most this much data waits on a link (its bufferbloat)
MIN_BURST_BYTES = 32 * 1024


@dataclass(frozen=True)
class Link:
    """A host's access link in Mbit/s: `up` from the host, `down` to it (None: unshaped)."""

    up: float | None = None
    down: float | None = None

    @classmethod
    def both(cls, mbit: float) -> Link:
        """`mbit` Mbit/s each way."""
        return cls(mbit, mbit)


def _run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=20)


def _check(cmd: list[str]) -> None:
    done = _run(cmd)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {done.stderr.strip()}")


def available(prefix: str) -> str | None:
    """None when namespaces and tbf can be made here, else the reason they cannot."""
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"no `{tool}` command"
    if os.geteuid() != 0:
        return "creating network namespaces needs root"
    probe = f"{_owner(prefix)}-probe"
    made = _run(["ip", "netns", "add", probe])
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    try:
        _run(["ip", "-n", probe, "link", "add", "p0", "type", "veth", "peer", "name", "p1"])
        shaped = _run(["ip", "netns", "exec", probe, "tc", "qdisc", "add", "dev", "p0", "root", *tbf(10.0)])
        if shaped.returncode != 0:
            return f"`tc qdisc add ... tbf` failed: {shaped.stderr.strip()}"
    finally:
        _run(["ip", "netns", "del", probe])
    return None


def tbf(mbit: float) -> list[str]:
    """tc arguments of a token bucket at `mbit` Mbit/s (burst: 4 ms of data, at least 32 KiB)."""
    rate = mbit * 1e6 / 8
    burst = max(MIN_BURST_BYTES, int(rate * 0.004))
    return ["tbf", "rate", f"{mbit}mbit", "burst", str(burst), "latency", f"{QUEUE_MS}ms"]


_NETWORKS = itertools.count()


def _owner(prefix: str) -> str:
    """A name part no other live network has: this process and a counter of its networks."""
    if not _PREFIX_RE.fullmatch(prefix):
        raise ValueError(f"namespace prefix {prefix!r}: letters, digits and hyphens, at most 16")
    return f"{prefix}-{os.getpid()}-{next(_NETWORKS)}"


_PREFIX_RE = re.compile(r"[A-Za-z][A-Za-z0-9-]{0,15}")


def sweep_dead(prefix: str) -> list[str]:
    """Delete the namespaces `<prefix>-<pid>-...` whose process `pid` is no longer alive; their names."""
    listed = _run(["ip", "netns", "list"]).stdout.split("\n")
    pattern = re.compile(rf"({re.escape(prefix)}-(\d+)-\d+-\S+)")
    dead = []
    for line in listed:
        if (m := pattern.match(line)) and not _alive(int(m.group(2))):
            _run(["ip", "netns", "del", m.group(1)])
            dead.append(m.group(1))
    return dead


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's: alive
        return True
    return True


class ShapedNetwork:
    """Hosts (name -> `Link`) at `<subnet>.1`, `<subnet>.2`, ... in insertion order."""

    def __init__(self, prefix: str, subnet: str, hosts: dict[str, Link]) -> None:
        if len(hosts) > 250:
            raise ValueError("at most 250 hosts on one /24")
        self.prefix, self.subnet, self.links = prefix, subnet, dict(hosts)
        self.owner = _owner(prefix)  # unique among live networks on this machine
        self.switch = f"{self.owner}-switch"

    def ns(self, host: str) -> str:
        return f"{self.owner}-{host}"

    def addr(self, host: str) -> str:
        return f"{self.subnet}.{list(self.links).index(host) + 1}"

    def maddr(self, host: str) -> str:
        """The multiaddr a role on `host` listens on (an OS-assigned port)."""
        return f"/ip4/{self.addr(host)}/tcp/0"

    def exec_prefix(self, host: str) -> list[str]:
        """The command prefix that runs a program inside `host`."""
        return ["ip", "netns", "exec", self.ns(host)]

    def create(self) -> None:
        sweep_dead(self.prefix)  # what crashed runs of this prefix left
        _check(["ip", "netns", "add", self.switch])
        _check(["ip", "-n", self.switch, "link", "add", "br0", "type", "bridge"])
        _check(["ip", "-n", self.switch, "link", "set", "br0", "up"])
        for i, host in enumerate(self.links):
            self._add_host(i, host)

    def _add_host(self, i: int, host: str) -> None:
        ns, port = self.ns(host), f"p{i}"
        _check(["ip", "netns", "add", ns])
        _check(
            [
                "ip",
                "link",
                "add",
                "name",
                "eth0",
                "netns",
                ns,
                "type",
                "veth",
                "peer",
                "name",
                port,
                "netns",
                self.switch,
            ]
        )
        _check(["ip", "-n", self.switch, "link", "set", port, "master", "br0"])
        _check(["ip", "-n", self.switch, "link", "set", port, "up"])
        _check(["ip", "-n", ns, "addr", "add", f"{self.addr(host)}/24", "dev", "eth0"])
        _check(["ip", "-n", ns, "link", "set", "eth0", "up"])
        _check(["ip", "-n", ns, "link", "set", "lo", "up"])
        self.shape(host, self.links[host])

    def shape(self, host: str, link: Link) -> None:
        """Set (or change, while traffic flows) `host`'s link rates."""
        self.links[host] = link
        port = f"p{list(self.links).index(host)}"
        for ns, dev, mbit in ((self.ns(host), "eth0", link.up), (self.switch, port, link.down)):
            _run(["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev, "root"])  # none yet: fine
            if mbit is not None:
                _check(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", *tbf(mbit)])

    def remove(self) -> None:
        for ns in [self.switch, *(self.ns(h) for h in self.links)]:
            _run(["ip", "netns", "del", ns])  # its veth ends go with it

    def popen(self, host: str, cmd: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        """Start `cmd` inside `host`, stdout and stderr to `log`, in its own session (so a test can
        kill its whole process group)."""
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("wb") as out:
            return subprocess.Popen(
                [*self.exec_prefix(host), *cmd],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )

    def __enter__(self) -> ShapedNetwork:
        self.create()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.remove()
