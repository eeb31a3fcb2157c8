"""A run frozen at round R, for join benchmarks and tests: a random BF16 state, a checkpoint of round 0
with its piece index, and the patches of rounds 0 .. R-1, all signed by a validator key.

    python -m node.swarm.frozenrun make DIR --state-mib 1024 --patches 2
    python -m node.swarm.frozenrun serve DIR --role validator --host /ip4/10.232.7.1/tcp/0
    python -m node.swarm.frozenrun serve DIR --role holder --name h1 --host ... --initial-peers ...
    python -m node.swarm.frozenrun join DIR --state-dir D --host ... --initial-peers ... --out result.json
    python -m node.swarm.frozenrun fetch DIR --state-dir D --host ... --initial-peers ... --out result.json

Real pieces throughout: `P2PPeer` nodes on hivemind's DHT and libp2p streams, the validator's
records published and re-published as a validator does, holders that heartbeat what they serve, and
the joiner running `Chain.sync` exactly as a follower or miner does. What is not real is the run
itself: no model, no training, so a 0.5B-sized join can be measured on a CPU in minutes. A state of
N bytes is a handful of BF16 tensors shaped like a transformer's (rows of 896 values, 0.5B's width).

`serve` prints one JSON line (its multiaddrs) when it is ready, then serves until stdin closes or
it is killed; `join` and `fetch` write their figures to `--out`.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, Field, ValidationError, model_validator

from node.events import Events
from node.net.blobstore import BlobStore
from node.net.keyfile import load_key_file, write_key_file
from node.net.netconfig import NetConfig
from node.net.p2ppeer import P2PPeer
from node.net.peer import RunRecords
from node.roles.catchup import Chain
from node.roles.chainstate import checkpoint_bytes
from protocol import pulsesync
from protocol.identity import Identity
from protocol.messages import BlobRef, CheckpointAnnouncement, OuterStep, RoundResult
from protocol.parsing import STRICT, flag_line
from protocol.pieces import checkpoint_index
from protocol.signing import sign
from protocol.statehash import state_hash

log = logging.getLogger(__name__)
WIDTH = 896  # Qwen2.5-0.5B's hidden size
HEARTBEAT_SECONDS = 2.0


@dataclass(frozen=True)
class FrozenRun:
    folder: Path

    @property
    def facts(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.folder / "run.json").read_text())
        return data

    @property
    def rounds(self) -> int:
        return int(self.facts["rounds"])

    def records(self) -> RunRecords:
        f = self.facts
        return RunRecords(f["run_id"], (f["validator"],), 3600.0, max(1, self.rounds))

    def store(self) -> BlobStore:
        return BlobStore(self.folder / "blobs")

    def envelopes(self) -> list[bytes]:
        return [p.read_bytes() for p in sorted((self.folder / "records").iterdir())]


def random_state(total_bytes: int, seed: int) -> dict[str, torch.Tensor]:
    """BF16 tensors of about `total_bytes` in all, (rows, WIDTH) each, values like trained weights (std 0.02)."""
    gen = torch.Generator().manual_seed(seed)
    rows_left, state, i = max(1, total_bytes // (2 * WIDTH)), {}, 0
    while rows_left > 0:
        rows = min(rows_left, 4864)  # an MLP projection's height at 0.5B
        state[f"layers.{i:03d}.weight"] = (torch.randn(rows, WIDTH, generator=gen) * 0.02).to(torch.bfloat16)
        rows_left -= rows
        i += 1
    state["norm.weight"] = torch.ones(WIDTH, dtype=torch.bfloat16)
    return state


def changed(state: dict[str, torch.Tensor], fraction: float, seed: int) -> dict[str, torch.Tensor]:
    """A copy of `state` with about `fraction` of its values nudged by one BF16 step (a sparse patch)."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, t in state.items():
        mask = torch.rand(t.shape, generator=gen) < fraction
        bumped = (t.view(torch.int16) + mask.to(torch.int16)).view(torch.bfloat16)
        out[name] = bumped
    return out


