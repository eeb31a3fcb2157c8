"""The Gauntlet validator: intake checks, scoring pieces, ratings, and whole rounds against fake miners."""

from __future__ import annotations

import hashlib
import itertools
from pathlib import Path

import pytest
import torch

from node.bench.arena import Arena
from node.events.metrics import reason_class
from node.roles.validator_service import senders_to_wait_for
from node.swarm.fakeminers import KINDS, Miner, RoundView, identity_for
from protocol.assignment import Assignment, data_digest
from protocol.messages import RoundResult, SubmissionHeader
from protocol.signing import SeenCache, open_signed, sign
from tests.fakeswarm import RUN_ID, make_swarm
from tests.tracked import Tracked
from validator.config import GauntletConfig
from validator.gauntlet import Decision, RoundPipeline, round_device
from validator.intake import RoundContext, Submission, reason_text, screen
from validator.ratings import Ratings
from validator.scoring import CopyCandidate, Gains, RoundSecret, Sketch, copy_owners

OTHER_RUN = hashlib.sha256(b"another run").hexdigest()
STATE = hashlib.sha256(b"state r").hexdigest()
OLD_STATE = hashlib.sha256(b"state r-2").hexdigest()


# --- data assignment --------------------------------------------------------------------------


def test_assignment_is_a_pure_function_of_run_round_and_key() -> None:
    a = Assignment(RUN_ID, 3, "ab" * 32, 4)
    assert a.seeds == Assignment(RUN_ID, 3, "ab" * 32, 4).seeds and len(set(a.seeds)) == 4
    assert all(0 <= s < 2**63 for s in a.seeds)
    assert a.step_seed(5) == a.seeds[1]
    for other in (Assignment(RUN_ID, 4, "ab" * 32, 4), Assignment(RUN_ID, 3, "cd" * 32, 4)):
        assert not set(other.seeds) & set(a.seeds) and other.digest != a.digest
    assert a.digest == data_digest(a.seeds) and Assignment(RUN_ID, 3, "ab" * 32, 2).seeds == a.seeds[:2]
    with pytest.raises(ValueError):
        Assignment(RUN_ID, 3, "ab" * 32, 0)


# --- intake -----------------------------------------------------------------------------------


def context(**changes: object) -> RoundContext:
    fields: dict[str, object] = {
        "run_id": RUN_ID,
        "round": 7,
        "state_hash": STATE,
        "earlier_states": {OLD_STATE: 5},
        "codec": "sparseloco",
        "assignment_batches": 2,
        "max_payload_bytes": 1000,
        "max_submissions": 128,
    }
    fields.update(changes)
    return RoundContext(**fields)  # type: ignore[arg-type]


def submission(label: str, payload: bytes = b"payload", **changes: object) -> Submission:
    identity = identity_for(label)
    fields: dict[str, object] = {
        "run_id": RUN_ID,
        "round": 7,
        "base_state_hash": STATE,
        "payload_sha256": hashlib.sha256(payload).hexdigest(),
        "payload_size": len(payload),
        "codec": "sparseloco",
        "data_digest": Assignment(RUN_ID, 7, identity.public_hex, 2).digest,
        "sender": identity.public_hex,
    }
    fields.update(changes)
    return Submission(sign(identity, SubmissionHeader(**fields)).to_bytes(), payload)  # type: ignore[arg-type]


