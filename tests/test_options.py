"""Typed options: a command's flags and help come from its pydantic model (`node/commands/options.py`)."""

from __future__ import annotations

import argparse
import types
from pathlib import Path

import pytest
from pydantic import BaseModel

from node.commands import dashboard, demo, dht, export, keygen, roles, runid, status
from node.commands.options import options_from, script_options
from node.commands.receipt import ReceiptOptions, register
from protocol.errors import ConfigError


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="pulse")
    register(parser.add_subparsers())
    return parser.parse_args(["receipt", *argv])


def test_flags_and_help_come_from_the_model() -> None:
    parser = argparse.ArgumentParser(prog="pulse")
    register(parser.add_subparsers())
    text = parser._subparsers._group_actions[0].choices["receipt"].format_help()  # type: ignore[union-attr]
    for field in ReceiptOptions.model_fields.values():
        assert field.description and field.description.split("(")[0].strip()[:30] in " ".join(text.split())
    assert "--state-dir" in text and "--json" in text


def test_the_command_line_becomes_a_validated_model() -> None:
    options = options_from(ReceiptOptions, parse(["--round", "3", "--json", "--state-dir", "x"]))
    assert (options.round, options.print_json, options.state_dir, options.miner) == (3, True, Path("x"), None)
    assert options_from(ReceiptOptions, parse(["--round", "0"])).print_json is False  # the model's default


def test_a_required_flag_is_required() -> None:
    with pytest.raises(SystemExit):
        parse([])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--round", "-1"], "--round: Input should be greater than or equal to 0"),
        (["--round", "1", "--miner", "not-hex"], "--miner: String should match pattern"),
    ],
)
def test_a_bad_value_is_one_line_naming_the_flag(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        options_from(ReceiptOptions, parse(argv))
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


def _help_of(command: str, module: types.ModuleType) -> str:
    parser = argparse.ArgumentParser(prog="pulse")
    module.register(parser.add_subparsers())
    return " ".join(parser._subparsers._group_actions[0].choices[command].format_help().split())  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("command", "module", "model"),
    [
        ("keygen", keygen, keygen.KeygenOptions),
        ("run-id", runid, runid.RunIdOptions),
        ("status", status, status.StatusOptions),
        ("dashboard", dashboard, dashboard.DashboardOptions),
        ("export", export, export.ExportOptions),
        ("dht", dht, dht.DhtOptions),
        ("miner", roles, roles.SigningRoleOptions),
        ("validator", roles, roles.SigningRoleOptions),
        ("follow", roles, roles.FollowOptions),
        ("audit", roles, roles.AuditOptions),
        ("demo", demo, demo.DemoOptions),
    ],
)
def test_each_converted_command_takes_its_flags_from_its_model(
    command: str, module: types.ModuleType, model: type[BaseModel]
) -> None:
    text = _help_of(command, module)
    for name, field in model.model_fields.items():
        assert "--" + (field.alias or name).replace("_", "-") in text
        assert field.description and field.description.split("(")[0].strip()[:30] in text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "give one of --state-dir, --checkpoint or --verify"),
        (["--state-dir", "s", "--verify", "v"], "give one of --state-dir, --checkpoint or --verify"),
        (["--state-dir", "s"], "--out: the folder to write is required"),
        (["--checkpoint", "blob", "--out", "o"], "--checkpoint FILE needs --state-hash"),
    ],
)
def test_a_rule_across_flags_is_one_line_without_a_made_up_flag(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = argparse.ArgumentParser(prog="pulse")
    export.register(parser.add_subparsers())
    args = parser.parse_args(["export", *argv])
    with pytest.raises(ConfigError) as caught:
        options_from(export.ExportOptions, args)
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)
    assert args.func(args) == 2 and capsys.readouterr().err == f"pulse export: {caught.value}\n"


def test_export_sources_that_need_no_more_flags() -> None:
    parser = argparse.ArgumentParser(prog="pulse")
    export.register(parser.add_subparsers())
    verify = options_from(export.ExportOptions, parser.parse_args(["export", "--verify", "d", "--json"]))
    assert verify.verify == Path("d") and verify.print_json and verify.out is None
    latest = options_from(export.ExportOptions, parser.parse_args(["export", "--checkpoint", "latest", "--out", "o"]))
    assert latest.from_run and latest.state_hash is None


def test_a_list_flag_takes_several_values_each_validated() -> None:
    parser = argparse.ArgumentParser(prog="pulse")
    dht.register(parser.add_subparsers())
    keys = ["a" * 64, "b" * 64]
    options = options_from(dht.DhtOptions, parser.parse_args(["dht", "--run-id", "c" * 64, "--validators", *keys]))
    assert options.validators == keys and options.config is None and options.metrics_port is None
    assert options_from(dht.DhtOptions, parser.parse_args(["dht", "--run-id", "c" * 64])).validators == []
    with pytest.raises(ConfigError, match=r"^--validators: String should match pattern"):
        options_from(dht.DhtOptions, parser.parse_args(["dht", "--run-id", "c" * 64, "--validators", "a" * 64, "B"]))
    with pytest.raises(ConfigError, match=r"^--validators goes with --run-id"):
        options_from(dht.DhtOptions, parser.parse_args(["dht", "--config", "run.toml", "--validators", "a" * 64]))


def test_each_role_gets_its_own_options() -> None:
    parser = argparse.ArgumentParser(prog="pulse")
    roles.register(parser.add_subparsers())
    miner = options_from(roles.SigningRoleOptions, parser.parse_args(["miner", "--device", "cuda", "--rounds", "2"]))
    assert (miner.device, miner.rounds, miner.threads, miner.key) == ("cuda", 2, 0, roles.DEFAULT_KEY_PATH)
    follow = options_from(roles.FollowOptions, parser.parse_args(["follow", "--audit"]))
    assert follow.audit and follow.key is None
    audit = options_from(roles.AuditOptions, parser.parse_args(["audit", "--stop-on-mismatch"]))
    assert audit.stop_on_mismatch and audit.key is None
    with pytest.raises(SystemExit):  # a choice is argparse's to refuse, and a role's flag is its own
        parser.parse_args(["miner", "--device", "tpu"])
    with pytest.raises(SystemExit):
        parser.parse_args(["miner", "--audit"])


def test_a_workers_command_line_is_its_model_and_a_bad_value_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--config", "run.toml", "--round", "3", "--miner", "ab" * 32]
    options = script_options(ReceiptOptions, argv, "python -m worker")
    assert options.round == 3 and options.config == Path("run.toml")
    with pytest.raises(SystemExit) as done:
        script_options(ReceiptOptions, ["--round", "-1"], "python -m worker")
    err = capsys.readouterr().err
    assert done.value.code == 2
    assert "python -m worker: error: --round: Input should be greater than or equal to 0" in err