def make(folder: Path, state_bytes: int, patches: int, seed: int = 0) -> FrozenRun:
    """Write the frozen run: blobs (checkpoint, piece index, patches), signed records, the validator key."""
    shutil.rmtree(folder, ignore_errors=True)
    (folder / "records").mkdir(parents=True)
    validator = Identity.generate()
    write_key_file(validator, folder / "validator.key")
    run_id = os.urandom(32).hex()
    store = BlobStore(folder / "blobs")
    weights = random_state(state_bytes, seed)
    h = state_hash(weights)
    blob = checkpoint_bytes(weights)
    index = checkpoint_index(blob).to_bytes()
    ann = CheckpointAnnouncement(
        run_id=run_id,
        round=0,
        state_hash=h,
        blob_sha256=store.put(blob),
        blob_size=len(blob),
        format="safetensors",
        index_sha256=store.put(index),
        index_size=len(index),
    )
    del blob
    records = [sign(validator, ann).to_bytes()]
    for r in range(patches):
        new = changed(weights, 0.01, seed + 1 + r)
        new_hash = state_hash(new)
        patch = pulsesync.encode(weights, new, old_hash=h, new_hash=new_hash)
        result = RoundResult(
            run_id=run_id,
            round=r,
            selected=(),
            rejections=(),
            base_state_hash=h,
            patch_sha256=store.put(patch),
            patch_size=len(patch),
            new_state_hash=new_hash,
            # a frozen run is for joins (hash-checked patches), not audits: the FP32 states and the
            # evidence are named by placeholders no auditor can fetch
            master_before=_placeholder(f"fp32/{r}"),
            master_after=_placeholder(f"fp32/{r + 1}"),
            outer=OuterStep(lr=1.0, momentum=0.0, nesterov=False, steps=r),
            evidence=BlobRef(sha256=_placeholder(f"evidence/{r}"), size=1),
            master_checkpoint=None,
        )
        records.append(sign(validator, result).to_bytes())
        weights, h = new, new_hash
    for i, envelope in enumerate(records):
        (folder / "records" / f"{i:04d}.bin").write_bytes(envelope)
    facts = {
        "run_id": run_id,
        "validator": validator.public_hex,
        "rounds": patches,
        "final_hash": h,
        "checkpoint": {"sha256": ann.blob_sha256, "size": ann.blob_size},
        "index_size": len(index),
        "patch_bytes": sum(RoundResult.from_canonical(_body(e)).patch_size for e in records[1:]),
    }
    (folder / "run.json").write_text(json.dumps(facts, indent=1))
    return FrozenRun(folder)


def _body(envelope: bytes) -> bytes:
    from protocol.signing import SignedMessage

    return SignedMessage.from_bytes(envelope).body


# -- processes -------------------------------------------------------------------------------------


class WorkerOptions(BaseModel):
    """A worker process's options (`main` parses its command line into them)."""

    model_config = STRICT

    what: Literal["make", "serve", "join", "fetch"]
    """what this process does"""
    dir: Path
    """the frozen run's folder"""
    state_mib: float = Field(default=64.0, gt=0)
    """make: the state's size"""
    patches: int = Field(default=2, ge=0)
    """make: patches after the checkpoint"""
    role: Literal["validator", "holder"] = "holder"
    """serve: publish the run's records (validator) or only hold blobs"""
    holds: Literal["all", "checkpoint", "chain"] = "checkpoint"
    """serve: the blobs held"""
    state_dir: Path | None = None
    """this node's folder (serve, join and fetch)"""
    host: str = "/ip4/127.0.0.1/tcp/0"
    """the listen multiaddr"""
    initial_peers: list[str] = Field(default_factory=list)
    """peers to dial first"""
    out: Path | None = None
    """join and fetch: write the figures here"""

    @model_validator(mode="after")
    def _node_has_a_folder(self) -> WorkerOptions:
        if self.what != "make" and self.state_dir is None:
            raise ValueError(f"--state-dir: {self.what} needs a folder")
        return self

    @property
    def folder(self) -> Path:
        """The node's folder (`--state-dir`: the validator checks that a node has one)."""
        assert self.state_dir is not None
        return self.state_dir

    def net(self) -> NetConfig:
        """This node's network: `--host`, dialing `--initial-peers`, no relays."""
        return NetConfig(initial_peers=tuple(self.initial_peers), host_maddrs=(self.host,), use_relay=False)


