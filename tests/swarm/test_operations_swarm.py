"""Operations on one running swarm, as a person running nodes for days meets them.

A miner and a follower, then the validator, are killed with kill -9 (SIGKILL to the role's own process only, as
the OOM killer does: its DHT process and libp2p daemon are left to notice), each leaves no process
behind and is restarted with the same command on the same state folder; a few rounds in, with
checkpoints taken every 2 rounds and only 2 kept, `pulse audit`, a standby validator on a fresh
state folder and a late miner join the run: the auditor recomputes rounds, the standby catches up
from the newest kept checkpoint and stands by (the active validator hands it every later round), and
the miner contributes from the round that is open when its state is ready. Every node ends on the
validator's state hash; `pulse status` then reads the run's round from the DHT, and Ctrl+C stops
every role still running (the standby, the bootstrap) with its DHT process and daemon.

(`test_lifetime_swarm.py` plays kill -9 of `pulse dht` and the busy port; `test_round_swarm.py`
kills whole process groups.)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from node.commands.roles import DEFAULT_CONFIG
from node.events import EventLog
from node.events.audit import Audited, Standby, TookOver
from node.events.models import Done, Event, Joined, Received, RoundClosed, Started, Submitted
from node.run.manifest import Manifest, parse_manifest
from node.swarm.demo import Proc, Swarm
from tests.helpers import events, wait_exits, wait_for
from tests.swarm import procs
from tests.swarm.runs import bootstrapped

pytestmark = pytest.mark.swarm
ROUNDS = 11
JOIN_AFTER = 4  # the round whose close starts the auditor, the standby and the late miner: 3 checkpoints taken, 2 kept
WAIT = 150.0


def _manifest() -> Manifest:
    data: dict[str, Any] = tomllib.loads(DEFAULT_CONFIG.read_text())
    data["round"].update(deadline_seconds=12.0, min_seconds=2.5, checkpoint_every=2, keep_checkpoints=2)
    data["selection"]["held_out_batches"] = 2
    return parse_manifest(data)


@pytest.fixture
def swarm(tmp_path: Path) -> Iterator[tuple[Swarm, Path, list[Path]]]:
    """The run names a second validator (`keys/standby0.key`), which starts only at round JOIN_AFTER."""
    with bootstrapped(tmp_path, _manifest(), miners=3, rounds=ROUNDS, standbys=1) as started:
        yield started


def _wait(swarm: Swarm, what: str, found: Callable[[EventLog], bool]) -> None:
    wait_for(lambda: found(events(swarm.out)), WAIT, what, logs=swarm.out / "logs")


def _has(name: str, kind: type[Event], round_: int | None = None) -> Callable[[EventLog], bool]:
    return lambda log: log.has(kind, name, round_)


def _closed(log: EventLog, name: str) -> int:
    """The last round `name` closed (-1: none)."""
    return max((e.round for e in log.events(RoundClosed, name)), default=-1)


def _kill_9(proc: Proc) -> None:
    """SIGKILL the role's own process (not its group) and check that its children followed it."""
    children = procs.descendants(proc.popen.pid)
    assert len(children) >= 2, [procs.describe(p) for p in children]  # its DHT process and libp2p daemon
    os.kill(proc.popen.pid, signal.SIGKILL)
    proc.popen.wait()
    survivors = procs.wait_gone(children, timeout=15.0)
    described = [procs.describe(p) for p in survivors]
    procs.kill(survivors)
    assert not survivors, f"orphans of the killed {proc.name}: {described}"


def test_kill_9_restarts_audit_and_a_late_miner(swarm: tuple[Swarm, Path, list[Path]]) -> None:
    s, validator_key, miner_keys = swarm
    validator = s.start_role("validator", "validator", validator_key)
    miners = [s.start_role(f"miner{i}", "miner", key) for i, key in enumerate(miner_keys[:2])]
    follower = s.start_role("follower", "follow", None)

    _wait(s, "miner1's first submission", _has("miner1", Submitted))
    _kill_9(miners[1])
    _kill_9(follower)
    # the same command but for the events file (the test's reading of it): same key, same state folder
    again = s.start_role("miner1-again", "miner", miner_keys[1], state="miner1")
    follower_again = s.start_role("follower-again", "follow", None, state="follower")

    _wait(s, "the restarted miner's first submission", _has("miner1-again", Submitted))
    _kill_9(validator)
    s.start_role("validator-again", "validator", validator_key, state="validator")

    _wait(s, f"round {JOIN_AFTER} closing", lambda log: _closed(log, "validator-again") >= JOIN_AFTER)
    # the validator lingers until the auditor (announcing its rounds) holds the final state
    audit = s.start_role("audit", "audit", None, extra=["--stop-on-mismatch", "--rounds", str(ROUNDS)])
    standby = s.start_role("standby", "validator", validator_key.parent / "standby0.key")
    late = s.start_role("late", "miner", miner_keys[2])

    # the standby, like the active validator, serves blobs after the last round until stopped
    joined = [miners[0], again, late, audit, follower_again]
    wait_exits([proc.popen for proc in joined], WAIT)
    _wait(s, "the standby done with the last round", _has("standby", Done))
    assert standby.popen.poll() is None, standby.log.read_text(errors="replace")[-2000:]
    for proc in joined:
        assert proc.popen.returncode == 0, proc.log.read_text(errors="replace")[-2000:]
    log = events(s.out)
    starts = log.events(Started, "validator-again")
    assert starts and (starts[0].round or 0) >= 1  # resumed from its state folder, not from round 0
    finals = log.final_hashes()
    assert set(finals) >= {"validator-again", "miner0", "miner1-again", "late", "follower-again", "standby"}, finals
    assert len(set(finals.values())) == 1, finals

    audited = log.events(Audited, "audit")
    assert audited and audited[-1].round == ROUNDS - 1, audited
    closed = {e.round: e.state_hash for e in log.events(RoundClosed, "validator-again")}
    assert all(e.state_hash == closed[e.round] for e in audited), (audited, closed)

    joined = log.events(Joined, "late")
    first = min(e.round for e in log.events(Submitted, "late"))
    assert joined and first <= joined[0].round + 1, (joined, first)  # no round lost after its state was ready
    late_key = log.keys()["late"]
    taken = {e.round for e in log.events(Received, "validator-again") if e.sender == late_key}
    submitted = {e.round for e in log.events(Submitted, "late")}
    # a newcomer is waited for only so long in its first round (deadline.py: NEWCOMER_WAIT), so on a busy
    # machine that one may close before its body arrives (the standby may still have taken it); no later one
    assert submitted - {first} <= taken and (first in taken or first + 1 in taken), (first, submitted, taken)

    stood = log.events(Standby, "standby")
    assert stood and stood[0].round > JOIN_AFTER, stood  # from a kept checkpoint, not from round 0
    assert not log.events(TookOver, "standby")  # the active validator stayed alive: nothing to take over
    _status_shows_the_round(s)


def _status_shows_the_round(s: Swarm) -> None:
    cmd = [sys.executable, "-m", "node", "status", "--config", str(s.out / "run.toml")]
    cmd += ["--host", "/ip4/127.0.0.1/tcp/0", "--initial-peers", *s.bootstrap]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=90, start_new_session=True)
    assert done.returncode == 0, done.stderr
    assert f"round {ROUNDS} is the current round" in done.stdout
    assert "validator" in done.stdout and "aggregated" in done.stdout
    s.stop_all()
    assert not s.unclean, s.unclean  # Ctrl+C stopped every role with its DHT process and daemon
