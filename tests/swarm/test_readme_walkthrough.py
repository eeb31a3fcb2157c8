"""The README's "Joining a run from another machine", run as written, on loopback.

Every command comes from the README's text (its first `bash` block after that heading), so the
instructions cannot drift from the code. What this test changes, and only this: the public
address 203.0.113.5 and 0.0.0.0 become 127.0.0.1, port 31337 a free one, the `Qm...`
placeholder the address `pulse dht` printed, `--device cuda` is `--device cpu`, the validator's
key goes into `validators` as the comment says, and each role gets `--rounds 3 --events FILE` so
that it ends. `source .venv/bin/activate` is done by putting this interpreter's `bin` first on PATH.

`pulse dht` is started as a shell script's `cmd &` starts it: with SIGINT ignored. A SIGINT must
still stop it, with no daemon error on its output (it used to run on, SIGINT ignored).
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from node.events import read_events
from node.events.models import RoundClosed
from node.run.manifest import load_manifest
from tests.helpers import poll

pytestmark = [pytest.mark.swarm, pytest.mark.light]
REPO = Path(__file__).resolve().parents[2]
ROUNDS = 3
WAIT = 240.0
PLACEHOLDER = "/ip4/203.0.113.5/tcp/31337/p2p/Qm..."


def readme_commands() -> list[str]:
    """The walkthrough's commands, in order: comments dropped, continued lines joined."""
    text = (REPO / "README.md").read_text()
    section = text[text.index("### Joining a run from another machine") :]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block is not None, "the walkthrough has no bash block"
    commands: list[str] = []
    pending = ""
    for raw in block.group(1).splitlines():
        line = raw.split(" #", 1)[0].rstrip() if not raw.lstrip().startswith("#") else ""
        if not line and not pending:
            continue
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        commands.append((pending + line.strip()).strip())
        pending = ""
    return [c for c in commands if c]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Shell:
    """Runs the README's commands in one folder, with this interpreter's `pulse` first on PATH."""

    def __init__(self, folder: Path, port: int) -> None:
        self.folder, self.port = folder, port
        self.env = {
            **os.environ,
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
            "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
        }
        self.procs: list[subprocess.Popen[bytes]] = []
        self.address = PLACEHOLDER

    def local(self, command: str) -> list[str]:
        command = command.replace(PLACEHOLDER, self.address).replace("--device cuda", "--device cpu")
        command = command.replace("203.0.113.5", "127.0.0.1").replace("0.0.0.0", "127.0.0.1")
        assert PLACEHOLDER not in command and "p2p/Qm..." not in command, command
        return shlex.split(command.replace("31337", str(self.port)))

    def run(self, command: str) -> str:
        done = subprocess.run(
            self.local(command), cwd=self.folder, env=self.env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, (command, done.stdout, done.stderr)
        return done.stdout

    def start(self, command: str, name: str, *, ignore_sigint: bool = False) -> subprocess.Popen[bytes]:
        argv = self.local(command)
        if argv[1] in ("validator", "miner", "follow"):
            argv += ["--rounds", str(ROUNDS), "--events", f"events/{name}.jsonl"]
        log = (self.folder / "logs" / f"{name}.log").open("wb")

        def prepare() -> None:  # a script's `cmd &`: SIGINT ignored
            if ignore_sigint:
                signal.signal(signal.SIGINT, signal.SIG_IGN)

        popen = subprocess.Popen(
            argv,
            cwd=self.folder,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=prepare,
        )
        self.procs.append(popen)
        return popen

    def ready(self, name: str) -> bool:
        return "ready" in self.log(name)

    def log(self, name: str) -> str:
        return (self.folder / "logs" / f"{name}.log").read_text(errors="replace")

    def stop_all(self) -> None:
        for popen in self.procs:
            if popen.poll() is None:
                os.killpg(popen.pid, signal.SIGTERM)
        for popen in self.procs:
            try:
                popen.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(popen.pid, signal.SIGKILL)
                popen.wait(5)


def exited(popens: list[subprocess.Popen[bytes]]) -> bool:
    return all(p.poll() is not None for p in popens)


@pytest.fixture
def shell(tmp_path: Path) -> Iterator[Shell]:
    (tmp_path / "configs").symlink_to(REPO / "configs")
    for folder in ("logs", "events"):
        (tmp_path / folder).mkdir()
    sh = Shell(tmp_path, free_port())
    try:
        yield sh
    finally:
        sh.stop_all()


def test_the_readme_walkthrough_runs_as_written(shell: Shell) -> None:
    commands = readme_commands()
    assert commands[0] == "source .venv/bin/activate"
    keygens = [c for c in commands if c.startswith("pulse keygen")]
    assert len(keygens) == 2 and len({shlex.split(c)[-1] for c in keygens}) == 2, "one key file per node"
    names = iter(["bootstrap", "validator", "miner", "follower"])
    started: dict[str, subprocess.Popen[bytes]] = {}
    status = keygen_output = ""
    for command in commands[1:]:
        verb = shlex.split(command)[1] if command.startswith("pulse ") else command.split()[0]
        if command.startswith("cp "):
            shell.run(command)
            key = re.search(r"public key: ([0-9a-f]{64})", keygen_output)
            assert key, "no public key printed"
            manifest = shell.folder / "myrun.toml"
            text = manifest.read_text()
            manifest.write_text(re.sub(r"^validators = \[\]", f'validators = ["{key.group(1)}"]', text, flags=re.M))
        elif verb == "keygen":
            keygen_output = shell.run(command)
        elif verb == "run-id":
            assert shell.run(command).strip() == load_manifest(shell.folder / "myrun.toml").run_id
        elif verb == "dht":
            name = next(names)
            started[name] = shell.start(command, name, ignore_sigint=True)
            assert poll(functools.partial(shell.ready, name), 90.0), shell.log(name)
            printed = [
                line
                for line in shell.log(name).splitlines()
                if line.startswith(f"/ip4/127.0.0.1/tcp/{shell.port}/p2p/")
            ]
            assert printed, shell.log(name)
            shell.address = printed[0]
        elif verb in ("validator", "miner", "follow"):
            name = next(names)
            started[name] = shell.start(command, name)
        elif verb == "status":
            roles = [started[n] for n in ("validator", "miner", "follower")]
            assert poll(functools.partial(exited, roles), WAIT), {n: shell.log(n)[-2000:] for n in started}
            assert [p.returncode for p in roles] == [0, 0, 0], {n: shell.log(n)[-2000:] for n in started}
            status = shell.run(command)
        else:
            raise AssertionError(f"the test does not know this README command: {command}")

    log = read_events(shell.folder / "events")
    closed = log.events(RoundClosed, "validator")
    assert [e.round for e in closed] == list(range(ROUNDS))
    assert sum(e.selected for e in closed) >= 2, [(e.round, e.selected) for e in closed]  # a lone miner trains
    finals = log.final_hashes()
    assert set(finals) == {"validator", "miner", "follower"} and len(set(finals.values())) == 1, finals
    assert f"round {ROUNDS} is the current round" in status, status
    assert all(role in status for role in ("validator", "miner", "follower")), status  # followers too

    # Ctrl+C from a script: the bootstrap stops, and says nothing of its daemon's errors
    bootstrap = started["bootstrap"]
    os.kill(bootstrap.pid, signal.SIGINT)
    try:
        bootstrap.wait(30)
    except subprocess.TimeoutExpired:
        pytest.fail("pulse dht ignored SIGINT")
    assert bootstrap.returncode == 0
    assert "[ERROR]" not in shell.log("bootstrap"), shell.log("bootstrap")
