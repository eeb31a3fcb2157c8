"""`pulse validator`, `pulse miner`, `pulse follow`, `pulse audit`: the long-running roles of a run.

Each parses its flags, loads the manifest and the key, starts the libp2p peer (`P2PPeer`) and runs
the role the run's task calls for (`node/roles/tasks.py`) on it until Ctrl+C (or `--rounds`). A
validator of a manifest that lists several runs as the active one or a standby (`standby.py`);
`pulse follow --audit` and `pulse audit` recompute every round from an FP32 replica (`auditor.py`);
shutting down stops the libp2p daemon and the DHT process, so nothing is left behind. With
`--metrics-port` it also serves Prometheus metrics (`node/roles/metrics.py`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import tempfile
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, Field

from node.commands.argtypes import KeyFile, Port
from node.commands.keygen import DEFAULT_KEY_PATH
from node.commands.options import OPTIONS, add_options, options_from
from node.events import Events
from node.net.dht import PulseDHT
from node.net.keyfile import load_key_file
from node.net.lifetime import holder_of
from node.net.netconfig import NetConfig, NetOptions
from node.net.p2ppeer import P2PPeer
from node.net.peer import Role
from node.roles.auditor import Auditor
from node.roles.follower import Follower
from node.roles.intake import RoundIntake
from node.roles.metrics import NodeMetrics
from node.roles.miner import Miner
from node.roles.records import run_records
from node.roles.standby import ValidatorRole
from node.roles.tasks import follower_for, miner_for, validator_for, validator_role_for
from node.roles.validator_service import ValidatorService
from node.run.hostmemory import return_large_frees
from node.run.manifest import Manifest, codec_for, load_manifest
from node.run.presets import preset
from node.run.setup import RunSetup
from node.run.task import task_for
from protocol.errors import ConfigError, KeyFileError, NetworkError
from protocol.identity import Identity
from protocol.warmup import warm_up_in_background

DEFAULT_CONFIG = preset("tiny")
RL_CONFIG = preset("rl")  # the `task = "rl"` preset
PEER_ROLES: dict[str, Role] = {"validator": "validator", "miner": "miner", "follow": "follower", "audit": "follower"}
AUDIT_MISMATCH_EXIT = 3  # `pulse audit` when a round's result did not recompute


def no_cuda(device: str) -> str | None:
    """Why `--device cuda` cannot run here, with the command that fixes it (None: it can, or cpu)."""
    if device != "cuda" or torch.cuda.is_available():
        return None
    if torch.version.cuda is None:  # the CPU build (the Makefile's default)
        return (
            f"--device cuda: this torch ({torch.__version__}) is the CPU build, it sees no CUDA device; install "
            "the CUDA build with "
            "`make cuda` (CUDA 12.8; `make install GPU=cu126` or GPU=cu118 for an older driver), or "
            f"`pip install --force-reinstall --no-deps torch=={torch.__version__.split('+')[0]} "
            "--index-url https://download.pytorch.org/whl/cu128`"
        )
    return (
        f"--device cuda: this torch ({torch.__version__}, CUDA {torch.version.cuda}) sees no GPU: check that "
        "`nvidia-smi` lists one and that its driver supports that CUDA version (else `make install GPU=cu126`)"
    )


def register(subparsers: Any) -> None:
    for name, (text, model) in ROLES.items():
        parser = subparsers.add_parser(name, help=text, description=text)
        add_options(parser, model)
        parser.set_defaults(func=lambda args, role=name: run(role, args))


def start_run_reader(config: Path, net: NetOptions, command: str) -> tuple[Manifest, PulseDHT] | None:
    """`config`'s manifest and a DHT peer (on the network flags `net`) that reads the run's records under a
    throwaway key (it signs and announces nothing), for the commands that only look at a run; None once
    the reason it could not start is printed."""
    try:
        manifest = load_manifest(config)
        dht = PulseDHT.start(net.net_config(), run_records(manifest).rules(), Identity.generate())
    except (ConfigError, NetworkError) as exc:
        print(f"pulse {command}: {exc}", file=sys.stderr)
        return None
    return manifest, dht


class MetricsOptions(BaseModel):
    """The metrics server's options, shared by the roles and `pulse dht`."""

    model_config = OPTIONS

    metrics_port: Port | None = None
    """serve Prometheus metrics at http://BIND:PORT/metrics (0: any free port, printed; default: off)"""
    metrics_bind: str = "127.0.0.1"
    """address the metrics server listens on; 0.0.0.0 for every interface"""


