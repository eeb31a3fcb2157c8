"""Hostile payloads and signed headers, built the way a real miner builds honest ones.

Pure functions of the round (weights, state hash) and the attacker's key: no network. What needs
training (sign flip, random direction, thief, stale base) reuses the fake miners of
`node.swarm.fakeminers`; this file adds what they do not craft: malformed payloads (a zstd bomb,
trailing bytes, positions out of range or claimed twice, inf), the near copy, ALIE and
inner-product manipulation, a tiny payload that declares every weight sent, and headers signed for
another run or round or with a broken signature.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, replace
from functools import cache

import numpy as np
import torch
import zstandard

from node.run.manifest import Manifest
from node.run.setup import RunSetup
from node.run.trainer import MinerSpec
from node.swarm.fakeminers import FakeRun, RoundView, decoded_scale
from protocol import floatcode, positions
from protocol.codec import Codec, default_max_bytes, layout_digest, read_words, write_words
from protocol.codec_options import build_codec
from protocol.identity import Identity
from protocol.messages import SubmissionHeader
from protocol.pulseloco import PulseLoCoCodec
from protocol.signing import sign
from protocol.sparseloco import CHUNK, SparseLoCoCodec
from protocol.state import State
from protocol.wire import Reader, Writer
from validator.aggregate import global_norm
from validator.intake import Submission

BOMB_BYTES = 1 << 30  # what the zstd frame expands to


@dataclass(frozen=True)
class Forge:
    """Everything an attacker needs to sign a submission for one round."""

    setup: RunSetup
    round: int
    weights: State  # BF16 W_r
    state_hash: str

    @property
    def manifest(self) -> Manifest:
        return self.setup.manifest

    @property
    def codec(self) -> Codec:
        return build_codec(self.manifest.train.codec, self.manifest.train.codec_options)

    def header(self, me: Identity, payload: bytes, **claims: object) -> SubmissionHeader:
        """The honest header for `payload`, with any field replaced by a lie in `claims`."""
        header = SubmissionHeader.for_payload(
            run_id=self.setup.run_id,
            round_=self.round,
            base_hash=self.state_hash,
            payload=payload,
            codec=self.manifest.train.codec,
            data_digest=self.digest(me),
            sender=me.public_hex,
        )
        return header.model_copy(update=claims) if claims else header

    def digest(self, me: Identity) -> str:
        from protocol.assignment import Assignment

        batches = self.manifest.selection.assignment_batches
        return Assignment(self.setup.run_id, self.round, me.public_hex, batches).digest

    def submission(self, me: Identity, payload: bytes, **claims: object) -> Submission:
        return Submission(sign(me, self.header(me, payload, **claims)).to_bytes(), payload)

    def view(self, previous: tuple[State, str] | None) -> RoundView:
        return RoundView(self.round, self.weights, self.state_hash, previous)

    def small_update(self, seed: int) -> State:
        gen = torch.Generator().manual_seed(seed)
        return {n: torch.randn(t.shape, generator=gen) * 1e-3 for n, t in self.weights.items()}

    def compress(self, update: State, codec: Codec | None = None) -> bytes:
        return (codec or self.codec).compress(update, None, self.weights)[0]


def fake_setup(setup: RunSetup) -> FakeRun:
    """The fake miners' view of a real run (same model, codec, inner optimizer and batches)."""
    return FakeRun(MinerSpec.from_manifest(setup.manifest), setup.manifest.model.gpt, setup.batch)


# -- signatures ----------------------------------------------------------------------------------


def other_run(forge: Forge, me: Identity, payload: bytes) -> Submission:
    """A valid signature, for a run whose id differs from this one."""
    other = hashlib.sha256(b"another pulse run" + forge.setup.run_id.encode()).hexdigest()
    return forge.submission(me, payload, run_id=other)


def other_round(forge: Forge, me: Identity, payload: bytes) -> Submission:
    """A valid signature for the next round, sent while this one is open."""
    return forge.submission(me, payload, round=forge.round + 1)


