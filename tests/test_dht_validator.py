"""The DHT record validator, the store budget and the network options, in-process (the swarm
tier runs them for real)."""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import time
from dataclasses import replace
from pathlib import Path

import msgpack
import pytest
from hivemind.dht.validation import DHTRecord
from hivemind.utils.timed_storage import ValueWithExpiration

from node.commands.options import add_options, options_from
from node.net.dht import PulseDHT, PulseRecordValidator, dht_key_id, sign_for
from node.net.netconfig import NetConfig, NetOptions
from node.net.records import MAX_DHT_VALUE_BYTES, POLICIES, RecordRules, StoreBudget
from protocol.errors import ConfigError, InvalidRecord, InvalidSignature, MalformedPayload, NetworkError, WrongRun
from protocol.identity import Identity
from protocol.messages import (
    MAX_HELD_BLOBS,
    MESSAGE_TYPES,
    CheckpointAnnouncement,
    Heartbeat,
    RoundResult,
    SubmissionHeader,
    WireModel,
)
from protocol.signing import SignedMessage, sign
from tests.helpers import commitments

RUN = hashlib.sha256(b"validator-run").hexdigest()
PEER = "/ip4/127.0.0.1/tcp/4000/p2p/12D3KooWJDZW5oetBduTcnsaAHQat9C9sTKdmejTcWTReSBr8CHv"


VALIDATOR = Identity.generate()
RULES = RecordRules(RUN, (VALIDATOR.public_hex,), max_ttl=3600)


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
    return sign_for(identity, header, 60)


def record(
    signed: SignedMessage, *, owner: bytes | None = None, key: bytes | None = None, **changes: object
) -> DHTRecord:
    """The record hivemind builds for `store(dht_key(...), signed bytes, subkey=owner)`."""
    base = DHTRecord(
        key=key or dht_key_id(signed.run_id, signed.kind, signed.round),
        subkey=msgpack.packb(owner or signed.sender, use_bin_type=True),
        value=msgpack.packb(signed.to_bytes(), use_bin_type=True),
        expiration_time=signed.expires_at,
    )
    return replace(base, **changes)


@pytest.fixture
def validator() -> PulseRecordValidator:
    return PulseRecordValidator(RULES)


def test_valid_record_passes(validator: PulseRecordValidator) -> None:
    me = Identity.generate()
    rec = record(signed_header(me))
    assert validator.validate(rec)
    assert validator.check(rec).sender_hex == me.public_hex
    assert validator.sign_value(rec) == rec.value and validator.strip_value(rec) == rec.value


def header_of(signed: SignedMessage) -> SubmissionHeader:
    return SubmissionHeader.from_canonical(signed.body)


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
        "far_future": (record(sign_for(me, header_of(good), 10 * 86400)), InvalidRecord),
        "re_timed": (record(good, expiration_time=good.expires_at + 3000), InvalidRecord),  # pinning a record
        "no_expiry": (record(sign(me, header_of(good))), InvalidRecord),
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


# -- who may write what, and how much a peer keeps --------------------------------------------------


def result(round_: int = 1) -> RoundResult:
    h = hashlib.sha256(str(round_).encode()).hexdigest()
    return RoundResult(
        run_id=RUN, round=round_, selected=(), rejections=(), base_state_hash=h, patch_sha256=h, patch_size=1,
        new_state_hash=h, **commitments(str(round_)),
    )  # fmt: skip


def beat(identity: Identity, round_: int = 1, blobs: int = 0) -> Heartbeat:
    return Heartbeat(
        run_id=RUN, round=round_, role="miner", peer_id="1" * 46, state_hash=None,
        blobs=tuple(hashlib.sha256(f"{i}".encode()).hexdigest() for i in range(blobs)), sent_at=1,
    )  # fmt: skip


def test_validator_only_kinds_are_refused_from_anyone_else(validator: PulseRecordValidator) -> None:
    """A flood of fresh keys signing round results for a predictable round is refused at store
    time, so the validator's own result is the only one under its key."""
    junk = record(sign_for(Identity.generate(), result(), 60))
    with pytest.raises(InvalidRecord, match="validators only"):
        validator.check(junk)
    assert validator.validate(record(sign_for(VALIDATOR, result(), 60)))
    checkpoint = CheckpointAnnouncement(
        run_id=RUN, round=1, state_hash="a" * 64, blob_sha256="b" * 64, blob_size=1, format="safetensors"
    )
    assert not validator.validate(record(sign_for(Identity.generate(), checkpoint, 60)))
    assert validator.validate(record(sign_for(VALIDATOR, checkpoint, 60)))