def start_metrics(options: MetricsOptions, command: str, role: str, run_id: str, key: str) -> NodeMetrics | None:
    """The metrics server `--metrics-port` asks for (None without it); `OSError` if the port is taken."""
    if options.metrics_port is None:
        return None
    try:
        metrics = NodeMetrics.serve(options.metrics_port, options.metrics_bind, role=role, run_id=run_id, key=key)
    except OSError as exc:  # name what holds the port: often the orphan of an older crash
        holder = holder_of(options.metrics_port) if options.metrics_port else None
        raise OSError(exc.errno, f"{exc.strerror}, by {holder}" if holder else exc.strerror) from exc
    print(f"pulse {command}: metrics at {metrics.url}", flush=True)
    return metrics


class RoleOptions(MetricsOptions, NetOptions):
    """The options every role takes, the network's flags among them."""

    config: Path = DEFAULT_CONFIG
    """run manifest TOML"""
    state_dir: Path | None = None
    """folder for blobs (and the validator's state); default: a temporary folder (validator:
    ./pulse-validator-state)"""
    device: Literal["cpu", "cuda"] = "cpu"
    """where miners train and the validator evaluates; cuda needs a CUDA torch"""
    threads: int = Field(default=0, ge=0)
    """torch CPU threads, 0 for torch's default"""
    rounds: int | None = Field(default=None, ge=0)
    """stop after the run reaches this round (default: never)"""
    events: Path | None = None
    """also append machine-readable JSON lines here"""


class SigningRoleOptions(RoleOptions):
    """`pulse miner` and `pulse validator`: they sign, so their key is their standing."""

    key: KeyFile = DEFAULT_KEY_PATH
    """Ed25519 key file from `pulse keygen`"""


class FollowOptions(RoleOptions):
    """`pulse follow`: an inference worker."""

    key: KeyFile | None = None
    """Ed25519 key file from `pulse keygen` (default: a throwaway key)"""
    audit: bool = False
    """hold only states this node recomputed from the published payloads (an FP32 replica in --state-dir);
    a result that does not recompute is reported and not applied"""


class AuditOptions(RoleOptions):
    """`pulse audit`: recomputes every round."""

    key: KeyFile | None = None
    """Ed25519 key file from `pulse keygen` (default: a throwaway key)"""
    stop_on_mismatch: bool = False
    """exit with status 3 (a mismatch) at the first round that does not recompute (default: report it and
    keep waiting on the last verified state)"""


AnyRoleOptions = SigningRoleOptions | FollowOptions | AuditOptions
ROLES: dict[str, tuple[str, type[AnyRoleOptions]]] = {
    "validator": ("run the validator: collect, score, aggregate and publish each round", SigningRoleOptions),
    "miner": ("train on assigned data each round and submit compressed pseudo-gradients", SigningRoleOptions),
    "follow": ("keep bit-identical BF16 weights through PULSESync patches (an inference worker)", FollowOptions),
    "audit": (
        "recompute every round from the published payloads on an FP32 replica; report any mismatch",
        AuditOptions,
    ),
}
"""name -> (its help, its options)"""


