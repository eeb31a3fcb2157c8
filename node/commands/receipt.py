"""`pulse receipt --round R`: why a miner's submission of round R was selected or not, and its gains
recomputed here from public data (`node/roles/receipt.py`).

Exit status: 0 when the committed figures hold (or there was nothing to recompute), 3 when a
recomputed figure is outside the stated tolerance, 1 when the round's data is not fetchable.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from pydantic import Field

from node.commands.argtypes import KeyFile
from node.commands.keygen import DEFAULT_KEY_PATH
from node.commands.options import add_options, options_from
from node.commands.roles import DEFAULT_CONFIG
from node.net.keyfile import load_key_file
from node.net.netconfig import NetConfig, NetOptions
from node.net.p2ppeer import P2PPeer
from node.roles.receipt import Found, receipt_for
from node.roles.records import run_records
from node.run.manifest import load_manifest
from node.run.setup import RunSetup
from node.run.task import task_for
from protocol.errors import ConfigError, KeyFileError, NetworkError, ProtocolError
from protocol.identity import Identity
from protocol.messages import PublicKeyHex
from validator.receipt import GAIN_ABS_TOL, GAIN_REL_TOL

DIFFERS_EXIT = 3


class ReceiptOptions(NetOptions):
    """`pulse receipt`'s options, the network's flags among them."""

    config: Path = DEFAULT_CONFIG
    """run manifest TOML"""
    round: int = Field(ge=0)
    """the round to explain"""
    key: KeyFile = DEFAULT_KEY_PATH
    """the miner's key file"""
    miner: PublicKeyHex | None = None
    """a miner's public key (hex) instead of --key"""
    payload: Path | None = None
    """the payload file the miner sent (default: fetched by hash)"""
    state_dir: Path | None = None
    """a folder for blobs (a miner's own: its payload is found there)"""
    print_json: bool = Field(default=False, alias="json")
    """print one JSON object"""


def register(subparsers: Any) -> None:
    text = "why a miner's submission of a round was selected or not, with its gains recomputed locally"
    parser = subparsers.add_parser("receipt", help=text, description=text)
    add_options(parser, ReceiptOptions)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        options = options_from(ReceiptOptions, args)
        setup = RunSetup.from_manifest(load_manifest(options.config))
        miner = options.miner or load_key_file(options.key).public_hex
        payload = options.payload.read_bytes() if options.payload is not None else None
        config = options.net_config()
    except (ConfigError, KeyFileError, OSError) as exc:
        print(f"pulse receipt: {exc}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="pulse-receipt-") as scratch:
        folder = options.state_dir or Path(scratch)
        try:
            found = asyncio.run(_main(setup, config, folder, miner, options.round, payload))
        except (NetworkError, ProtocolError) as exc:
            print(f"pulse receipt: round {options.round}: {exc}", file=sys.stderr)
            return 1
    print(json.dumps(as_json(found), sort_keys=True) if options.print_json else as_text(found))
    return DIFFERS_EXIT if found.recomputed is not None and not found.recomputed.ok else 0


async def _main(
    setup: RunSetup, config: NetConfig, folder: Path, miner: str, round_: int, payload: bytes | None
) -> Found:
    peer = await P2PPeer.create(config, run_records(setup.manifest), Identity.generate(), folder, role="follower")
    try:
        return await receipt_for(setup, task_for(setup), peer, miner, round_, payload)
    finally:
        await peer.shutdown()


def as_json(found: Found) -> dict[str, Any]:
    r, c = found.receipt, found.recomputed
    a = r.assessed
    committed = None if a is None else {"norm": a.norm, "gains": a.gains, "indicator": a.indicator, "final": a.final}
    recomputed: dict[str, Any] | None = None
    if c is not None:
        recomputed = {"norm": c.norm, "assigned": c.assigned, "random": c.random, "indicator": c.indicator}
        recomputed["differs"] = c.differs
    return {
        "round": r.round,
        "miner": r.miner,
        "validator": found.result.sender_hex,
        "verdict": r.verdict,
        "reason": r.reason,
        "rank": r.rank,
        "score": r.score,
        "clip": r.clip,
        "committed": committed,
        "recomputed": recomputed,
        "not_recomputed": found.not_recomputed,
        "tolerance": {"gain_abs": GAIN_ABS_TOL, "gain_rel": GAIN_REL_TOL, "norm": "exact"},
    }


def as_text(found: Found) -> str:
    r, c, a = found.receipt, found.recomputed, found.receipt.assessed
    lines = [f"round {r.round}, miner {r.miner[:12]}: {r.verdict} ({r.reason})"]
    if a is not None:
        gains = "not measured" if a.gains is None else ", ".join(f"{g:.6g}" for g in a.gains)
        lines.append(f"  the validator measured: norm {a.norm}, gains (assigned, random, references) {gains}")
        lines.append(f"  indicator {a.indicator}, final score {a.final}")
    if c is None:
        lines.append(f"  not recomputed: {found.not_recomputed}")
    elif c.ok:
        lines.append(
            f"  recomputed here: norm {c.norm} (exact), gains {c.assigned:.6g}, {c.random:.6g}, "
            f"indicator {c.indicator}: the committed figures hold (tolerance {GAIN_ABS_TOL} + {GAIN_REL_TOL} x |gain|)"
        )
    else:
        lines.append("  recomputed here, and these differ: " + "; ".join(c.differs))
    return "\n".join(lines)
