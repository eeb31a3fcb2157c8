"""The DHT record validator and the network options, in-process (the swarm tier runs them for real)."""

from __future__ import annotations

import argparse
import hashlib
import math
import time
from dataclasses import replace
from pathlib import Path

import msgpack
import pytest
from hivemind.dht.validation import DHTRecord

from node.net.dht import MAX_DHT_VALUE_BYTES, PulseRecordValidator, dht_key_id
from node.net.netconfig import NetConfig, add_net_arguments, net_config_from_args
from protocol.errors import ConfigError, InvalidRecord, InvalidSignature, MalformedPayload, WrongRun
from protocol.identity import Identity
from protocol.messages import SubmissionHeader
from protocol.signing import SignedMessage, sign

RUN = hashlib.sha256(b"validator-run").hexdigest()
PEER = "/ip4/127.0.0.1/tcp/4000/p2p/12D3KooWJDZW5oetBduTcnsaAHQat9C9sTKdmejTcWTReSBr8CHv"


def signed_header(identity: Identity, round_: int = 1, run_id: str = RUN) -> SignedMessage:
    header = SubmissionHeader(
        run_id=run_id,
        round=round_,
        base_state_hash="a" * 64,
        payload_sha256="b" * 64,
        payload_size=10,
        codec="pulseloco",
        data_digest="c" * 64,
        sender=identity.public_hex,
    )
    return sign(identity, header)


def record(
    signed: SignedMessage, *, owner: bytes | None = None, key: bytes | None = None, **changes: object
) -> DHTRecord:
    """The record hivemind builds for `store(dht_key(...), signed bytes, subkey=owner)`."""
    base = DHTRecord(
        key=key or dht_key_id(signed.run_id, signed.kind, signed.round),
        subkey=msgpack.packb(owner or signed.sender, use_bin_type=True),
        value=msgpack.packb(signed.to_bytes(), use_bin_type=True),
        expiration_time=time.time() + 60,
    )
    return replace(base, **changes)


@pytest.fixture
def validator() -> PulseRecordValidator:
    return PulseRecordValidator(RUN, max_ttl=3600)


def test_valid_record_passes(validator: PulseRecordValidator) -> None:
    me = Identity.generate()
    rec = record(signed_header(me))
    assert validator.validate(rec)
    assert validator.check(rec).sender_hex == me.public_hex
    assert validator.sign_value(rec) == rec.value and validator.strip_value(rec) == rec.value


def _bad_records() -> dict[str, tuple[DHTRecord, type[Exception]]]:
    me, other = Identity.generate(), Identity.generate()
    good = signed_header(me)
    return {
        "forged": (record(replace(good, signature=bytes(64))), InvalidSignature),
        "mis_owned": (record(good, owner=other.public_key), InvalidSignature),
        "other_run": (record(signed_header(me, run_id="d" * 64)), WrongRun),
        "wrong_key": (record(good, key=dht_key_id(RUN, good.kind, 2)), InvalidRecord),
        "unsigned": (replace(record(good), subkey=msgpack.packb(None)), InvalidSignature),
        "short_owner": (replace(record(good), subkey=msgpack.packb(b"x" * 31, use_bin_type=True)), InvalidSignature),
        "oversized": (replace(record(good), value=b"\xc6" + b"\x00" * MAX_DHT_VALUE_BYTES), InvalidRecord),
        "far_future": (record(good, expiration_time=time.time() + 10 * 86400), InvalidRecord),
        "nan_expiration": (record(good, expiration_time=math.nan), InvalidRecord),
        "not_msgpack": (replace(record(good), value=b"\xc1"), MalformedPayload),
        "msgpack_int": (replace(record(good), value=msgpack.packb(7)), MalformedPayload),
        "trailing": (replace(record(good), value=record(good).value + b"\x00"), MalformedPayload),
        "garbage_envelope": (
            replace(record(good), value=msgpack.packb(b"PLSM garbage", use_bin_type=True)),
            MalformedPayload,
        ),
    }


@pytest.mark.parametrize("case", sorted(_bad_records()))
def test_bad_records_are_rejected(validator: PulseRecordValidator, case: str) -> None:
    rec, error = _bad_records()[case]
    assert not validator.validate(rec)
    with pytest.raises(error):
        validator.check(rec)


# -- network options -----------------------------------------------------------------------------


def test_net_config_defaults_and_kwargs(tmp_path: Path) -> None:
    config = NetConfig(
        initial_peers=(PEER,), identity_path=tmp_path / "id", announce_maddrs=("/ip4/1.2.3.4/tcp/31337",)
    )
    kwargs = config.dht_kwargs()
    assert kwargs["initial_peers"] == [PEER] and kwargs["identity_path"] == str(tmp_path / "id")
    assert kwargs["use_relay"] is True and kwargs["use_auto_relay"] is False
    assert kwargs["announce_maddrs"] == ["/ip4/1.2.3.4/tcp/31337"]


@pytest.mark.parametrize(
    ("flags", "field"),
    [
        (["--initial-peers", "/ip4/127.0.0.1/tcp/4000"], "initial_peers"),  # no /p2p/ part
        (["--initial-peers", "not-a-multiaddr"], "initial_peers"),
        (["--host", "/ip4/300.0.0.1/tcp/1"], "host_maddrs"),
        (["--announce", "/ip4/1.2.3.4/tcp/0"], "announce_maddrs"),
    ],
)
def test_bad_flags_name_the_field(flags: list[str], field: str) -> None:
    parser = argparse.ArgumentParser()
    add_net_arguments(parser)
    with pytest.raises(ConfigError, match=field):
        net_config_from_args(parser.parse_args(flags))


def test_flags_map_to_config() -> None:
    parser = argparse.ArgumentParser()
    add_net_arguments(parser)
    args = parser.parse_args(["--initial-peers", PEER, "--no-relay", "--auto-relay", "--client-mode"])
    config = net_config_from_args(args)
    assert config.initial_peers == (PEER,) and not config.use_relay and config.use_auto_relay and config.client_mode