def run(role: str, args: argparse.Namespace) -> int:
    try:
        options = options_from(ROLES[role][1], args)
        if (missing := no_cuda(options.device)) is not None:
            raise ConfigError(missing)
        if options.threads > 0:
            torch.set_num_threads(options.threads)
        return_large_frees(options.device)
        setup = RunSetup.from_manifest(load_manifest(options.config))
        if role in ("miner", "validator") and setup.manifest.task == "lm":
            setup.corpus  # noqa: B018  # bad data fails here, in one line, before the network starts
        identity = load_key_file(options.key) if options.key is not None else Identity.generate()
        config = options.net_config()
    except (ConfigError, KeyFileError) as exc:
        print(f"pulse {role}: {exc}", file=sys.stderr)
        return 2
    if role == "validator" and not setup.manifest.validators:
        print(
            f"pulse validator: {options.config} names no validator: put {identity.public_hex} in `validators`",
            file=sys.stderr,
        )
        return 2
    events = Events(role, options.events)
    try:
        metrics = start_metrics(options, role, PEER_ROLES[role], setup.run_id, identity.public_hex)
    except OSError as exc:
        print(f"pulse {role}: --metrics-port {options.metrics_port}: {exc}", file=sys.stderr)
        return 2
    if metrics is not None and metrics.events is not None:
        events.add_sink(metrics.events.record)
    with contextlib.ExitStack() as stack:
        if metrics is not None:
            stack.callback(metrics.close)
        folder = options.state_dir
        if folder is None:
            if role == "validator":
                folder = Path("pulse-validator-state")
            else:
                folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=f"pulse-{role}-")))
        try:
            return asyncio.run(_main(role, setup, identity, folder, config, events, options, metrics))
        except (ConfigError, NetworkError) as exc:
            print(f"pulse {role}: {exc}", file=sys.stderr)
            return 1
        except OSError as exc:  # a full disk or an unwritable state folder: one line, not a traceback
            print(f"pulse {role}: cannot write to {folder}: {exc}", file=sys.stderr)
            return 1
    return 0


async def _main(
    role: str,
    setup: RunSetup,
    identity: Identity,
    folder: Path,
    config: NetConfig,
    events: Events,
    options: AnyRoleOptions,
    metrics: NodeMetrics | None = None,
) -> int:
    # the kernels this role runs load (or, on a fresh install, compile) beside its start and join, not
    # in its first round: a follower only applies patches, the others also run the run's codec
    warm_up_in_background([] if role == "follow" else [codec_for(setup.manifest)])
    task = task_for(setup)
    device = options.device
    # a validator's pushed submissions end in its round intake (`node/roles/intake.py`)
    intake = RoundIntake(setup, events, folder / "inbox") if role == "validator" else None
    records = run_records(setup.manifest)
    peer = await P2PPeer.create(config, records, identity, folder, role=PEER_ROLES[role], intake=intake)
    if metrics is not None:
        metrics.watch(peer)
    try:
        service: ValidatorService | ValidatorRole | Miner | Follower | Auditor
        if intake is not None and len(setup.manifest.validators) > 1:  # active or standby
            service = validator_role_for(setup, task, identity, folder, peer, events, intake, device=device)
        elif intake is not None:  # opening or creating its state takes a while: off the event loop
            loop, taker = asyncio.get_running_loop(), intake
            service = await loop.run_in_executor(
                None, lambda: validator_for(setup, task, identity, folder, peer, events, taker, device=device)
            )
        elif role == "miner":
            service = miner_for(setup, task, identity, peer, events, device=device)
        elif isinstance(options, AuditOptions):
            stop = options.stop_on_mismatch
            service = Auditor(setup, peer, events, folder, task.initial_master, stop_on_mismatch=stop)
        else:
            audit = folder if isinstance(options, FollowOptions) and options.audit else None
            service = follower_for(setup, task, identity, peer, events, device=device, audit=audit)
        await until_signal(service.run(options.rounds))
        if isinstance(service, Auditor) and service.mismatches:
            return AUDIT_MISMATCH_EXIT
    finally:
        await peer.shutdown()
        events.finish()
    return 0


async def until_signal(work: Awaitable[Any]) -> None:
    """Run `work` until it ends or SIGINT / SIGTERM arrives (then cancel it)."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(work)

    def stop() -> None:
        task.cancel()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop)
    with contextlib.suppress(asyncio.CancelledError):
        await task
