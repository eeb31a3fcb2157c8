"""The measurement benchmarks take an options model: `pulse bench NAME`'s flags and help come from
its `Options`, and a bad value is one line naming the flag (exit 2) before anything runs."""

from __future__ import annotations

import argparse
import types

import pytest

from node.bench import gauntlet, gpu, loco, memory, sync, trace, transfer
from node.commands.cli import build_parser, main
from node.commands.options import options_from

MODULES: dict[str, types.ModuleType] = {
    "sync": sync,
    "trace": trace,
    "transfer": transfer,
    "gauntlet": gauntlet,
    "gpu": gpu,
    "loco": loco,
    "memory": memory,
}


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
    ],
)
def test_a_bad_value_exits_2_with_one_line_naming_the_flag(
    name: str, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", name, *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"pulse bench {name}: {message}") and err.count("\n") == 1


def test_the_command_lines_users_type_still_parse() -> None:
    options = options_from(gauntlet.Options, _parse("gauntlet", "--kinds", "nan,copycat", "--skip-rss"))
    assert options.attack_kinds == ["nan", "copycat"] and options.skip_rss
    assert options.batches == options.inner_steps  # no --assignment-batches: H
    assert options_from(gauntlet.Options, _parse("gauntlet", "--assignment-batches", "3")).batches == 3
    options = options_from(loco.Options, _parse("loco", "--methods", "ddp,diloco,pulseloco", "--regime", "pretrain"))
    assert [m.name for m in options.methods_of(loco.REGIMES["pretrain"])] == ["ddp", "diloco", "pulseloco"]
    assert options.regimes() == ["pretrain"] and loco.Options().regimes() == ["pretrain", "finetune"]
    assert options_from(sync.Options, _parse("sync", "--model", "qwen2-0.5b", "--steps", "2")).steps == 2
    assert options_from(trace.Options, _parse("trace", "--master", "bf16")).master == "bf16"
