"""Shaped networks of two harnesses at once: disjoint namespaces, each removes only its own."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from node.swarm import netns

pytestmark = [pytest.mark.swarm, pytest.mark.light]

PREFIX, SUBNET = "pltn", "10.232.51"
UNAVAILABLE = netns.available(PREFIX)
HOSTS = {"x": netns.Link(), "y": netns.Link(50, 50)}
SERVER = """import socket, sys
s = socket.socket()
s.bind((sys.argv[1], 0))
s.listen()
print(s.getsockname()[1], flush=True)
s.accept()[0].sendall(b"ok")
"""
CLIENT = """import socket, sys
print(socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5).recv(2).decode())
"""


@pytest.fixture(autouse=True)
def _needs_namespaces() -> None:
    if UNAVAILABLE:
        pytest.skip(f"shaped network unavailable: {UNAVAILABLE}")


def listed() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def names(net: netns.ShapedNetwork) -> set[str]:
    return {net.switch, *(net.ns(h) for h in net.links)}


def talks(net: netns.ShapedNetwork, client: str, server: str) -> bool:
    """Whether `client` reaches a TCP server on `server` within this network."""
    addr = net.addr(server)
    serve = subprocess.Popen([*net.exec_prefix(server), sys.executable, "-c", SERVER, addr], stdout=subprocess.PIPE)
    try:
        assert serve.stdout is not None
        port = serve.stdout.readline().decode().strip()
        cmd = [*net.exec_prefix(client), sys.executable, "-c", CLIENT, addr, port]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout.strip() == "ok"
    finally:
        serve.kill()
        serve.wait()


@pytest.fixture
def stray() -> Iterator[list[str]]:
    made: list[str] = []
    yield made
    for name in made:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def test_two_networks_at_once_have_their_own_namespaces(stray: list[str]) -> None:
    """Same prefix, same subnet, same host names (two copies of one test suite): both work side by
    side, and closing one leaves the other whole."""
    first, second = netns.ShapedNetwork(PREFIX, SUBNET, HOSTS), netns.ShapedNetwork(PREFIX, SUBNET, HOSTS)
    assert not names(first) & names(second)
    with first:
        with second:
            assert names(first) | names(second) <= listed()
            assert talks(first, "x", "y") and talks(second, "y", "x")
        assert names(first) <= listed() and not names(second) & listed()
        assert talks(first, "x", "y")
    assert not names(first) & listed()


def test_creating_a_network_sweeps_only_dead_owners(stray: list[str]) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a pid no live process has (a crashed run's)
    dead, live = f"{PREFIX}-{gone.pid}-0-x", f"{PREFIX}-1-0-x"  # pid 1 is always alive
    for name in (dead, live):
        subprocess.run(["ip", "netns", "add", name], check=True)
        stray.append(name)
    with netns.ShapedNetwork(PREFIX, SUBNET, HOSTS):
        assert dead not in listed() and live in listed()
