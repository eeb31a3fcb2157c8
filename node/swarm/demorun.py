"""`run_demo(options, base)`: the loopback swarm `pulse demo` runs, from its options to its summary.

It starts a bootstrap peer, the validator, the miners and the followers (`demo.py`'s `Swarm`),
waits for the workers to finish their rounds (or `--timeout`), stops everyone on any way out, and
writes `summary.json` and the plots. The command (`node/commands/demo.py`) only parses the flags,
checks the manifest and prints: the live table comes from `progress`, called with the event log
twice a second.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from node.events import EventLog, read_events
from node.run.manifest import Manifest
from node.swarm.demo import Swarm, fresh_output, plot, prepare, summarize
from protocol.parsing import STRICT

TICK_SECONDS = 0.5


class DemoOptions(BaseModel):
    """`pulse demo`'s options (its flags and help are generated from these fields)."""

    # the options config of `node/commands/options.py`, which this floor does not import
    model_config = STRICT

    task: Literal["lm", "rl"] = "lm"
    """language modelling or RL"""
    miners: int = Field(default=3, ge=1)
    """miner processes"""
    followers: int | None = Field(default=None, ge=0)
    """follower processes (1; 2 workers for rl)"""
    rounds: int = Field(default=12, ge=1)
    """rounds to run"""
    out: Path = Path("pulse-demo")
    """report folder"""
    config: Path | None = None
    """base manifest (configs/tiny.toml; rl.toml for rl)"""
    device: Literal["cpu", "cuda"] = "cpu"
    """where miners train and the validator evaluates"""
    timeout: Annotated[float, Field(gt=0, allow_inf_nan=False)] = 900.0
    """give up after this many seconds"""
    print_json: bool = Field(default=False, alias="json")
    """print the JSON summary instead of the table"""
    dashboard: Annotated[int, Field(ge=0, le=65535)] | None = None
    """also serve the live run page (`pulse dashboard`) on this port"""


@dataclass(frozen=True)
class DemoOutcome:
    summary: dict[str, Any]
    """`summarize`'s figures, and `clean_shutdown`"""
    ok: bool
    """every worker exited cleanly, the hashes agree and every round ran"""
    error: str | None
    """why the swarm could not start (a role that did not), else None"""


def run_demo(
    options: DemoOptions,
    base: Manifest,
    progress: Callable[[EventLog], None] = lambda _: None,
    say: Callable[[str], None] = lambda _: None,
) -> DemoOutcome:
    """Run the swarm `options` asks for on `base` (a manifest of `options.task`); KeyboardInterrupt
    (Ctrl+C, SIGTERM, SIGHUP) stops every role and propagates."""
    out = options.out
    followers = options.followers if options.followers is not None else (2 if options.task == "rl" else 1)
    fresh_output(out)  # a new run: fresh keys, so nothing of the last one (either task) stays
    manifest, validator_key, miner_keys = prepare(out, base, options.miners)
    swarm = Swarm(out, manifest, options.rounds, device=options.device)
    workers_ok, error = False, None
    previous = {sig: signal.signal(sig, _interrupted) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:  # on any way out (a role that did not start, Ctrl+C, kill), `stop_all` reaps every role
        swarm.start_bootstrap()
        if options.dashboard is not None:
            _, url = swarm.start_dashboard(options.dashboard)
            say(f"live run page: {url}")
        validator = swarm.start_role("validator", "validator", validator_key, state_dir=out / "validator")
        workers = [swarm.start_role(f"miner{i}", "miner", key) for i, key in enumerate(miner_keys)]
        workers += [swarm.start_role(f"follower{i}" if i else "follower", "follow", None) for i in range(followers)]
        deadline = time.monotonic() + options.timeout
        while time.monotonic() < deadline:
            progress(read_events(out / "events"))
            if all(w.popen.poll() is not None for w in workers):
                break
            if validator.popen.poll() not in (None, 0):  # it failed; after its last round it stops by itself
                break
            time.sleep(TICK_SECONDS)
        workers_ok = all(w.popen.poll() == 0 for w in workers)
    except RuntimeError as exc:  # a role did not start: said after everyone is stopped
        error = str(exc)
    finally:
        swarm.stop_all()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    summary = summarize(read_events(out / "events"), options.rounds)
    summary["clean_shutdown"] = not swarm.unclean  # every role exited on Ctrl+C, daemons included
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if summary["rounds"]:
        plot(summary, out)
    ok = workers_ok and bool(summary["hashes_agree"]) and summary["rounds"] == options.rounds
    return DemoOutcome(summary, ok, error)


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")  # unwinds through `finally`, as Ctrl+C does
