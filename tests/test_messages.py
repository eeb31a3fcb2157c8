"""Wire schemas, canonical bytes, domain-separated signatures and replay detection (in-process)."""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Callable
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.errors import (
    InvalidSignature,
    MalformedPayload,
    ReplayedMessage,
    SizeLimitExceeded,
    TrailingBytes,
    TruncatedPayload,
    UnknownVersion,
    WrongRun,
)
from protocol.identity import Identity
from protocol.messages import (
    MAX_BLOB_BYTES,
    MAX_HELD_BLOBS,
    MAX_POOL_BATCHES,
    MAX_REASON_CHARS,
    MAX_REJECTIONS,
    MAX_ROUND,
    MAX_SELECTED,
    PROTOCOL_VERSION,
    BlobRef,
    CheckpointAnnouncement,
    Heartbeat,
    OuterStep,
    PoolEntry,
    PoolRejection,
    Rejection,
    RolloutAnnouncement,
    RolloutPool,
    RoundMetrics,
    RoundResult,
    ScoredSubmission,
    Standing,
    SubmissionHeader,
)
from protocol.signing import MAX_ENVELOPE_BYTES, SeenCache, SignedMessage, open_any, open_signed, sign
from validator.evidence import RoundEvidence
from validator.state import Book

RUN = hashlib.sha256(b"run-a").hexdigest()
OTHER_RUN = hashlib.sha256(b"run-b").hexdigest()


def h(tag: str) -> str:
    return hashlib.sha256(tag.encode()).hexdigest()


def submission(identity: Identity, round_: int = 3, **changes: object) -> SubmissionHeader:
    fields: dict[str, object] = {
        "run_id": RUN,
        "round": round_,
        "base_state_hash": h("w3"),
        "payload_sha256": h("payload"),
        "payload_size": 12345,
        "codec": "pulseloco",
        "data_digest": h("samples"),
        "sender": identity.public_hex,
    }
    return SubmissionHeader(**{**fields, **changes})  # type: ignore[arg-type]


def worst_round_result() -> RoundResult:
    key = "f" * 64
    return RoundResult(
        run_id=RUN,
        round=2**62,
        selected=tuple(
            ScoredSubmission(sender=h(f"s{i}"), payload_sha256=key, score=-1.2345678901234567e-300)
            for i in range(MAX_SELECTED)
        ),
        rejections=tuple(
            Rejection(sender=h(f"r{i}"), payload_sha256=key, reason="x" * MAX_REASON_CHARS)
            for i in range(MAX_REJECTIONS)
        ),
        base_state_hash=key,
        patch_sha256=key,
        patch_size=2**40,
        new_state_hash=key,
        master_before=key,
        master_after=key,
        outer=OuterStep(lr=-1.2345678901234567e-300 + 1e6, momentum=0.12345678901234567, nesterov=True, steps=2**62),
        evidence=BlobRef(sha256=key, size=2**40),
        master_checkpoint=BlobRef(sha256=key, size=2**40),
    )


def heartbeat() -> Heartbeat:
    return Heartbeat(
        run_id=RUN,
        round=7,
        role="miner",
        peer_id="QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N",
        state_hash=None,
        blobs=tuple(h(str(i)) for i in range(MAX_HELD_BLOBS)),
        sent_at=1_700_000_000,
    )


def checkpoint() -> CheckpointAnnouncement:
    return CheckpointAnnouncement(
        run_id=RUN, round=10, state_hash=h("w10"), blob_sha256=h("ckpt"), blob_size=99, format="safetensors"
    )


# -- schemas -------------------------------------------------------------------------------------


def test_every_kind_roundtrips_through_canonical_bytes() -> None:
    me = Identity.generate()
    for message in (submission(me), worst_round_result(), heartbeat(), checkpoint()):
        data = message.canonical_bytes()
        assert type(message).from_canonical(data) == message
        assert b" " not in data.replace(b"x" * MAX_REASON_CHARS, b"")  # no whitespace in the encoding


def test_worst_case_message_fits_a_dht_value() -> None:
    signed = sign(Identity.generate(), worst_round_result())
    assert len(signed.to_bytes()) <= MAX_ENVELOPE_BYTES < 64 * 1024