def forged_signature(forge: Forge, me: Identity, payload: bytes) -> Submission:
    """The honest header with one bit of its signature flipped."""
    signed = sign(me, forge.header(me, payload))
    broken = bytes([signed.signature[0] ^ 1]) + signed.signature[1:]
    return Submission(replace(signed, signature=broken).to_bytes(), payload)


# -- malformed payloads --------------------------------------------------------------------------


def _common_header(forge: Forge) -> bytes:
    codec = forge.codec
    w = Writer()
    w.raw(codec.magic)
    w.u8(codec.version)
    w.varint(len(forge.weights))
    w.raw(layout_digest(forge.weights))
    return w.getvalue()


@cache
def _zstd_of_zeros(size: int) -> bytes:
    out = zstandard.ZstdCompressor(level=3).compressobj()
    block = bytes(1 << 20)
    parts = [out.compress(block) for _ in range(size >> 20)]
    return b"".join(parts) + out.flush()


def zstd_bomb(forge: Forge) -> bytes:
    """The codec's own header, then a zstd frame of ~40 KB that expands to 1 GiB of zeros."""
    return _common_header(forge) + _zstd_of_zeros(BOMB_BYTES)


def tiny_dense(forge: Forge) -> bytes:
    """A few hundred bytes that declare every weight sent: the run's own encoder on an update that
    carries no information (each value a positive power of two, half its weight's exponent: one
    symbol per context, zero mantissas), with each entropy-coded stream cut to one word. A decoder
    that reads past a stream's end, or lets a stream carry more symbols than its bytes can, turns
    it into a full-density update (about 78 bytes of transient memory per weight while decoding,
    and a copy-detection sketch to keep). PULSELoCo only, whose classes may be sent whole
    (SparseLoCo's density is fixed by its k): its payload is read up to its two streams (value
    format, class tables, models: `pulseloco.py`), which are then written again, one word each."""
    if not isinstance(forge.codec, PulseLoCoCodec):
        raise ValueError(f"a tiny dense payload needs PULSELoCo, this run's codec is {forge.codec.name}")
    payload = forge.compress({n: _half_power_of_two(t) for n, t in forge.weights.items()})
    r = Reader(payload, "payload")
    r.raw(len(_common_header(forge)))
    r.u8()  # value format
    tables = [positions.read_table(r, name, forge.weights[name].numel()) for name in sorted(forge.weights)]
    floatcode.read_models(r, sum(t.total for t in tables))
    streams_at = len(payload) - r.remaining
    pos_words, val_words = read_words(r), read_words(r)
    w = Writer()
    w.raw(payload[:streams_at])
    write_words(w, pos_words[:1])
    write_words(w, val_words[:1])
    return w.getvalue()


def _half_power_of_two(t: torch.Tensor) -> torch.Tensor:
    w = t.float()
    exponent = torch.floor(torch.log2(w.abs().clamp(min=torch.finfo(torch.float32).tiny)))
    return torch.where(w == 0, torch.zeros_like(w), torch.exp2(exponent - 1))


def trailing_bytes(forge: Forge, seed: int) -> bytes:
    """A well-formed payload with 16 extra bytes after its end (the header names all of it)."""
    return forge.compress(forge.small_update(seed)) + b"\x00" * 16


def oversize(forge: Forge, seed: int) -> bytes:
    """Random bytes 1 MB longer than the largest payload the run's codec accepts."""
    return junk(seed, default_max_bytes(forge.weights) + (1 << 20))


def noise_flood(
    forge: Forge, trained: State, seed: int, keys: int, *, late: bool = False
) -> list[tuple[Submission, dict[str, object]]]:
    """`keys` fresh keys (new each `seed`), each sending random noise at the decoded norm of `trained`:
    valid payloads inside the norm band that only an evaluation can turn down. `late`: each with its
    last byte changed, so that it reads whole and decodes, then fails (a decode's cost, for nothing)."""
    codec = forge.codec
    norm = global_norm(codec.decompress(forge.compress(trained), forge.weights))
    gen = torch.Generator().manual_seed(seed)
    scale = 0.0
    out: list[tuple[Submission, dict[str, object]]] = []
    for i in range(keys):
        key = Identity.from_seed(hashlib.sha256(f"{'late' if late else 'noise'}-flood/{seed}/{i}".encode()).digest())
        noise = {name: torch.randn(t.shape, generator=gen) for name, t in forge.weights.items()}
        if not scale:  # the codec keeps about the same share of any random update's norm: measured once
            scale = decoded_scale(codec, noise, forge.weights, norm)
        payload = forge.compress({n: t * scale for n, t in noise.items()})
        if late:
            payload = payload[:-1] + bytes([payload[-1] ^ 0xFF])
        out.append((forge.submission(key, payload), {}))
    return out


