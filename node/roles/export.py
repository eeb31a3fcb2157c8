"""`pulse export`: the run's current model as a Hugging Face folder, with the ledger that proves who trained it.

    source = from_state_dir(Path("vstate"))                       # a validator's state folder
    source = from_checkpoint(Path("blob"), state_hash, round_)    # a fetched checkpoint (no ledger)
    source = await from_run(peer, 40)                             # the run's checkpoint of round 40 (None: latest)
    write_export(source, manifest, Path("model"))
    checked = verify_export(Path("model"))                        # raises on the first failure

The folder (`AutoModelForCausalLM.from_pretrained(folder)` loads it):

    config.json, model.safetensors   the architecture and the BF16 global weights W_round, the state
                                     every node of the run holds; the embedded GPT as GPT-2
                                     (`learn/hfexport.py`), a Hugging Face model as itself
    tokenizer files                  byte-level for the embedded GPT; the run's own for a Hugging Face model
    run.toml                         the manifest: it hashes to the run id and names the validator keys
    ledger.jsonl                     every round's signed result (`validator/ledger.py`)
    README.md                        the model card: run, round, state hash, who was aggregated each round

`verify_export` needs nothing but the folder: every result opens under run.toml's run id and is
signed by one of its validators; the results form one hash chain with no gap; the chain ends at
the state hash of model.safetensors (recomputed from the file); and where the manifest lets it
(the embedded GPT; a Hugging Face model whose files are on this machine) the chain starts at W_0,
recomputed from the manifest. A round result names each aggregated submission by its miner's key
and payload SHA-256; the miners' own signed headers are not kept by the validator.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from node.learn.hfexport import byte_tokenizer, from_gpt2, gpt2_config, to_gpt2
from node.learn.hfmodel import load_hf_tokenizer, model_dir
from node.net.peer import Peer
from node.roles.chainstate import load_checkpoint
from node.run.manifest import Manifest, load_manifest
from node.run.setup import RunSetup
from node.run.task import task_for
from protocol.errors import BrokenChain, ConfigError, CorruptState, WrongRun
from protocol.messages import CheckpointAnnouncement, RoundResult
from protocol.state import State, StateDict
from protocol.statehash import state_hash
from validator import ledger
from validator.state import COMMITTED, StateStore

WEIGHTS, MANIFEST, LEDGER, CARD = "model.safetensors", "run.toml", "ledger.jsonl", "README.md"
HF_PREFIX = "lm."  # a Hugging Face model's names inside pulse (`learn/hfmodel.py`)


@dataclass(frozen=True)
class Source:
    """The weights to export and what proves them."""

    weights: State  # BF16, pulse's names
    state_hash: str
    round: int | None  # the weights are W_round (None: unknown, a checkpoint given without its round)
    results: list[bytes]  # signed round results, round order; empty for a checkpoint


@dataclass(frozen=True)
class Checked:
    """What `verify_export` established."""

    run_id: str
    round: int | None
    state_hash: str
    results: list[RoundResult]
    initial: str  # how the chain's start was checked, in words


def from_state_dir(folder: Path) -> Source:
    """The committed state of a validator: its `--state-dir`, or the state folder inside it."""
    store = StateStore(folder if (folder / COMMITTED).exists() else folder / "validator")
    snap = store.load()
    weights = {name: t.to(torch.bfloat16) for name, t in snap.master.items()}  # as `OuterOptimizer.bf16_weights`
    digest = state_hash(weights)
    if digest != snap.book.states[-1]:
        raise CorruptState(f"{store.directory}: the master weights do not give the committed state hash")
    return Source(weights, digest, snap.book.round, store.results())


def from_checkpoint(path: Path, expect_hash: str, round_: int | None) -> Source:
    """A checkpoint blob (safetensors, BF16) whose state hash must be `expect_hash`."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"--checkpoint: {exc}") from exc
    return Source(load_checkpoint(data, expect_hash), expect_hash, round_, [])


async def from_run(peer: Peer, round_: int | None) -> Source:
    """The checkpoint the run's validator announced at `round_` (None: the newest its head names),
    fetched and checked against its announced state hash; `ConfigError` if there is none."""
    head = await peer.head()
    if head is not None:
        peer.validator_peer = head.validator_peer  # it serves every checkpoint it keeps
    newest = head.checkpoint if head is not None else None
    found = newest if round_ is None else await peer.from_validator(CheckpointAnnouncement, round_)
    if found is None:
        every = peer.run.checkpoint_every
        hint = f"; the newest is of round {newest.round}" if newest is not None else "; none is announced yet"
        which = "latest" if round_ is None else str(round_)
        raise ConfigError(f"--checkpoint {which}: no checkpoint of that round (one every {every} rounds{hint})")
    path = await peer.fetch(found.blob_sha256, found.blob_size, found.round)
    return from_checkpoint(path, found.state_hash, found.round)


