"""Network start-up options a user sets (a config type, not a wire type) and their CLI flags.

These become the keyword arguments of `hivemind.DHT`, which passes them on to its libp2p daemon.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar

from hivemind.proto import crypto_pb2
from hivemind.utils.crypto import RSAPrivateKey
from hivemind.utils.multiaddr import Multiaddr
from pydantic import BaseModel, Field, ValidationError, field_validator

from protocol.errors import ConfigError
from protocol.parsing import STRICT, flag_line


class NetConfig(BaseModel):
    """How this node joins the swarm. Bad values fail at construction with the field named."""

    model_config = STRICT

    initial_peers: tuple[str, ...] = ()
    """Multiaddrs of peers to dial first, each ending in /p2p/<peer id> (from `pulse dht`)."""
    host_maddrs: tuple[str, ...] = ("/ip4/0.0.0.0/tcp/0",)
    """Where to listen; port 0 lets the OS pick one. A bootstrap peer wants a fixed port."""
    announce_maddrs: tuple[str, ...] = ()
    """Public addresses to tell others about (e.g. behind port forwarding); explicit ports only."""
    use_relay: bool = True
    """Allow libp2p circuit relays, so peers behind NAT can be reached through a public peer."""
    use_auto_relay: bool = False
    """Look for relays to become reachable when this node is itself behind NAT."""
    client_mode: bool = False
    """Do not serve DHT requests (for nodes that cannot accept connections); still reads and writes."""
    identity_path: Path | None = None
    """libp2p identity file, so the peer id survives restarts; created on first use if missing."""
    startup_timeout: float = Field(default=30.0, gt=0, le=600)
    """Seconds to wait for the libp2p daemon and the first DHT contact."""

    @field_validator("initial_peers")
    @classmethod
    def _peers_name_a_peer(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for addr in value:
            if "p2p" not in _parse(addr):
                raise ValueError(f"{addr!r} has no /p2p/<peer id> part; copy the full address `pulse dht` prints")
        return value

    @field_validator("host_maddrs")
    @classmethod
    def _hosts_parse(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise ValueError("at least one listen address is needed")
        for addr in value:
            _parse(addr)
        return value

    @field_validator("announce_maddrs")
    @classmethod
    def _announce_has_ports(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for addr in value:
            parsed = _parse(addr)
            if ("tcp" in parsed and parsed["tcp"] == "0") or ("udp" in parsed and parsed["udp"] == "0"):
                raise ValueError(f"{addr!r}: announce an explicit port, not 0")
        return value

    def dht_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for `hivemind.DHT(...)` (everything but the record validators)."""
        kwargs: dict[str, Any] = {
            "initial_peers": list(self.initial_peers),
            "host_maddrs": list(self.host_maddrs),
            "use_relay": self.use_relay,
            "use_auto_relay": self.use_auto_relay,
            "client_mode": self.client_mode,
            "startup_timeout": self.startup_timeout,
        }
        if self.announce_maddrs:
            kwargs["announce_maddrs"] = list(self.announce_maddrs)
        if self.identity_path is not None:
            kwargs["identity_path"] = str(self.identity_path)
        return kwargs


def prepare_identity(config: NetConfig) -> None:
    """Create the libp2p identity file, if one is named and missing, with mode 0600 from the start.

    hivemind would write it with the process umask and tighten it afterwards, leaving a moment in
    which others may read the key. Same format as hivemind's (an RSA key in libp2p's protobuf).
    The file appears whole or not at all: temp file (O_EXCL, 0600), fsync, then a hard link.
    """
    path = config.identity_path
    if path is None or path.exists():
        return
    key = crypto_pb2.PrivateKey(key_type=crypto_pb2.KeyType.RSA, data=RSAPrivateKey().to_bytes())
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileNotFoundError as exc:
        raise ConfigError(f"identity_path: the folder {path.parent} does not exist") from exc
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(key.SerializeToString())
            f.flush()
            os.fsync(f.fileno())
        os.link(tmp, path)
    except FileExistsError:
        pass  # another process made it first: use theirs
    finally:
        tmp.unlink(missing_ok=True)


def _parse(addr: str) -> Multiaddr:
    try:
        return Multiaddr(addr)
    except ValueError as exc:  # hivemind's multiaddr parse errors are ValueErrors
        raise ValueError(f"{addr!r} is not a multiaddr: {exc}") from exc


class NetOptions(BaseModel):
    """The network flags every long-running command shares, as an options model (`pulse`'s commands
    generate the flags and their help from it, and inherit it in their own options)."""

    model_config = STRICT
    flag_group: ClassVar[str] = "network"
    """The heading of these flags in a command's help."""

    initial_peers: list[str] = Field(default_factory=list)
    """peers to dial first: the multiaddrs `pulse dht` prints"""
    host: list[str] | None = None
    """listen multiaddrs (default /ip4/0.0.0.0/tcp/0)"""
    announce: list[str] = Field(default_factory=list)
    """public multiaddrs to announce"""
    no_relay: bool = False
    """disable libp2p circuit relays"""
    auto_relay: bool = False
    """find a relay to be reachable behind NAT"""
    client_mode: bool = False
    """do not serve DHT requests (behind NAT)"""
    p2p_identity: Path | None = None
    """libp2p identity file: keeps the peer id across restarts"""

    def net_config(self) -> NetConfig:
        """The `NetConfig` these flags ask for; `ConfigError` (one line, the flag named) if invalid."""
        fields: dict[str, Any] = {
            "initial_peers": tuple(self.initial_peers),
            "announce_maddrs": tuple(self.announce),
            "use_relay": not self.no_relay,
            "use_auto_relay": self.auto_relay,
            "client_mode": self.client_mode,
            "identity_path": self.p2p_identity,
        }
        if self.host is not None:
            fields["host_maddrs"] = tuple(self.host)
        try:
            return NetConfig(**fields)
        except ValidationError as exc:
            raise ConfigError(flag_line(exc, _FLAGS)) from exc


_FLAGS = {"host_maddrs": "host", "announce_maddrs": "announce"}
"""The flag that sets a `NetConfig` field, for its errors."""
