"""Bad numbers and paths on the command line: one line naming the flag, exit status 2, nothing
started, no traceback."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from node.commands.cli import main
from node.commands.roles import MetricsOptions, start_metrics


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["miner", "--threads", "-3"], "--threads"),
        (["miner", "--rounds", "-1"], "--rounds"),
        (["validator", "--threads", "two"], "--threads"),
        (["demo", "--miners", "0"], "--miners"),
        (["demo", "--rounds", "-1"], "--rounds"),
        (["demo", "--timeout", "-5"], "--timeout"),
        (["dashboard", "--port", "99999"], "--port"),
        (["dashboard", "--poll", "inf"], "--poll"),
        (["dashboard", "--history", "0"], "--history"),
        (["dht", "--run-id", "0" * 64, "--metrics-port", "70000"], "--metrics-port"),
        (["miner", "--metrics-port", "70000"], "--metrics-port"),
        (["doctor", "--threads", "-1"], "--threads"),
    ],
)
def test_an_invalid_number_is_refused_at_parse_time(
    argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    try:  # argparse's flag types exit with 2; a typed options model's check returns 2
        status = main(argv)
    except SystemExit as exit_:
        status = int(exit_.code or 0)
    err = capsys.readouterr().err
    assert status == 2
    errors = [line for line in err.splitlines() if f"{flag}:" in line]  # not the usage line's `--flag X`
    assert len(errors) == 1, err
    assert "Traceback" not in err


@pytest.mark.parametrize("role", ["miner", "validator", "follow", "receipt"])
def test_a_key_that_is_a_folder_is_refused_in_one_line(
    role: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    extra = ["--round", "0"] if role == "receipt" else []
    try:  # argparse's flag types exit with 2; a typed options model's check returns the command's error status
        status = main([role, "--key", str(tmp_path), *extra])
    except SystemExit as exit_:
        status = int(exit_.code or 0)
    err = capsys.readouterr().err
    assert status != 0 and "is a folder, not a key file" in err and "Traceback" not in err
    assert len([line for line in err.splitlines() if "is a folder" in line]) == 1


def test_a_taken_metrics_port_names_its_holder() -> None:
    """An orphan of an older crash holding the metrics port is named (here: this very process)."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        options = MetricsOptions(metrics_port=port, metrics_bind="127.0.0.1")
        with pytest.raises(OSError, match=r"by pid \d+ \(") as err:
            start_metrics(options, "miner", "miner", "0" * 64, "0" * 64)
    assert "in use" in str(err.value)