def worst_round_metrics() -> RoundMetrics:
    long = -1.2345678901234567e-300
    return RoundMetrics(
        run_id=RUN,
        round=2**62,
        held_out_loss=1.2345678901234567e-300,
        held_out_reward=long,
        submissions=2**31,
        received_bytes=2**40,
        dense_bytes=2**40,
        standings=tuple(
            Standing(sender=h(f"m{i}"), rating=long, indicator=long) for i in range(MAX_SELECTED + MAX_REJECTIONS)
        ),
    )


def test_round_metrics_roundtrip_fit_a_dht_value_and_bound_their_fields() -> None:
    metrics = worst_round_metrics()
    assert RoundMetrics.from_canonical(metrics.canonical_bytes()) == metrics
    assert len(sign(Identity.generate(), metrics).to_bytes()) <= MAX_ENVELOPE_BYTES
    fields = metrics.model_dump(mode="json")
    for change in ({"held_out_loss": -1.0}, {"schema_version": 2}, {"submissions": 2**31 + 1}, {"dense_bytes": -1}):
        with pytest.raises(MalformedPayload):
            RoundMetrics.from_canonical(_dumps({**fields, **change}))
    too_many = [*fields["standings"], fields["standings"][0]]
    with pytest.raises(MalformedPayload):
        RoundMetrics.from_canonical(_dumps({**fields, "standings": too_many}))


def _dumps(fields: dict[str, object]) -> bytes:
    import json

    return json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()


@pytest.mark.parametrize(
    ("body", "where"),
    [
        (b"[]", "body"),
        (b"{}", "run_id"),
        (b"not json", "body"),
    ],
)
def test_malformed_bodies_are_rejected(body: bytes, where: str) -> None:
    with pytest.raises(MalformedPayload, match=where):
        SubmissionHeader.from_canonical(body)


@pytest.mark.parametrize(
    "change",
    [
        {"round": "3"},
        {"round": 3.0},
        {"round": -1},
        {"payload_size": -5},
        {"payload_size": True},
        {"payload_sha256": "ABC"},
        {"payload_sha256": "G" * 64},
        {"sender": "ab" * 31},
        {"codec": "Pulse LoCo"},
        {"codec": "x" * 64},
        {"extra_field": 1},
    ],
)
def test_strict_schema_rejects_bad_fields(change: dict[str, object]) -> None:
    me = Identity.generate()
    good = submission(me).model_dump(mode="json")
    with pytest.raises(MalformedPayload):
        SubmissionHeader.from_canonical(_json({**good, **change}))


def test_non_canonical_encoding_is_rejected() -> None:
    data = submission(Identity.generate()).canonical_bytes()
    with pytest.raises(MalformedPayload, match="canonical"):
        SubmissionHeader.from_canonical(data.replace(b",", b", ", 1))


def test_round_result_bounds_and_outcomes() -> None:
    good = worst_round_result().model_dump(mode="json")
    too_many = {**good, "rejections": [*good["rejections"], good["rejections"][0]]}
    with pytest.raises(MalformedPayload, match="at most"):
        RoundResult.from_canonical(_json(too_many))
    first = good["selected"][0]
    rejected_too = {"sender": first["sender"], "payload_sha256": first["payload_sha256"], "reason": "x"}
    twice = {**good, "selected": [first], "rejections": [rejected_too]}
    with pytest.raises(MalformedPayload, match="more than one outcome"):
        RoundResult.from_canonical(_json(twice))
    nan = {**good, "selected": [{**good["selected"][0], "score": float("inf")}], "rejections": []}
    with pytest.raises(MalformedPayload, match="finite"):
        RoundResult.from_canonical(_json(nan))


def test_reason_must_be_printable_ascii() -> None:
    with pytest.raises(ValueError):
        Rejection(sender=h("a"), payload_sha256=h("b"), reason="bad\nline")


def _json(obj: object) -> bytes:
    import json

    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


# -- signatures ----------------------------------------------------------------------------------


def test_sign_and_open() -> None:
    me = Identity.generate()
    signed = sign(me, submission(me))
    verified = open_signed(signed.to_bytes(), run_id=RUN, expect=SubmissionHeader)
    assert verified.message == submission(me)
    assert verified.sender_hex == me.public_hex
    assert open_any(signed.to_bytes(), run_id=RUN).message == submission(me)