def test_intake_sorts_every_submission_and_changes_nothing() -> None:
    good = submission("good")
    tampered = bytearray(submission("forged").envelope)
    tampered[-1] ^= 1
    seen = SeenCache(ids=["x"])
    subs = [
        good,
        Submission(bytes(tampered), b"payload"),  # bad signature
        Submission(b"junk", b""),  # not an envelope
        submission("other-run", run_id=OTHER_RUN),
        submission("stale", round=6),
        submission("future", round=8),
        good,  # the same message again: a replay
        submission("good", b"second payload"),  # second submission from the same key
        submission("codec", codec="dense"),
        submission("behind", base_state_hash=OLD_STATE),
        submission("unknown", base_state_hash="0" * 64),
        submission("oversize", b"x" * 1001),
        submission("short", payload_size=3),
        submission("hash", payload_sha256="0" * 64),
        submission("digest", data_digest="0" * 64),
        submission("good2"),
    ]
    out = screen(subs, context(), seen)
    assert [c.index for c in out.candidates] == [0, 15]
    by_index = {r.index: r for r in out.refusals}
    assert sorted(by_index) == list(range(1, 15))
    ignored = {1: "InvalidSignature", 2: "bad envelope", 3: "WrongRun", 4: "stale round 6", 5: "future round 8"}
    ignored[6] = "replay of message"
    ignored[7] = "second submission"
    for i, text in ignored.items():
        assert text in by_index[i].reason and not by_index[i].named
    named = {8: "codec dense", 9: "behind: trained from the state of round 5", 10: "unknown base state"}
    named |= {11: "oversize", 12: "payload is 7 bytes, header says 3", 13: "SHA-256", 14: "data digest"}
    for i, text in named.items():
        assert text in by_index[i].reason and by_index[i].named
    assert len(seen) == 1 and len(out.message_ids) == 10  # ids enter the cache only when the round commits


def test_intake_replays_across_rounds_and_the_submission_cap() -> None:
    first = submission("a")
    out = screen([first], context(), SeenCache())
    seen = SeenCache(ids=out.message_ids)
    again = screen([first], context(), seen)
    assert not again.candidates and "replay" in again.refusals[0].reason
    capped = screen([submission("a"), submission("b")], context(max_submissions=1), SeenCache())
    assert len(capped.candidates) == 1 and "round is full" in capped.refusals[0].reason
    many = [submission(f"s{i}") for i in range(5)] + [submission(f"s{i}", b"again") for i in range(5)]
    crowded = screen(many, context(max_submissions=3), SeenCache())
    assert len(crowded.candidates) == 3 and not any(r.named for r in crowded.refusals)  # the result stays small


def test_reason_text_is_one_safe_line() -> None:
    assert reason_text("bad\nthing \x00é") == "bad thing ??"
    assert len(reason_text("x" * 500)) == 100 and reason_text("") == "rejected"


# --- scoring pieces ---------------------------------------------------------------------------


def test_sketch_overlap_and_cosine() -> None:
    u = {"a": torch.tensor([0.0, 1.0, 0.0, 2.0, 0.0, 3.0]), "b": torch.tensor([4.0, 0.0])}
    s = Sketch.of(u, stride=1, offset=0)
    assert s.positions.tolist() == [1, 3, 5, 6] and s.overlap(s) == 1.0 and s.cosine(s) == pytest.approx(1.0)
    flipped = Sketch.of({k: -v for k, v in u.items()}, 1, 0)
    assert flipped.cosine(s) == pytest.approx(-1.0)
    other = Sketch.of({"a": torch.tensor([1.0, 0, 1, 0, 1, 0]), "b": torch.tensor([0.0, 1])}, 1, 0)
    assert other.overlap(s) == 0.0 and other.cosine(s) == 0.0
    assert Sketch.of(u, stride=2, offset=1).positions.tolist() == [0, 1, 2]  # a[1], a[3], a[5]


