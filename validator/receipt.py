"""A miner's receipt: why its submission of a round was selected or not, and its scores recomputed.

    receipt = explain(result, evidence, miner)                  # from the signed result and its evidence
    check = recompute(receipt, weights, payload, cfg, ...)      # its gains, measured again locally

`explain` reads only what the validator signed (the round result and the evidence blob it names):
the verdict (selected at rank k with its clip factor and norm; rejected and why; or not named: the
validator never took the submission), and what the validator measured (norm, gains, indicator,
final score). `recompute` redraws the round's batches from the revealed round secret (checked
against the validator's key), loads W_r and the miner's own payload, and measures the gains of its
update on its assigned batch and on the random batches, as the Gauntlet did (`scoring.RoundEvaluation`),
scaled by the same clip factor. The reference update's gains are the committed ones (the reference
is built from the round's other admissible payloads of established keys, most of them not kept); the indicator is
recomputed from both.

Tolerance: a loss is a float32 forward pass whose reductions may group differently with the
thread count and the CPU, so a recomputed gain may differ from the committed one in its last
bits: `GAIN_ABS_TOL` + `GAIN_REL_TOL` x |committed| is allowed (orders of magnitude above that
noise, far below a gain that would change a verdict).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from protocol.assignment import Assignment
from protocol.codec import default_max_bytes
from protocol.codec_options import build_codec
from protocol.messages import RoundResult
from protocol.state import State
from validator.aggregate import global_norm
from validator.config import GauntletConfig
from validator.evidence import Assessed, RoundEvidence
from validator.scoring import Batch, Evaluator, Gains, RoundEvaluation, RoundSecret

GAIN_ABS_TOL = 1e-5
GAIN_REL_TOL = 1e-3

Verdict = Literal["selected", "rejected", "not named"]


@dataclass(frozen=True)
class Receipt:
    round: int
    miner: str
    verdict: Verdict
    reason: str  # why, in words
    payload_sha256: str | None
    rank: int | None  # 1-based place among the selected
    score: float | None
    clip: float | None
    assessed: Assessed | None


@dataclass(frozen=True)
class Recomputed:
    norm: float
    assigned: float  # gain on its assigned batch
    random: float  # gain on the random batches (the score the rating ranks by)
    indicator: int
    differs: list[str]  # what is outside the tolerance (empty: the committed figures hold)

    @property
    def ok(self) -> bool:
        return not self.differs


def explain(result: RoundResult, evidence: RoundEvidence, miner: str) -> Receipt:
    """The verdict on `miner`'s submission in `result`'s round, from the signed result and evidence."""
    r = result.round
    assessed = evidence.assessed_of(miner)
    for rank, s in enumerate(result.selected, 1):
        if s.sender == miner:
            clip = next((a.clip for a in evidence.aggregated if a.sender == miner), None)
            why = f"selected, {_ordinal(rank)} of {len(result.selected)} by score {s.score:.4g}"
            if clip is not None and clip < 1:
                why += f"; its update was scaled by {clip:.4g} (norm over the median of the aggregated)"
            return Receipt(r, miner, "selected", why, s.payload_sha256, rank, s.score, clip, assessed)
    for rej in result.rejections:
        if rej.sender == miner:
            return Receipt(r, miner, "rejected", rej.reason, rej.payload_sha256, None, None, None, assessed)
    why = "the round's result does not name it: the validator did not take a submission from this key in this round"
    return Receipt(r, miner, "not named", why, None, None, None, None, None)


def recompute(
    receipt: Receipt,
    evidence: RoundEvidence,
    validator_key: bytes,
    weights: State,
    payload: bytes,
    cfg: GauntletConfig,
    evaluator: Evaluator,
    batch_fn: Callable[[int], Batch],
) -> Recomputed:
    """The miner's gains on W_r (`weights`), measured again; `ProtocolError` if the round secret does
    not verify or the payload does not decode, `ValueError` if the validator measured no gains."""
    committed = receipt.assessed
    if committed is None or committed.gains is None or committed.norm is None:
        raise ValueError(f"round {receipt.round}: the validator measured no gains for this submission")
    secret = RoundSecret.revealed(bytes.fromhex(evidence.secret), validator_key, evidence.run_id, evidence.round)
    codec = build_codec(cfg.codec, cfg.codec_options)
    update = codec.decompress(payload, weights, max_bytes=cfg.max_payload_bytes or default_max_bytes(weights))
    norm = global_norm(update)
    batches = cfg.assignment_batches
    seeds = Assignment(evidence.run_id, evidence.round, receipt.miner, batches).seeds
    picked = secret.assigned_indices(receipt.miner, batches, cfg.scored_assigned_batches)
    randoms = [batch_fn(s) for s in secret.random_seeds(cfg.random_batches)]
    ev = RoundEvaluation(evaluator, weights, cfg.eval_step, randoms, {0: [batch_fn(seeds[j]) for j in picked]})
    median = evidence.median_norm
    mine = ev.gains(0, update, min(1.0, median / norm) if norm > 0 else 1.0, None, complete=True)
    _, _, assigned_ref, random_ref = committed.gains
    gains = Gains(mine.assigned, mine.random, assigned_ref, random_ref)
    indicator = gains.indicator(cfg.indicator_margin, cfg.useful_share)
    differs = []
    if norm != committed.norm:  # norms are bit-reproducible (`aggregate.global_norm`)
        differs.append(f"norm: committed {committed.norm!r}, measured {norm!r}")
    for what, mine_value, theirs in (
        ("assigned gain", gains.assigned, committed.gains[0]),
        ("random gain", gains.random, committed.gains[1]),
    ):
        if not math.isclose(mine_value, theirs, rel_tol=GAIN_REL_TOL, abs_tol=GAIN_ABS_TOL):
            differs.append(f"{what}: committed {theirs:.6g}, measured {mine_value:.6g}")
    if indicator != committed.indicator:
        differs.append(f"indicator: committed {committed.indicator}, measured {indicator}")
    return Recomputed(norm, gains.assigned, gains.random, indicator, differs)


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"