def test_message_id_is_stable_and_distinct() -> None:
    me = Identity.generate()
    a, b = sign(me, submission(me, round_=3)), sign(me, submission(me, round_=4))
    assert a.message_id == SignedMessage.from_bytes(a.to_bytes()).message_id
    assert a.message_id != b.message_id


def _moved(signed: SignedMessage, **changes: object) -> SignedMessage:
    """Change an envelope field but keep the original signature (a cross-domain replay)."""
    return replace(signed, **changes)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("changes", "error"),
    [
        ({"run_id": OTHER_RUN}, WrongRun),
        ({"round": 4}, InvalidSignature),
        ({"kind": "heartbeat"}, MalformedPayload),
        ({"sender": Identity.generate().public_key}, InvalidSignature),
        ({"expires_ms": 2**40}, InvalidSignature),  # freshness is signed: nobody can extend a record's life
    ],
)
def test_signature_is_bound_to_its_domain(changes: dict[str, object], error: type[Exception]) -> None:
    me = Identity.generate()
    moved = _moved(sign(me, submission(me)), **changes)
    with pytest.raises(error):
        open_signed(moved.to_bytes(), run_id=RUN, expect=SubmissionHeader)


def test_signature_from_another_run_never_verifies_here() -> None:
    me = Identity.generate()
    theirs = sign(me, submission(me).model_copy(update={"run_id": OTHER_RUN}))
    with pytest.raises(WrongRun):
        open_signed(theirs.to_bytes(), run_id=RUN, expect=SubmissionHeader)
    # Relabel the envelope as ours: the signature covers the run id, so it fails.
    relabelled = replace(theirs, run_id=RUN)
    with pytest.raises(InvalidSignature):
        open_signed(relabelled.to_bytes(), run_id=RUN, expect=SubmissionHeader)


def test_signature_from_another_version_never_verifies() -> None:
    me = Identity.generate()
    signed = replace(sign(me, submission(me)), version=PROTOCOL_VERSION + 1)
    with pytest.raises(UnknownVersion):
        SignedMessage.from_bytes(signed.to_bytes())
    # A signature made under an older version, presented as this one, does not verify.
    legacy = replace(sign(me, submission(me)), version=PROTOCOL_VERSION - 1, signature=b"")
    legacy = replace(legacy, signature=me.sign(legacy.preimage()))
    with pytest.raises(InvalidSignature):
        replace(legacy, version=PROTOCOL_VERSION).open(run_id=RUN, expect=SubmissionHeader)


def test_body_and_envelope_must_agree_on_sender() -> None:
    me, other = Identity.generate(), Identity.generate()
    # `me` signs a header that claims `other` sent it.
    signed = sign(me, submission(other))
    with pytest.raises(MalformedPayload, match="different sender"):
        signed.open(run_id=RUN, expect=SubmissionHeader)


def test_tampered_body_fails() -> None:
    me = Identity.generate()
    signed = sign(me, submission(me))
    body = signed.body.replace(b"12345", b"99999")
    with pytest.raises(InvalidSignature):
        replace(signed, body=body).open(run_id=RUN, expect=SubmissionHeader)


def test_framing_errors() -> None:
    me = Identity.generate()
    data = sign(me, submission(me)).to_bytes()
    with pytest.raises(TruncatedPayload):
        SignedMessage.from_bytes(data[:-1])
    with pytest.raises(TrailingBytes):
        SignedMessage.from_bytes(data + b"\x00")
    with pytest.raises(MalformedPayload, match="magic"):
        SignedMessage.from_bytes(b"XXXX" + data[4:])
    with pytest.raises(SizeLimitExceeded):
        SignedMessage.from_bytes(data + b"\x00" * MAX_ENVELOPE_BYTES)
    body_len_at = 4 + 3 + len("submission") + 32 + 8 + 8 + 32  # magic, version+kind len, kind, run, round, expires, key
    huge_len = data[:body_len_at] + struct.pack(">I", 2**31) + data[body_len_at + 4 :]
    with pytest.raises(SizeLimitExceeded, match="body"):
        SignedMessage.from_bytes(huge_len)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=600))
def test_arbitrary_bytes_never_crash_the_parser(data: bytes) -> None:
    with pytest.raises(MalformedPayload):
        open_any(data, run_id=RUN)


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0), st.integers(min_value=0, max_value=255))
def test_any_single_byte_change_is_rejected(position: int, value: int) -> None:
    me = Identity.generate()
    data = bytearray(sign(me, submission(me)).to_bytes())
    position %= len(data)
    if data[position] == value:
        return
    data[position] = value
    with pytest.raises((MalformedPayload, InvalidSignature, WrongRun)):
        open_signed(bytes(data), run_id=RUN, expect=SubmissionHeader)