def test_copy_owner_is_the_member_on_record() -> None:
    sk = Sketch.of({"a": torch.ones(4)}, 1, 0)

    def item(i: int, margin: float, indicator: int, payload: str = "p") -> CopyCandidate:
        return CopyCandidate(i, payload, sk, margin, indicator)

    # nobody on record: one round's margin cannot tell author from copier, so every member is a copy
    assert copy_owners([item(0, -0.1, -1), item(1, 0.3, 1)], 0.5, 0.9) == {0: 1, 1: 0}
    assert copy_owners([item(0, 0.2, 1), item(1, 0.1, 1), item(2, 0.3, 1)], 0.5, 0.9) == {0: 2, 1: 0, 2: 1}
    distinct = Sketch.of({"a": torch.tensor([1.0, 0, 0, 0])}, 1, 0)
    assert copy_owners([item(0, 0.1, 1), CopyCandidate(1, "q", distinct, 0.1, 1)], 0.5, 0.9) == {}
    # the record first: a miner with a history keeps its update against a near copy that got +1 by chance
    established = CopyCandidate(0, "p", sk, -0.01, -1, 0.3, prior=0.35)
    lucky = CopyCandidate(1, "p", sk, 0.02, 1, 0.05)
    assert copy_owners([lucky, established], 0.5, 0.9) == {1: 0}
    # between two on record, the better record owns it, whatever this round's margins say
    victim = CopyCandidate(0, "p", sk, -0.2, -1, 0.4, prior=0.5)
    copier = CopyCandidate(1, "p", sk, 0.3, 1, 0.2, prior=0.1)
    assert copy_owners([victim, copier], 0.5, 0.9) == {1: 0}


def test_one_lucky_round_does_not_hand_a_copier_its_victims_update() -> None:
    """Round 0: the author's indicator came out -1 and its near copy's +1 (noise on a fresh batch);
    in round 1 the copier is ahead on record by one round's worth, which is not a lead."""
    sk = Sketch.of({"a": torch.ones(4)}, 1, 0)
    decay = GauntletConfig().indicator_decay
    one = 1 - decay  # what one round's indicator moves an average by
    author = CopyCandidate(0, "p", sk, 0.01, 1, prior=-one)
    copier = CopyCandidate(1, "q", sk, 0.02, 1, prior=one)
    lead = GauntletConfig().copy_owner_lead
    assert copy_owners([author, copier], 0.5, 0.9, lead) == {0: 1, 1: 0}  # both refused
    assert copy_owners([author, copier], 0.5, 0.9, 0.0) == {0: 1}  # without a lead the copier took it
    # two rounds in which the author beat its copier: the author leads and owns the update
    ahead = decay * one + one
    author, copier = (CopyCandidate(0, "p", sk, 0.01, 1, prior=ahead), CopyCandidate(1, "q", sk, 0.02, 1, prior=-ahead))
    assert copy_owners([author, copier], 0.5, 0.9, lead) == {1: 0}


def test_round_secret_is_private_but_stable() -> None:
    a = RoundSecret.derive(identity_for("v"), RUN_ID, 3)
    assert a == RoundSecret.derive(identity_for("v"), RUN_ID, 3)
    assert a != RoundSecret.derive(identity_for("w"), RUN_ID, 3) != RoundSecret.derive(identity_for("v"), RUN_ID, 4)
    picked = a.assigned_indices("ab" * 32, 5, 3)
    assert len(set(picked)) == 3 and all(0 <= j < 5 for j in picked) and a.assigned_indices("ab" * 32, 2, 3) == [0, 1]
    assert len(set(a.random_seeds(4))) == 4


# --- ratings ----------------------------------------------------------------------------------


def test_ratings_rank_invalid_and_missing_last_and_survive_absence() -> None:
    ratings = Ratings(7.0, 0.1, 2, {})
    ratings = ratings.rate(0, [("a", 0.3), ("b", 0.1)], ["c"])
    assert ratings.records["a"].mu > ratings.records["b"].mu > ratings.records["c"].mu
    ratings = ratings.rate(1, [("b", 0.2), ("c", 0.1)], [])  # a is missing: ranks last
    assert ratings.records["a"].mu < ratings.rate(0, [], []).records["a"].mu + 1e-9
    frozen = ratings.rate(5, [("b", 0.2), ("c", 0.1)], []).records["a"]  # away > 2 rounds: sits out
    assert frozen == ratings.records["a"]
    back = ratings.rate(6, [("a", 0.9), ("b", 0.2)], [])
    assert back.records["a"].last_round == 6 and back.records["a"].mu > frozen.mu
    assert ratings.ordinal("newcomer") == pytest.approx(0.0)
    with pytest.raises(ValueError):
        ratings.rate(7, [("a", 0.1)], ["a"])


