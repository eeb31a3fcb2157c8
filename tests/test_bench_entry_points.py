"""`pulse bench` lists the benchmarks other packages register in the `pulse.bench` entry points
beside its built-ins: the red team's `attacks` and `failover` (tests/redteam, installed by
`make install`), a plugin that fails to import as a clear error, an unknown name as argparse's."""

from __future__ import annotations

from importlib.metadata import EntryPoint

import pytest

from node.commands import bench
from node.commands.cli import build_parser, main


def test_the_red_teams_benchmarks_are_listed_beside_the_built_ins(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        build_parser("bench").parse_args(["bench", "--help"])
    assert done.value.code == 0
    listed = capsys.readouterr().out
    for name in [*bench.BENCHES, "attacks", "failover"]:
        assert f"    {name} " in listed, name


def test_a_red_team_benchmark_parses_its_own_flags() -> None:
    args = build_parser("bench").parse_args(["bench", "attacks", "--skip-faults", "--json"])
    assert args.bench == "attacks" and args.skip_faults and args.json
    assert args.func.__defaults__[0].__name__ == "pulse_redteam.bench.attacks"


def test_an_unknown_benchmark_is_refused_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["bench", "nosuch"])
    assert done.value.code == 2
    assert "invalid choice: 'nosuch'" in capsys.readouterr().err


def _entries(*entries: EntryPoint) -> object:
    return lambda group: list(entries) if group == bench.GROUP else []


def test_a_plugin_that_does_not_import_is_listed_and_fails_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = EntryPoint("broken", "no_such_package.bench", bench.GROUP)
    monkeypatch.setattr(bench, "entry_points", _entries(broken))
    assert main(["bench", "broken"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("pulse bench broken: cannot load the benchmark")
    assert "no_such_package" in err[0]


def test_a_plugin_cannot_replace_a_built_in(monkeypatch: pytest.MonkeyPatch) -> None:
    impostor = EntryPoint("sync", "pulse_redteam.bench.attacks", bench.GROUP)
    monkeypatch.setattr(bench, "entry_points", _entries(impostor))
    found = bench.benches()
    assert getattr(found["sync"], "__name__", None) == "node.bench.sync"