# -- replays -------------------------------------------------------------------------------------


def test_replay_is_detected_by_id() -> None:
    me = Identity.generate()
    seen = SeenCache()
    data = sign(me, submission(me)).to_bytes()
    seen.check(SignedMessage.from_bytes(data))
    with pytest.raises(ReplayedMessage):
        seen.check(SignedMessage.from_bytes(data))
    seen.check(sign(me, submission(me, round_=4)))  # a new message is not a replay


def test_seen_cache_is_bounded_and_rebuildable() -> None:
    seen = SeenCache(capacity=3)
    for i in range(5):
        assert seen.add(str(i))
    assert len(seen) == 3 and "0" not in seen and "4" in seen
    assert not seen.add("4")
    rebuilt = SeenCache(capacity=3, ids=seen.ids())
    assert rebuilt.ids() == seen.ids()


def worst_rollout_pool() -> RolloutPool:
    return RolloutPool(
        run_id=RUN,
        round=MAX_ROUND,
        entries=tuple(
            PoolEntry(worker=h(f"w{i}"), round=MAX_ROUND, blob_sha256=h(f"b{i}"), blob_size=MAX_BLOB_BYTES)
            for i in range(MAX_POOL_BATCHES)
        ),
        rejections=tuple(
            PoolRejection(worker=h(f"x{i}"), blob_sha256=h(f"c{i}"), reason="x" * MAX_REASON_CHARS)
            for i in range(MAX_POOL_BATCHES)
        ),
    )


def test_rl_messages_roundtrip_and_the_worst_pool_fits_a_dht_value() -> None:
    announcement = RolloutAnnouncement(
        run_id=RUN, round=4, state_hash=h("w4"), blob_sha256=h("r"), blob_size=999, groups=16, mean_reward=0.25
    )
    for message in (announcement, worst_rollout_pool()):
        assert type(message).from_canonical(message.canonical_bytes()) == message
    signed = sign(Identity.generate(), worst_rollout_pool())
    assert len(signed.to_bytes()) <= MAX_ENVELOPE_BYTES < 64 * 1024


def test_a_pool_lists_each_batch_once_and_is_never_empty() -> None:
    entry = PoolEntry(worker=h("w"), round=1, blob_sha256=h("b"), blob_size=10)
    with pytest.raises(ValueError, match="twice"):
        RolloutPool(run_id=RUN, round=2, entries=(entry, entry), rejections=())
    with pytest.raises(ValueError):
        RolloutPool(run_id=RUN, round=2, entries=(), rejections=())


def _valid_evidence() -> bytes:
    book = Book(round=0, outer_steps=0, ratings={}, indicators={}, seen=[], states=[h("s")])
    evidence = RoundEvidence(
        run_id=h("run"), round=0, secret="ab" * 64, median_norm=0.0, clip_to=0.0,
        aggregated=(), headers=(), assessed=(), book=book,
    )  # fmt: skip
    return evidence.to_bytes()


def _valid_heartbeat() -> bytes:
    peer = "Qm" + "a" * 44
    beat = Heartbeat(run_id=h("run"), round=0, role="miner", peer_id=peer, state_hash=None, blobs=(), sent_at=1)
    return beat.canonical_bytes()


@pytest.mark.parametrize(
    ("parse", "valid"),
    [(Heartbeat.from_canonical, _valid_heartbeat), (RoundEvidence.from_bytes, _valid_evidence)],
    ids=["wire body", "evidence"],
)
def test_a_key_a_peer_chose_cannot_forge_a_log_line(
    parse: Callable[[bytes], object], valid: Callable[[], bytes]
) -> None:
    """Wire bodies and round evidence share one parser: an unknown key is named escaped, on one line."""
    body = json.loads(valid())
    parse(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())  # the valid one parses
    body["x\n2026-01-01 INFO round 9 closed: 9 aggregated"] = 1
    with pytest.raises(MalformedPayload) as caught:
        parse(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())
    text = str(caught.value)
    assert "\n" not in text and "\\n2026-01-01" in text
