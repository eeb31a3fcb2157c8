"""Every benchmark (the built-ins and the red team's, found as `pulse bench` finds them) and the
frozen run's worker take an options model: no flags give the model's defaults, every field is a
flag with its docstring as help, and a bad value is one line naming the flag (exit 2) before
anything runs."""

from __future__ import annotations

import argparse
import types
import typing
from pathlib import Path

import pytest

from node.bench import gauntlet, links, loco, rl, scale, sync, trace
from node.commands.bench import benches
from node.commands.cli import build_parser, main
from node.commands.options import options_from
from node.learn.hfmodel import ARCHITECTURES
from node.swarm import frozenrun
from pulse_redteam.bench import attacks, failover

MODULES: dict[str, types.ModuleType] = {
    name: module for name, module in benches().items() if isinstance(module, types.ModuleType)
}


def test_every_benchmark_loads() -> None:
    assert set(MODULES) == set(benches()) >= {"sync", "gauntlet", "scale", "attacks", "failover"}


def _parse(name: str, *flags: str) -> argparse.Namespace:
    return build_parser("bench").parse_args(["bench", name, *flags])


def _help(name: str) -> str:
    """`pulse bench NAME --help`, without its whitespace (argparse wraps lines, even inside words)."""
    parser = build_parser("bench")
    bench = parser._subparsers._group_actions[0].choices["bench"]  # type: ignore[union-attr]
    return "".join(bench._subparsers._group_actions[0].choices[name].format_help().split())  # type: ignore[union-attr]


@pytest.mark.parametrize("name", MODULES)
def test_no_flags_give_the_models_defaults_and_every_field_is_a_flag_with_its_help(name: str) -> None:
    module = MODULES[name]
    assert not hasattr(module, "configure")
    assert options_from(module.Options, _parse(name)) == module.Options()
    text = _help(name)
    for field_name, field in module.Options.model_fields.items():
        assert "--" + field_name.replace("_", "-") in text
        assert field.description and "".join(field.description.split()) in text, field_name  # wrapped anywhere