async def serve(run: FrozenRun, options: WorkerOptions) -> None:
    """A validator (publishes the records) or a holder, serving `--holds`: all blobs, only the
    checkpoint, or the chain (the piece index and the patches, not the checkpoint)."""
    folder = options.folder
    own = BlobStore(folder / "blobs")
    checkpoint = run.facts["checkpoint"]["sha256"]
    blobs = {
        "all": list(run.store()),
        "checkpoint": [checkpoint],
        "chain": [sha for sha in run.store() if sha != checkpoint],
    }[options.holds]
    for sha in blobs:
        target = own.path(sha)
        if not target.exists():
            os.link(run.store().path(sha), target)  # same file system: no copy of a 1 GB blob
    is_validator = options.role == "validator"
    identity = load_key_file(run.folder / "validator.key") if is_validator else Identity.generate()
    peer = await P2PPeer.create(
        options.net(), run.records(), identity, folder, role="validator" if is_validator else "follower"
    )
    for sha in blobs:  # all as of the last round: heartbeats up to it then sweep none of them
        peer.hold(sha, run.rounds, "checkpoint" if sha == checkpoint else "patch")
    if is_validator:
        for envelope in run.envelopes():
            await peer.publish_signed(envelope)
    maddrs = [str(a) for a in await peer.p2p.get_visible_maddrs()]
    print(json.dumps({"maddrs": maddrs, "peer_id": peer.peer_id}), flush=True)
    stop = asyncio.ensure_future(asyncio.get_running_loop().run_in_executor(None, sys.stdin.read))
    rounds = range(run.rounds + 1) if is_validator else [run.rounds]  # a validator was at every round
    try:
        while not stop.done():
            for r in rounds:
                await peer.heartbeat(r, None)
            await asyncio.wait([stop], timeout=HEARTBEAT_SECONDS)
    finally:
        await peer.shutdown()


async def join(run: FrozenRun, options: WorkerOptions) -> dict[str, Any]:
    """`Chain.sync` from nothing to W_R, timed from the moment the node is on the network."""
    started = time.monotonic()
    peer = await P2PPeer.create(options.net(), run.records(), Identity.generate(), options.folder, role="follower")
    try:
        online = time.monotonic()
        chain = Chain(peer, Events("joiner", options.folder / "events.jsonl"), poll=0.2)
        held = await chain.sync()
        done = time.monotonic()
    finally:
        await peer.shutdown()
    if held.state_hash != run.facts["final_hash"] or held.round != run.rounds:
        raise RuntimeError(f"joined at round {held.round} with {held.state_hash[:12]}, not the frozen run's end")
    return {"join_seconds": done - online, "with_startup_seconds": done - started}


async def fetch(run: FrozenRun, options: WorkerOptions) -> dict[str, Any]:
    """One whole-blob fetch of the checkpoint (`Peer.fetch`: one holder at a time), timed from the
    request to the blob verified on disk; finding its holders in the DHT is timed apart."""
    peer = await P2PPeer.create(options.net(), run.records(), Identity.generate(), options.folder, role="follower")
    try:
        cp = run.facts["checkpoint"]
        start = time.monotonic()
        await peer.holders_of(cp["sha256"], run.rounds - 1)  # the DHT route warmed up; the fetch looks again
        looked_up = time.monotonic()
        await peer.fetch(cp["sha256"], cp["size"], run.rounds - 1)
        done = time.monotonic()
    finally:
        await peer.shutdown()
    return {"fetch_seconds": done - looked_up, "lookup_seconds": looked_up - start, "bytes": cp["size"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m node.swarm.frozenrun")
    parser.add_argument("what")
    parser.add_argument("dir", type=Path)
    parser.add_argument("--state-mib", type=float, default=argparse.SUPPRESS)
    parser.add_argument("--patches", type=int, default=argparse.SUPPRESS)
    parser.add_argument("--role", default=argparse.SUPPRESS)
    parser.add_argument("--holds", default=argparse.SUPPRESS)
    parser.add_argument("--state-dir", type=Path, default=argparse.SUPPRESS)
    parser.add_argument("--host", default=argparse.SUPPRESS)
    parser.add_argument("--initial-peers", nargs="*", default=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=argparse.SUPPRESS)
    try:  # the command line splits here; the options check it (a flag left out: the option's default)
        options = WorkerOptions.model_validate(vars(parser.parse_args(argv)))
    except ValidationError as exc:  # one line, the flag named: `--patches: Input should be ...`
        parser.error(flag_line(exc))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if options.what == "make":
        make(options.dir, int(options.state_mib * 2**20), options.patches)
        return 0
    run = FrozenRun(options.dir)
    if options.what == "serve":
        asyncio.run(serve(run, options))
        return 0
    figures = asyncio.run(join(run, options) if options.what == "join" else fetch(run, options))
    if options.out is not None:
        options.out.write_text(json.dumps(figures))
    print(json.dumps(figures), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())


def _placeholder(text: str) -> str:
    return hashlib.sha256(f"pulse-frozen-run/{text}".encode()).hexdigest()