# --- whole rounds -----------------------------------------------------------------------------


@pytest.mark.parametrize("ahead", [0, 2])
def test_pipeline_decodes_one_update_at_a_time(tmp_path: Path, ahead: int) -> None:
    """One decoded update in use at a time, and at most `decode_ahead` more decoded ahead of it."""
    swarm = make_swarm(decode_ahead=ahead)
    v = swarm.validator(tmp_path)
    view = RoundView(0, v.weights, v.state_hash, None)
    subs = [m.submit(view) for m in swarm.honest(5)]
    screened = screen(
        [s for s in subs if s is not None],
        v.context(RoundPipeline(swarm.cfg, v.weights, v.evaluator, v.batch_fn)),
        v.seen,
    )

    class Counting(RoundPipeline):
        def decode(self, payload: bytes) -> dict[str, torch.Tensor]:
            return Tracked(super().decode(payload))

    pipeline = Counting(swarm.cfg, v.weights, v.evaluator, v.batch_fn)
    secret = RoundSecret.derive(identity_for("validator"), RUN_ID, 0)
    Tracked.alive = Tracked.peak = 0
    decision = pipeline.decide(screened, secret, v.standing(), run_id=RUN_ID, round_=0)
    assert all("indicator average" in o.reason for o in decision.outcomes)  # no history yet: none selected
    inspection = pipeline.inspect(screened.candidates, secret)
    assert pipeline.aggregate(inspection.assessments) is not None
    assert len(decision.outcomes) == 5 and 1 <= Tracked.peak <= 1 + ahead


def test_decide_is_the_whole_decision_and_changes_nothing(tmp_path: Path) -> None:
    """`run_round` publishes what `RoundPipeline.decide` decided, and commits its standing; deciding
    twice from the same state gives the same decision and leaves the validator as it was."""
    swarm = make_swarm(min_indicator_average=0.05)
    honest = swarm.honest(3)
    arena = Arena(swarm.validator(tmp_path), [*honest, *swarm.adversaries(("copycat", "signflip"), [honest[0].key])])
    arena.play()
    v = arena.validator
    subs, _, _ = arena.submissions()
    book = v.book

    def decide() -> Decision:
        pipeline = RoundPipeline(v.cfg, v.weights, v.evaluator, v.batch_fn)
        screened = screen(subs, v.context(pipeline), v.seen)
        secret = RoundSecret.derive(identity_for("validator"), RUN_ID, v.round)
        return pipeline.decide(screened, secret, v.standing(), run_id=RUN_ID, round_=v.round)

    decision, again = decide(), decide()
    assert (again.outcomes, again.scored, again.rejections) == (decision.outcomes, decision.scored, decision.rejections)
    assert again.standing == decision.standing and v.book == book
    report = v.run_round(subs)
    assert report.outcomes == decision.outcomes and report.selected()
    assert (report.result.selected, report.result.rejections) == (decision.scored, decision.rejections)
    assert v.book.ratings == decision.standing.ratings.records
    assert v.book.indicators == decision.standing.indicators


@pytest.fixture(scope="module")
def arena_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Arena, list[Miner], list[float]]:
    swarm = make_swarm()
    honest = swarm.honest(4)
    attackers = swarm.adversaries(KINDS, [m.key for m in honest])
    arena = Arena(swarm.validator(tmp_path_factory.mktemp("gauntlet")), [*honest, *attackers], seed=3)
    losses = [swarm.held_out_loss(arena.validator.weights)]
    for _ in range(8):
        losses.append(swarm.held_out_loss(arena.play().weights))
    return arena, honest, losses


def test_only_honest_submissions_are_aggregated_and_loss_goes_down(
    arena_run: tuple[Arena, list[Miner], list[float]],
) -> None:
    arena, honest, losses = arena_run
    aggregated = [rec.senders[o.index] for rec in arena.records for o in rec.report.selected()]
    assert {rec.kinds[o.index] for rec in arena.records for o in rec.report.selected()} == {"honest"}
    assert {m.key for m in honest} <= set(aggregated)  # every honest miner made it at least once
    # the first aggregation is in round 2: three honest rounds lift an indicator average to 0.14
    assert losses[0] == losses[1] == losses[2] and losses[-1] < losses[0] - 0.5
    assert all(after < before for before, after in itertools.pairwise(losses[2:]))


