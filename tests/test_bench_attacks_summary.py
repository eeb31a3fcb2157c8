"""`pulse bench attacks`' summary counts each run's hostile outcomes once."""

from __future__ import annotations

from pathlib import Path

from pulse_redteam.bench.attacks import Options, _result
from pulse_redteam.campaign.ledger import Ledger, Outcome
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