def write_export(source: Source, manifest: Manifest, out: Path) -> list[RoundResult]:
    """Write the Hugging Face folder `out` (new or empty); returns the verified round results."""
    results = check_source(source, manifest)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"--out {out} is not an empty folder")
    out.mkdir(parents=True, exist_ok=True)
    metadata = {"format": "pt", "pulse_run_id": manifest.run_id, "pulse_state_hash": source.state_hash}
    if source.round is not None:
        metadata["pulse_round"] = str(source.round)
    save_file(_hf_weights(source.weights, manifest), out / WEIGHTS, metadata=metadata)
    (out / WEIGHTS).chmod(0o644)  # written private (a temp file renamed); a model to share is readable
    tokenizer = _write_architecture(manifest, out)
    (out / MANIFEST).write_text(manifest.to_toml())
    ledger.write(out / LEDGER, [(r.round, envelope) for r, envelope in zip(results, source.results, strict=True)])
    (out / CARD).write_text(model_card(manifest, source, results, tokenizer))
    return results


def check_source(source: Source, manifest: Manifest) -> list[RoundResult]:
    """The source's results, verified against the manifest's run and validators, ending at its weights."""
    try:
        results = ledger.verify_chain(source.results, manifest.run_id, manifest.validators)
    except WrongRun as exc:
        raise ConfigError(f"the round results do not belong to this manifest's run: {exc}") from exc
    if results:
        last = results[-1]
        if last.new_state_hash != source.state_hash or (source.round is not None and last.round + 1 != source.round):
            raise BrokenChain(f"the last round result (round {last.round}) does not end at the state exported")
    return results


def _hf_weights(weights: State, manifest: Manifest) -> StateDict:
    if manifest.model.kind == "gpt":
        return to_gpt2(weights)
    if not all(name.startswith(HF_PREFIX) for name in weights):
        raise ConfigError("the weights are not a Hugging Face model's (names without the 'lm.' prefix)")
    return {name.removeprefix(HF_PREFIX): t.contiguous() for name, t in weights.items()}


def _pulse_weights(hf: State, manifest: Manifest) -> StateDict:
    if manifest.model.kind == "gpt":
        return from_gpt2(hf, manifest.model.gpt)
    return {HF_PREFIX + name: t for name, t in hf.items()}


def _write_architecture(manifest: Manifest, out: Path) -> str:
    """config.json and the tokenizer; returns what the card says about the tokenizer."""
    from transformers import AutoConfig

    if manifest.model.kind == "gpt":
        fields = gpt2_config(manifest.model.gpt)
        AutoConfig.for_model(fields.pop("model_type"), **fields, dtype="bfloat16").save_pretrained(out)
        byte_tokenizer(manifest.model.gpt.block_size).save_pretrained(out)
        return "byte-level: token id = byte value (256 tokens, no merges, no special tokens)"
    root = model_dir(manifest.model.path or "")
    for name in ("config.json", "generation_config.json"):
        if (root / name).is_file():
            shutil.copyfile(root / name, out / name)
    try:
        load_hf_tokenizer(str(root)).save_pretrained(out)
    except ConfigError as exc:
        return f"not exported ({exc})"
    return f"the run's own, from {root.name}"


def verify_export(folder: Path) -> Checked:
    """Check an exported folder from its files alone (see the module docstring); the first failure raises."""
    manifest = load_manifest(folder / MANIFEST)
    try:
        with safe_open(str(folder / WEIGHTS), framework="pt") as f:
            metadata = f.metadata() or {}
        weights = _pulse_weights(load_file(folder / WEIGHTS), manifest)
    except (OSError, SafetensorError, ValueError) as exc:
        raise CorruptState(f"{folder / WEIGHTS}: {exc}") from exc
    digest = state_hash(weights)
    if metadata.get("pulse_state_hash") not in (None, digest):
        raise BrokenChain(
            f"{WEIGHTS} hashes to {digest[:12]}..., its metadata says {metadata['pulse_state_hash'][:12]}..."
        )
    round_ = int(metadata["pulse_round"]) if "pulse_round" in metadata else None
    entries = ledger.read(folder / LEDGER)
    results = check_source(Source(weights, digest, round_, [envelope for _, envelope in entries]), manifest)
    if [r for r, _ in entries] != [result.round for result in results]:
        raise BrokenChain(f"{LEDGER}: a line's round differs from the round its signed result names")
    return Checked(manifest.run_id, round_, digest, results, _check_start(manifest, results))