def test_each_attack_is_stopped_for_its_own_reason(arena_run: tuple[Arena, list[Miner], list[float]]) -> None:
    arena, _, _ = arena_run
    expected = {
        "signflip": ("norm ",),
        "noise": ("norm ",),
        "nan": ("undecodable: NonFiniteValues",),
        "freerider": ("free rider",),
        "replay": ("replay of message", "stale round"),
        "behind": ("behind: trained from", "unknown base state"),
        "copycat": ("copy of", "indicator average"),
        "thief": ("copy of", "indicator average", "final score", "rating ordinal"),
        "quietnoise": ("score ", "indicator average"),
    }
    for rec in arena.records:
        for o in rec.report.outcomes:
            kind = rec.kinds[o.index]
            if kind != "honest":
                assert o.status != "selected" and o.reason.startswith(expected[kind]), (kind, o.reason)
    behind = [o.reason for rec in arena.records for o in rec.report.outcomes if rec.kinds[o.index] == "behind"]
    assert any(r.startswith("behind: trained from the state of round") for r in behind)
    copies = [o.reason for rec in arena.records for o in rec.report.outcomes if rec.kinds[o.index] == "copycat"]
    assert sum(r.startswith("copy of") for r in copies) >= len(copies) // 2  # exact and near copies both caught


def test_every_submission_gets_exactly_one_outcome(arena_run: tuple[Arena, list[Miner], list[float]]) -> None:
    arena, _, _ = arena_run
    previous = None
    for rec in arena.records:
        report = rec.report
        assert [o.index for o in report.outcomes] == list(range(len(rec.kinds)))
        signed = open_signed(report.envelope, run_id=RUN_ID, expect=RoundResult)
        assert signed.message == report.result and signed.sender_hex == identity_for("validator").public_hex
        named = {(o.sender, o.payload_sha256) for o in report.outcomes if o.status != "ignored"}
        listed = [(s.sender, s.payload_sha256) for s in report.result.selected]
        listed += [(r.sender, r.payload_sha256) for r in report.result.rejections]
        assert len(listed) == len(set(listed)) and set(listed) == named
        assert all(rec.kinds[o.index] in ("replay",) for o in report.outcomes if o.status == "ignored")
        assert report.result.patch_sha256 == hashlib.sha256(report.patch).hexdigest()
        if previous is not None:
            assert report.result.base_state_hash == previous
        previous = report.state_hash