@pytest.mark.parametrize(
    ("name", "argv", "message"),
    [
        ("sync", ["--delay", "0"], "--delay: Input should be greater than or equal to 1"),
        ("sync", ["--repeat", "0"], "--repeat: Input should be greater than or equal to 1"),
        ("trace", ["--steps", "0"], "--steps: Input should be greater than or equal to 1"),
        ("trace", ["--lr", "0"], "--lr: Input should be greater than 0"),
        ("transfer", ["--size-mib", "0"], "--size-mib: Input should be greater than or equal to 1"),
        ("gauntlet", ["--rounds", "0"], "--rounds: Input should be greater than or equal to 1"),
        ("gauntlet", ["--kinds", "nan,bogus"], "--kinds: unknown attack kinds ['bogus']"),
        ("gauntlet", ["--kinds", ","], "--kinds: name at least one attack kind"),
        ("gauntlet", ["--codec", "zip"], "--codec: unknown codec 'zip'"),
        ("gpu", ["--swarm-rounds", "-1"], "--swarm-rounds: Input should be greater than or equal to 0"),
        ("gpu", ["--swarm-timeout", "0"], "--swarm-timeout: Input should be greater than 0"),
        ("loco", ["--replicas", "0"], "--replicas: Input should be greater than or equal to 1"),
        ("loco", ["--methods", "ddp,sparseloco"], "--methods: must include ddp and diloco"),
        ("memory", ["--inner-steps", "0"], "--inner-steps: Input should be greater than or equal to 1"),
        ("scale", ["--miners", "0"], "--miners: Input should be greater than or equal to 1"),
        ("scale", ["--threads", "-1"], "--threads: Input should be greater than or equal to 0"),
        ("scale", ["--submissions", "4,0"], "--submissions: '4,0' is not comma-separated sizes >= 1"),
        ("scale", ["--eval-batch-size", "2"], "--eval-batch-size (2) must be <= --batch-size (1)"),  # cpu: 1
        ("rl", ["--rounds", "0"], "--rounds: Input should be greater than or equal to 1"),
        ("rl", ["--workers", "0"], "--workers: Input should be greater than or equal to 1"),
        ("rl", ["--outer-momentum", "1"], "--outer-momentum: Input should be less than 1"),
        ("links", ["--state-mib", "0"], "--state-mib: Input should be greater than 0"),
        ("links", ["--repeat", "0"], "--repeat: Input should be greater than or equal to 1"),
        ("links", ["--prefix", "1-bad"], "--prefix: String should match pattern"),
        ("links", ["--subnet", "10.1"], "--subnet: String should match pattern"),
        ("attacks", ["--honest", "0"], "--honest: Input should be greater than or equal to 1"),
        ("attacks", ["--fractions", "0.3,1"], "--fractions: '0.3,1' is not comma-separated fractions"),
        ("attacks", ["--scenarios", "flood,nope"], "--scenarios: no scenario nope"),
        ("attacks", ["--min-seconds", "30"], "min_seconds 30.0 is past the deadline 20.0"),
        ("failover", ["--deadline", "0"], "--deadline: Input should be greater than 0"),
        ("failover", ["--points", "collecting,later"], "--points: no kill point later"),
    ],
)
def test_a_bad_value_exits_2_with_one_line_naming_the_flag(
    name: str, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", name, *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"pulse bench {name}: {message}") and err.count("\n") == 1


def test_the_measurement_command_lines_users_type_still_parse() -> None:
    options = options_from(gauntlet.Options, _parse("gauntlet", "--kinds", "nan,copycat", "--skip-rss"))
    assert options.attack_kinds == ["nan", "copycat"] and options.skip_rss
    assert options_from(gauntlet.Options, _parse("gauntlet", "--kinds", "quietnoise")).attack_kinds == ["quietnoise"]
    assert "quietnoise" in gauntlet.Options().attack_kinds  # every kind is played by default
    assert options.batches == options.inner_steps  # no --assignment-batches: H
    assert options_from(gauntlet.Options, _parse("gauntlet", "--assignment-batches", "3")).batches == 3
    options = options_from(loco.Options, _parse("loco", "--methods", "ddp,diloco,pulseloco", "--regime", "pretrain"))
    assert [m.name for m in options.methods_of(loco.REGIMES["pretrain"])] == ["ddp", "diloco", "pulseloco"]
    assert options.regimes() == ["pretrain"] and loco.Options().regimes() == ["pretrain", "finetune"]
    assert options_from(sync.Options, _parse("sync", "--model", "qwen2-0.5b", "--steps", "2")).steps == 2
    assert options_from(trace.Options, _parse("trace", "--master", "bf16")).master == "bf16"


def test_the_run_sized_command_lines_users_type_still_parse() -> None:
    options = options_from(scale.Options, _parse("scale", "--submissions", "2,4", "--device", "cuda"))
    assert options.sizes == (2, 4) and scale.Options().sizes == (4, 16)
    assert scale.Options(device="cuda").sizes == (4, 8, 16)
    assert scale.Options(device="cuda", eval_batch_size=8).eval_batch_size == 8  # on cuda: checked on the preset
    options = options_from(
        links.Options, _parse("links", "--skip", "joins", "overlap", "--state-mib", "1", "--outer-lr", "0.5")
    )
    assert options.skip == ["joins", "overlap"] and options.state_bytes == 2**20 and options.outer_lr == 0.5
    options = options_from(attacks.Options, _parse("attacks", "--fractions", "0.2,,0.4", "--skip-faults"))
    assert options.hostile_fractions == [0.2, 0.4] and options.skip_faults
    assert failover.Options(points="serving,collecting").kill_points == ["serving", "collecting"]
    assert options_from(rl.Options, _parse("rl", "--inner-lr", "1e-5")).inner_lr == 1e-5
    # the README's command lines
    flags = ["--honest", "2", "--rounds", "3", "--fractions", "", "--skip-faults", "--skip-netns"]
    flags += ["--scenarios", "network,dht-evict"]
    options = options_from(attacks.Options, _parse("attacks", *flags))
    assert options.hostile_fractions == [] and options.scenarios == "network,dht-evict" and options.honest == 2
    assert options_from(links.Options, _parse("links", "--skip", "joins", "deadlines")).skip == ["joins", "deadlines"]
    options = options_from(scale.Options, _parse("scale", "--device", "cuda", "--steps", "10", "--submissions", "4"))
    assert (options.steps, options.sizes) == (10, (4,))


def test_scale_offers_every_built_in_architecture() -> None:
    assert sorted(typing.get_args(scale.Architecture)) == sorted(ARCHITECTURES)


def test_options_are_frozen() -> None:
    with pytest.raises(ValueError, match="frozen"):
        rl.Options().rounds = 3  # type: ignore[misc]


def test_the_frozen_runs_worker_checks_its_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        frozenrun.main(["join", str(tmp_path)])  # a node needs its folder
    assert done.value.code == 2 and "error: --state-dir: join needs a folder" in capsys.readouterr().err
    with pytest.raises(SystemExit) as done:
        frozenrun.main(["make", str(tmp_path), "--patches", "-1"])
    assert (
        done.value.code == 2
        and "error: --patches: Input should be greater than or equal to 0" in capsys.readouterr().err
    )
    options = frozenrun.WorkerOptions(what="fetch", dir=tmp_path, state_dir=tmp_path / "s")
    assert options.folder == tmp_path / "s" and options.net().host_maddrs == ("/ip4/127.0.0.1/tcp/0",)