def test_every_kind_has_a_policy_its_largest_message_fits() -> None:
    assert set(MESSAGE_TYPES) <= set(POLICIES), "a new record kind needs a row in node.net.records.POLICIES"
    me = Identity.generate()
    largest: dict[str, WireModel] = {
        "heartbeat": beat(me, blobs=MAX_HELD_BLOBS),
        "submission": header_of(signed_header(me)),
    }
    for kind, message in largest.items():
        packed = msgpack.packb(sign_for(me, message, 60).to_bytes(), use_bin_type=True)
        RULES.check_size(kind, len(packed))
    with pytest.raises(InvalidRecord, match="heartbeat value"):
        RULES.check_size("heartbeat", POLICIES["heartbeat"].max_value_bytes + 1)
    with pytest.raises(InvalidRecord, match="no storage policy"):
        RULES.policy("not_a_kind")


def _admit(budget: StoreBudget, signed: SignedMessage) -> bool:
    key = dht_key_id(RUN, signed.kind, signed.round)
    return budget.admit(key, signed.sender, signed.to_bytes(), signed.expires_at).stored


def test_a_key_keeps_a_bounded_number_of_open_signers_and_always_the_validators() -> None:
    small = {**POLICIES, "heartbeat": replace(POLICIES["heartbeat"], max_signers=3)}
    rules = RecordRules(RUN, (VALIDATOR.public_hex,), policies=small)
    budget = StoreBudget(rules)
    flood = [sign_for(Identity.generate(), beat(Identity.generate()), 60) for _ in range(10)]
    kept = [_admit(budget, s) for s in flood]
    assert kept == [True] * 10  # a full key takes a newcomer in place of one drawn at random
    assert len(budget) == 3
    assert _admit(budget, sign_for(VALIDATOR, beat(VALIDATOR), 60))  # the key is full, the validator still fits
    assert _admit(budget, flood[0])  # an owner already kept may store its newer record


def test_one_signer_keeps_its_newest_rounds_only() -> None:
    budget = StoreBudget(RULES, max_per_signer=4)
    budget.learn_head(10)
    me = Identity.generate()
    for r in range(10):
        assert _admit(budget, sign_for(me, beat(me, r), 60))
    assert len(budget) == 4
    key = dht_key_id(RUN, "heartbeat", 10)
    admitted = budget.admit(key, me.public_key, sign_for(me, beat(me, 10), 60).to_bytes(), time.time() + 60)
    assert admitted.evict == ((dht_key_id(RUN, "heartbeat", 6), me.public_key),)  # its lowest round kept so far


def test_open_records_of_fresh_keys_stay_within_the_byte_budget() -> None:
    budget = StoreBudget(RULES, max_open_bytes=20_000)
    evicted: list[tuple[bytes, bytes]] = []
    first_full: int | None = None
    for i in range(200):  # no head known: the run's first rounds (far ones are refused)
        me, r = Identity.generate(), i % 5
        signed = sign_for(me, beat(me, r), 60)
        admitted = budget.admit(dht_key_id(RUN, "heartbeat", r), me.public_key, signed.to_bytes(), signed.expires_at)
        assert admitted.stored
        if admitted.evict and first_full is None:
            first_full = i
        evicted += admitted.evict
    assert budget.bytes <= 20_000 and len(budget) < 200
    assert first_full is not None  # the round farthest from the run's start goes first
    assert evicted[0] == (dht_key_id(RUN, "heartbeat", 4), evicted[0][1])
    for r in range(50):  # the validator's records are outside the budget: a flood never pushes them out
        assert _admit(budget, sign_for(VALIDATOR, beat(VALIDATOR, 1000 + r), 60))
    assert budget.bytes <= 20_000


def test_reads_look_at_the_validators_first_and_at_a_bounded_number() -> None:
    junk = sorted(Identity.generate().public_key for _ in range(300))
    order = RULES.read_order([*junk, VALIDATOR.public_key], "round_result")
    assert order == [VALIDATOR.public_key]  # nobody else writes round results: nothing else is read
    order = RULES.read_order([*junk, VALIDATOR.public_key], "heartbeat")
    assert order[0] == VALIDATOR.public_key and len(order) == 1 + POLICIES["heartbeat"].max_signers


