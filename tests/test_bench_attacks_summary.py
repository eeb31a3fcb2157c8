"""`pulse bench attacks`' summary counts each run's hostile outcomes once; its ledger gives each push one outcome."""

from __future__ import annotations

from pathlib import Path

from node.events import Events, read_events
from node.events.campaign import AttackSent
from node.events.models import Received, RoundClosed
from pulse_redteam.bench.attacks import Options, Scenario, _result
from pulse_redteam.campaign.ledger import Ledger, Outcome, build
from pulse_redteam.campaign.swarms import RunReport


def _run(name: str, outcomes: list[Outcome]) -> RunReport:
    return RunReport(name, Ledger(outcomes=outcomes), final_loss=3.0, hashes={}, crashes=[], honest_aggregated={0: 5})


def test_each_hostile_run_is_counted_once(tmp_path: Path) -> None:
    """The hostile runs are both 'reports' and runs 'under attack': they were summed twice, which
    doubled every push and every aggregated attack in the table and in `hostile_aggregated`."""
    clean = _run("clean", [])
    hostile = _run(
        "hostile30", [Outcome("alie", 6, "a" * 64, "aggregated", ""), Outcome("nan", 6, "b" * 64, "rejected", "x")]
    )
    options = Options(honest=7, rounds=8, fractions="0.3")
    result = _result(options, [clean, hostile], None, [3], tmp_path, None, {"lm": clean}, [])
    summary = result.summary
    assert summary["hostile_aggregated"] == 1 and summary["hostile_aggregated_detectable"] == 0
    assert summary["per_attack"]["alie"]["aggregated"] == 1 and summary["per_attack"]["nan"]["rejected"] == 1


def test_pushes_a_standby_held_are_accounted_and_honest_ones_judged_where_the_round_closed(tmp_path: Path) -> None:
    """Miners push to every validator that announces the round, so a submission has several takers.
    One only a standby took (a flood of its intake) is held, not unaccounted; an honest one both
    took is judged by the round of the validator that closed it."""
    flooder, honest = "f" * 64, "e" * 64
    closed = RoundClosed(
        round=2, submissions=1, selected=1, bytes=10, dense_bytes=100, patch_bytes=5, state_bytes=50,
        changed_fraction=0.1, scores={honest: 0.5}, rejections={}, state_hash="0" * 64, seconds=0.1,
    )  # fmt: skip
    sent = AttackSent(
        round=2, attack="standby-flood", sender=flooder, header_round=2, message_id="1" * 64,
        payload_sha256="2" * 64, status="OK", reason="", body_sent=True, peer_id="12D3KooW",
    )  # fmt: skip
    events = tmp_path / "events"
    Events("validator", events / "validator.jsonl").emit(closed, "round 2 closed")
    for name in ("validator", "standby"):
        Events(name, events / f"{name}.jsonl").emit(Received(round=2, sender=honest, bytes=10), "received")
    Events("standby", events / "standby.jsonl").emit(Received(round=2, sender=flooder, bytes=10), "received")
    Events("hostile", events / "flooder.jsonl").emit(sent, "pushed")
    ledger = build(read_events(events), validator_log="")
    [outcome] = ledger.outcomes
    assert outcome.kind == "held" and "standby" in outcome.reason and ledger.unaccounted == 0
    assert ledger.per_attack()["standby-flood"]["held"] == 1


def test_pushes_that_arrive_after_their_round_closed_are_late_and_their_attack_not_played(tmp_path: Path) -> None:
    """A hostile process behind the rounds (sharing the honest miners' cores) names the round it saw
    open, truthfully, and is refused because that round has closed: the validator never judged the
    attack. Those pushes are late, not refused, and an attack that was only ever late is not played;
    a deliberate push for another round is refused (its defence worked), as is a body cut at close."""

    def sent(attack: str, round_: int, header_round: int, reason: str) -> AttackSent:
        return AttackSent(
            round=round_, attack=attack, sender="a" * 64, header_round=header_round, message_id="1" * 64,
            payload_sha256="2" * 64, status="REJECTED", reason=reason, body_sent=False, peer_id="12D3KooW",
        )  # fmt: skip

    events = tmp_path / "events"
    hostile = Events("hostile", events / "hostile.jsonl")
    for e in (
        sent("signflip", 5, 5, "round 5 is not open (the open round is 6)"),
        sent("signflip", 6, 6, "round 6 has closed: the validator is scoring it"),
        sent("nan", 6, 6, "round 6 has closed: the validator is scoring it"),
        sent("other-round", 6, 7, "round 7 is not open (the open round is 6)"),
        sent("slow", 6, 6, "round 6 closed while its body arrived"),
    ):
        hostile.emit(e, "pushed")
    validator_log = "submit from 12D3KooW refused"
    ledger = build(read_events(events), validator_log=validator_log)
    kinds = {(o.attack, o.round): o.kind for o in ledger.outcomes}
    assert kinds == {
        ("signflip", 5): "late", ("signflip", 6): "late", ("nan", 6): "late",
        ("other-round", 6): "refused", ("slow", 6): "refused",
    }  # fmt: skip
    assert ledger.per_attack()["signflip"]["late"] == 2 and ledger.unaccounted == 0
    assert sorted(ledger.not_played()) == ["nan", "signflip"]
    nan_played = Ledger(outcomes=[*ledger.outcomes, Outcome("nan", 7, "b" * 64, "rejected", "undecodable")])
    clean = _run("clean", [])
    report = RunReport("hostile30", nan_played, final_loss=3.0, hashes={}, crashes=[], honest_aggregated={0: 5})
    summary = _result(Options(fractions="0.3"), [clean, report], None, [3], tmp_path, None, {"lm": clean}, []).summary
    assert summary["attacks_not_played"] == ["signflip"] and summary["hostile_late"] == 3


def test_each_run_reports_how_much_longer_the_validator_took_to_decide(tmp_path: Path) -> None:
    """Every round of a run can complete while an attack slows the validator's decisions several
    times over (the network attacks did, 7-9x): the summary reports the decision time per run and
    the largest slowdown against the clean run."""
    clean = _run("clean", [])
    clean.decide_seconds = [1.0, 1.2, 0.8]
    network = _run("network", [])
    network.decide_seconds = [5.0, 7.0, 9.0]
    quiet = _run("flood", [])  # a run whose rounds carry no decision time is reported without one
    summary = _result(
        Options(fractions=""), [clean], None, [], tmp_path, None, {"lm": clean},
        [(Scenario("network", "lm"), network), (Scenario("flood", "lm"), quiet)],
    ).summary  # fmt: skip
    assert summary["per_run"]["clean"]["validator_decide_seconds"] == 1.0
    assert summary["per_run"]["network"]["validator_decide_seconds"] == 7.0
    assert summary["per_run"]["network"]["validator_decide_ratio"] == 7.0
    assert summary["per_run"]["flood"]["validator_decide_ratio"] is None
    assert summary["validator_decide_ratio_max"] == 7.0