def _check_start(manifest: Manifest, results: list[RoundResult]) -> str:
    if not results:
        return "no ledger: nothing to check"
    if results[0].round != 0:
        return f"the ledger starts at round {results[0].round}: W_0 not checked"
    if manifest.model.kind == "hf" and not Path(manifest.model.path or "").expanduser().is_dir():
        return f"W_0 not checked: the model files ({manifest.model.path}) are not on this machine"
    initial = state_hash(
        {n: t.to(torch.bfloat16) for n, t in task_for(RunSetup.from_manifest(manifest)).initial_master().items()}
    )
    if initial != results[0].base_state_hash:
        raise BrokenChain(
            f"round 0 starts from {results[0].base_state_hash[:12]}..., W_0 of the manifest is {initial[:12]}..."
        )
    return f"round 0 starts from W_0 of the manifest ({initial[:12]}...)"


def model_card(manifest: Manifest, source: Source, results: list[RoundResult], tokenizer: str) -> str:
    """README.md: how to load and check the model, and who was aggregated in every round."""
    architecture = "GPT-2 (the embedded byte-level GPT, exactly)" if manifest.model.kind == "gpt" else "the run's own"
    lines = [
        "---",
        "library_name: transformers",
        "tags: [pulse, decentralized-training]",
        "---",
        "",
        f"# {manifest.name}: trained by a pulse run",
        "",
        "| | |",
        "|---|---|",
        f"| run id | `{manifest.run_id}` |",
        f"| round | {source.round if source.round is not None else 'unknown (checkpoint)'} |",
        f"| state hash (BF16 weights) | `{source.state_hash}` |",
        f"| architecture | {architecture} |",
        f"| tokenizer | {tokenizer} |",
        f"| validators | {', '.join(f'`{k}`' for k in manifest.validators)} |",
        f"| rounds in the ledger | {_span(results)} |",
        "",
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        'model = AutoModelForCausalLM.from_pretrained("<this folder>")  # BF16 weights, as trained',
        'tokenizer = AutoTokenizer.from_pretrained("<this folder>")',
        "```",
        "",
        f"`pulse export --verify <this folder>` checks every signature in `{LEDGER}`, the hash chain, and",
        f"that it ends at the weights in `{WEIGHTS}` (`{MANIFEST}` is the run manifest: its hash is the run id).",
        "",
        "## Contributors",
        "",
    ]
    lines += _contributors(results)
    return "\n".join(lines) + "\n"


def _span(results: list[RoundResult]) -> str:
    if not results:
        return "none (exported from a checkpoint; the ledger lives in the validator's state folder)"
    return f"{results[0].round} to {results[-1].round} ({len(results)})"


def _contributors(results: list[RoundResult]) -> list[str]:
    if not results:
        return ["No ledger was exported with this model."]
    totals: dict[str, list[int]] = {}
    for result in results:
        for s in result.selected:
            totals.setdefault(s.sender, []).append(result.round)
    lines = ["| miner key | rounds aggregated | first | last |", "|---|---:|---:|---:|"]
    for key, rounds in sorted(totals.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        lines.append(f"| `{key}` | {len(rounds)} | {rounds[0]} | {rounds[-1]} |")
    lines += ["", "Every round (key prefixes; the signed results in the ledger name the full keys and payloads):", ""]
    lines += ["| round | aggregated (miner: score) | not aggregated | new state |", "|---:|---|---:|---|"]
    for result in results:
        ranked = sorted(result.selected, key=lambda s: -s.score)
        named = ", ".join(f"`{s.sender[:12]}`: {s.score:.4g}" for s in ranked) or "none"
        lines.append(f"| {result.round} | {named} | {len(result.rejections)} | `{result.new_state_hash[:12]}` |")
    return lines


def summary(checked: Checked) -> dict[str, Any]:
    """The verification as one JSON-able object (`pulse export --verify --json`)."""
    miners = {s.sender for r in checked.results for s in r.selected}
    return {
        "run_id": checked.run_id,
        "round": checked.round,
        "state_hash": checked.state_hash,
        "rounds_verified": len(checked.results),
        "contributors": len(miners),
        "initial_state": checked.initial,
    }