def test_every_reason_the_validator_gives_has_its_metrics_class(
    arena_run: tuple[Arena, list[Miner], list[float]],
) -> None:
    """`pulse_submissions_rejected_total{reason}` reduces reasons to fixed classes (node/events/metrics.py):
    none of the validator's own reasons falls to "other", each attack lands in its own class."""
    tampered = bytearray(submission("forged").envelope)
    tampered[-1] ^= 1
    good = submission("good")
    subs = [
        (good, None),
        (Submission(bytes(tampered), b"payload"), "envelope"),
        (Submission(b"junk", b""), "envelope"),
        (submission("other-run", run_id=OTHER_RUN), "envelope"),
        (submission("stale", round=6), "round"),
        (submission("future", round=8), "round"),
        (good, "replay"),
        (submission("good", b"second payload"), "duplicate"),
        (submission("codec", codec="dense"), "codec"),
        (submission("behind", base_state_hash=OLD_STATE), "behind"),
        (submission("unknown", base_state_hash="0" * 64), "unknown_base"),
        (submission("oversize", b"x" * 1001), "oversize"),
        (submission("short", payload_size=3), "payload_mismatch"),
        (submission("hash", payload_sha256="0" * 64), "payload_mismatch"),
        (submission("digest", data_digest="0" * 64), "data_digest"),
        (submission("full"), "round_full"),
    ]
    out = screen([sub for sub, _ in subs], context(max_submissions=8), SeenCache())
    assert {r.index: reason_class(r.reason) for r in out.refusals} == {i: c for i, (_, c) in enumerate(subs) if c}
    arena, _, _ = arena_run
    expected = {
        "signflip": {"norm"},
        "noise": {"norm"},
        "nan": {"undecodable"},
        "freerider": {"free_rider"},
        "replay": {"replay", "round"},
        "behind": {"behind", "unknown_base"},
        "copycat": {"copy", "indicator"},
        "thief": {"copy", "indicator", "not_positive", "rank"},
        "quietnoise": {"no_gain", "indicator"},
        # a copied honest miner before it has a record: the whole copy group is refused
        "honest": {"copy", "indicator", "no_gain", "not_positive", "rank"},
    }
    classes = [
        (rec.kinds[o.index], reason_class(o.reason))
        for rec in arena.records
        for o in rec.report.outcomes
        if o.status != "selected"
    ]
    assert all(c in expected[kind] for kind, c in classes), classes
    assert {"norm", "undecodable", "free_rider", "copy", "indicator"} <= {c for _, c in classes}


def test_a_round_decodes_each_payload_once_and_spills_within_its_budget(tmp_path: Path) -> None:
    """With a spill folder, inspect, evaluate and aggregate decode each distinct payload once and read
    it back from disk; the decision and the aggregate are those of decoding every time; `close`
    deletes the files; a budget too small for one update decodes again, as without a spill."""
    swarm = make_swarm()
    v = swarm.validator(tmp_path / "v")
    view = RoundView(0, v.weights, v.state_hash, None)
    subs = [s for s in (m.submit(view) for m in swarm.honest(4)) if s is not None]
    screened = screen(subs, v.context(RoundPipeline(swarm.cfg, v.weights, v.evaluator, v.batch_fn)), v.seen)
    secret = RoundSecret.derive(identity_for("validator"), RUN_ID, 0)

    def run(budget: int, spill: Path | None) -> tuple[Decision, dict[str, torch.Tensor] | None, int]:
        calls = 0

        class Counting(RoundPipeline):
            def decode(self, payload: bytes) -> dict[str, torch.Tensor]:
                nonlocal calls
                calls += 1
                return super().decode(payload)

        cfg = swarm.cfg.model_copy(update={"decoded_spill_bytes": budget})
        with Counting(cfg, v.weights, v.evaluator, v.batch_fn, spill) as pipeline:
            decision = pipeline.decide(screened, secret, v.standing(), run_id=RUN_ID, round_=0)
            inspection = pipeline.inspect(screened.candidates, secret)
            aggregated = pipeline.aggregate([a for a in inspection.assessments if a.problem is None])
            update = aggregated.update if aggregated is not None else None
            spilled = len(list(spill.iterdir())) if spill is not None else 0
            assert spilled == (4 if budget == 2**30 else 0)  # one file per distinct payload, if it fits
        assert spill is None or not spill.exists()  # closed: nothing left
        return decision, update, calls

    plain, plain_update, plain_calls = run(0, None)
    spilled, spilled_update, spilled_calls = run(2**30, tmp_path / "spill")  # decide, inspect, aggregate
    tight, _, tight_calls = run(1, tmp_path / "tight")
    assert spilled_calls == 4 and plain_calls > 2 * spilled_calls and tight_calls == plain_calls
    assert spilled.outcomes == plain.outcomes == tight.outcomes
    assert plain_update is not None and spilled_update is not None
    assert all(torch.equal(plain_update[n], spilled_update[n]) for n in plain_update)


# --- few miners -------------------------------------------------------------------------------