def junk(seed: int, size: int = 4096) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()


class _GapTamper(SparseLoCoCodec):
    """SparseLoCo whose first sparse tensor's positions are tampered with before entropy coding.

    'range': the first chunk's last gap runs past the tensor's end.
    'duplicate': the first chunk's last position is moved onto the second chunk's first position,
    so one flat position is claimed twice. (The gap code has no way to say a position twice
    inside one chunk: a gap is >= 0, positions strictly increase.)
    """

    def __init__(self, k: int, beta: float, mode: str) -> None:
        super().__init__(k, beta)
        self.mode, self.done = mode, False

    def _sparsify(self, acc: torch.Tensor, shape: torch.Size, k_send: int):  # type: ignore[no-untyped-def]
        part, e_new = super()._sparsify(acc, shape, k_send)
        if self.done or len(part.k) < 2:
            return part, e_new
        self.done = True
        gaps, k0 = part.gaps.copy(), int(part.k[0])
        if self.mode == "range":
            gaps[k0 - 1] += int(part.sizes.sum())
        else:
            last = int(np.sum(gaps[:k0] + 1)) - 1  # rank of chunk 0's last position
            gaps[k0 - 1] += CHUNK + int(gaps[k0]) - last
        return replace(part, gaps=gaps), e_new


def tampered_positions(forge: Forge, seed: int, mode: str) -> bytes:
    options = forge.manifest.train.codec_options
    codec = _GapTamper(options.k, options.beta, mode)
    return forge.compress(forge.small_update(seed), codec)


def poisoned_values(forge: Forge, seed: int, value: float) -> bytes:
    """A well-formed SparseLoCo payload whose first tensor's 4 centroids are `value` (NaN or inf)."""
    payload = forge.compress(forge.small_update(seed))
    r = Reader(payload, "payload")
    r.raw(len(forge.codec.magic) + 1)
    r.varint(1 << 32, "tensor count")
    r.raw(8)  # layout digest
    r.varint(CHUNK, "k")
    r.u8()  # theta of the first 2-D tensor, then its 4 f32 centroids (sparseloco.py)
    at = len(payload) - r.remaining
    return payload[:at] + struct.pack("<4f", *[value] * 4) + payload[at + 16 :]


# -- payloads made from honest ones --------------------------------------------------------------


def near_copy(forge: Forge, honest: bytes, seed: int) -> bytes:
    """Same positions, every value perturbed by ~5%, re-encoded (the attacker then signs it)."""
    update = forge.codec.decompress(honest, forge.weights)
    gen = torch.Generator().manual_seed(seed)
    return forge.compress({n: t * (1 + 0.05 * torch.randn(t.shape, generator=gen)) for n, t in update.items()})


def _decoded(forge: Forge, honest: list[bytes]) -> list[State]:
    return [forge.codec.decompress(p, forge.weights) for p in honest]


def alie(forge: Forge, honest: list[bytes], z: float = 1.0) -> bytes:
    """'A little is enough': mean - z * std of the honest updates, per coordinate."""
    updates = _decoded(forge, honest)
    out = {}
    for name in forge.weights:
        stack = torch.stack([u[name] for u in updates])
        out[name] = stack.mean(0) - z * stack.std(0, unbiased=False)
    return forge.compress(out)


def inner_product_manipulation(forge: Forge, honest: list[bytes], scale: float = 0.1) -> bytes:
    """-scale x the mean of the honest updates: a small step against their direction."""
    updates = _decoded(forge, honest)
    return forge.compress({n: -scale * torch.stack([u[n] for u in updates]).mean(0) for n in forge.weights})