def test_keys_ground_to_sort_first_take_no_place_in_a_read() -> None:
    """A read that merges several storages finds more signers than it looks at. Keys ground to start
    with zero bytes took every place when the others were read in key order; now a reader looks at
    the keys it knows to have standing first, then the rest in an order only it knows."""
    limit = len(RULES.validators) + POLICIES["rollouts"].max_signers  # what a read looks at
    ground = [bytes(2) + os.urandom(30) for _ in range(limit + 44)]  # each sorts before any honest key
    honest = Identity.generate().public_key
    owners = [*ground, honest]
    order = RULES.read_order(owners, "rollouts", salt=b"a reader", preferred=lambda key: key == honest)
    assert order[0] == honest and len(order) == limit  # standing (a worker whose rollouts a pool took)
    first, second = (set(RULES.read_order(owners, "rollouts", salt=salt)) for salt in (b"one", b"another"))
    assert first != second  # each reader its own order: a flood cannot aim at the places every reader reads
    assert first != set(sorted(owners)[:limit])  # nor at the lowest keys


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
    ("flags", "error"),
    [
        (["--initial-peers", "/ip4/127.0.0.1/tcp/4000"], "^--initial-peers: .*no /p2p/"),
        (["--initial-peers", "not-a-multiaddr"], "^--initial-peers: "),
        (["--host", "/ip4/300.0.0.1/tcp/1"], "^--host: "),
        (["--announce", "/ip4/1.2.3.4/tcp/0"], "^--announce: "),
    ],
)
def test_bad_flags_name_the_flag(flags: list[str], error: str) -> None:
    parser = argparse.ArgumentParser()
    add_options(parser, NetOptions)
    with pytest.raises(ConfigError, match=error):
        options_from(NetOptions, parser.parse_args(flags)).net_config()


def test_flags_map_to_config() -> None:
    parser = argparse.ArgumentParser()
    add_options(parser, NetOptions)
    args = parser.parse_args(["--initial-peers", PEER, "--no-relay", "--auto-relay", "--client-mode"])
    config = options_from(NetOptions, args).net_config()
    assert config.initial_peers == (PEER,) and not config.use_relay and config.use_auto_relay and config.client_mode
    assert NetOptions().net_config() == NetConfig()  # no flags: the config's defaults


class _Answered:
    def __init__(self, value: object) -> None:
        self.value = value

    def result(self, timeout: float | None = None) -> object:
        return self.value


class _Counted:
    """A DHT handle whose counted store (run in its process) answers (others, here, asked)."""

    def __init__(self, answer: tuple[int, bool, int]) -> None:
        self.answer = answer

    def is_alive(self) -> bool:
        return True

    def run_coroutine(self, *args: object, **kwargs: object) -> _Answered:
        return _Answered(self.answer)


@pytest.mark.parametrize(
    ("answer", "published"),
    [((0, True, 3), False), ((1, True, 3), True), ((2, False, 3), True), ((0, True, 0), True), ((0, False, 0), False)],
)
def test_a_store_is_published_only_when_another_peer_kept_it(answer: tuple[int, bool, int], published: bool) -> None:
    """Only the writer's own node kept it, with peers to ask: not published (hivemind said yes before)."""
    signed = signed_header(VALIDATOR)
    dht = PulseDHT(_Counted(answer), RULES, VALIDATOR, NetConfig())
    stored = dht.store_signed(signed)
    assert stored.others == answer[0] and stored.published is published
    if not published:
        with pytest.raises(NetworkError, match="no peer other than this one"):
            dht.publish(header_of(signed), ttl=60)


class _Found:
    """A DHT handle whose `get` answers the merged records of several storages: more than a read looks at."""

    def __init__(self, signed: list[SignedMessage]) -> None:
        entries = {s.sender: ValueWithExpiration(s.to_bytes(), s.expires_at) for s in signed}
        self.value = ValueWithExpiration(entries, 0.0)

    def is_alive(self) -> bool:
        return True

    def get(self, *args: object, **kwargs: object) -> _Answered:
        return _Answered(self.value)


def test_a_read_of_more_signers_than_it_looks_at_keeps_those_with_standing_first() -> None:
    limit = len(RULES.validators) + POLICIES["heartbeat"].max_signers
    crowd = [Identity.generate() for _ in range(limit + 40)]
    miner = Identity.generate()  # aggregated lately: the reader knows it has standing
    handle = _Found([sign_for(i, beat(i, 3), 600) for i in [*crowd, miner]])
    reader, other = (PulseDHT(handle, RULES, Identity.generate(), NetConfig()) for _ in range(2))
    read = reader.get(Heartbeat, 3, lambda key: key == miner.public_key)
    assert read[0].sender_hex == miner.public_hex and len(read) == limit
    seen, seen_other = ({v.sender_hex for v in dht.get(Heartbeat, 3)} for dht in (reader, other))
    assert seen != seen_other  # the rest in each reader's own order: no key is read first by everyone