@pytest.mark.parametrize("miners", [1, 2])
def test_one_or_two_miners_train(tmp_path: Path, miners: int) -> None:
    """A run starts with one miner. Its update must not be its own reference (the margin would be 0
    and the indicator -1 every round): alone it gets the plain own-data check, two are each judged
    against the other. Both runs aggregate and the held-out loss goes down."""
    swarm = make_swarm(min_indicator_average=0.0)
    arena = Arena(swarm.validator(tmp_path), swarm.honest(miners))
    before = swarm.held_out_loss(arena.validator.weights)
    for _ in range(4):
        arena.play()
    aggregated = sum(len(rec.report.selected()) for rec in arena.records)
    assert aggregated >= 2 * miners, [o.reason for rec in arena.records for o in rec.report.outcomes]
    assert swarm.held_out_loss(arena.validator.weights) < before - 0.1
    gains = [o.gains for rec in arena.records for o in rec.report.outcomes if o.gains is not None]
    if miners == 1:
        assert all(g.assigned_ref == g.random_ref == 0.0 for g in gains)  # no reference at all
    else:
        assert all(g.assigned_ref != g.assigned for g in gains)  # the other's update, not its own


def test_a_round_works_on_the_evaluators_device_when_it_has_room(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a card whose free memory holds the round's states (two BF16 weights, six FP32 updates with
    two decoded ahead: two sums of directions, a reference, the update in use) the round works there;
    with less it works on the host and says so."""
    weights = {"w": torch.zeros(1000, dtype=torch.bfloat16)}  # 2 x 2 kB + 4 kB x (4 + 2) = 28 kB
    cuda = torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (100_000, 10**9))
    assert round_device(cuda, weights, 2) == cuda
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (25_000, 10**9))
    assert round_device(cuda, weights, 2) == torch.device("cpu")
    assert round_device(cuda, weights, 0) == cuda  # nothing decoded ahead: 20 kB
    assert round_device(torch.device("cpu"), weights, 2) == torch.device("cpu")


def test_quiet_noise_passes_every_check_before_evaluation_and_is_waited_for_only_if_aggregated(tmp_path: Path) -> None:
    """Random noise at an honest update's norm costs no work, yet is decoded, inside the norm band,
    no copy of anything public, and evaluated: only its gains can keep it out, and its indicator
    stays -1 (it is no work). The next round must not wait for its key on that alone."""
    swarm = make_swarm()
    honest = swarm.honest(3)
    [quiet] = swarm.adversaries(("quietnoise",), [])
    arena = Arena(swarm.validator(tmp_path), [*honest, quiet])
    for _ in range(2):
        record = arena.play()
        [outcome] = [o for o in record.report.outcomes if o.sender == quiet.key]
        assert outcome.score is not None and outcome.norm is not None, outcome  # evaluated, not refused before
        waited = senders_to_wait_for(record.report.outcomes)
        assert (quiet.key in waited) == (outcome.status == "selected"), (outcome, waited)
        assert outcome.indicator == -1 and outcome.status == "rejected", outcome


def test_an_update_that_gains_little_of_what_the_others_gain_is_no_record_of_work() -> None:
    """The round that let a random direction in (`pulse bench gauntlet --kinds quietnoise`, before
    the rule): its own-data margin came out positive by chance, but it gained 0.5% of what the
    round's other updates gain on random data. Honest updates gain 1.0x to 1.8x that."""
    lucky = Gains(assigned=-0.000218, random=0.0000429, assigned_ref=0.00760, random_ref=0.00802)
    assert lucky.margin > 0 and lucky.indicator(0.0, 0.0) == 1  # the margin alone: +1
    assert lucky.indicator(0.0, 0.25) == -1
    honest = Gains(assigned=0.0120, random=0.0100, assigned_ref=0.0060, random_ref=0.0066)
    assert honest.indicator(0.0, 0.25) == 1
    # a reference that does not gain asks only for a gain
    assert Gains(assigned=0.002, random=0.0001, assigned_ref=0.0, random_ref=-0.001).indicator(0.0, 0.25) == 1
    assert Gains(assigned=0.01, random=-0.0001, assigned_ref=0.0, random_ref=-0.003).indicator(0.0, 0.25) == -1
