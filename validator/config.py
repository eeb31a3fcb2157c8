"""The validator's settings: strict pydantic models, one docstring per field, checked at load.

`UpdateRules` (codec, its options, the outer step) and `SelectionRules` (assignment, random
batches, top G, indicator threshold) are what a run fixes: a run manifest's `[train]` and
`[selection]` sections are these models, extended (`node/run/manifest.py`), so each field is
declared once. `GauntletConfig` is both plus the validator's own thresholds.

Defaults follow Templar's Gauntlet where it published a number (evaluation step 0.2 x outer lr,
indicator average 0.95/0.05, OpenSkill Plackett-Luce beta 7 and tau 0.1) and SparseLoCo's outer
step (plain SGD, lr 1.0). The other thresholds were set on the embedded GPT; `pulse bench
gauntlet` reports the figures they give.
"""

from __future__ import annotations

from typing import Any, Self

from pydantic import BaseModel, Field, model_validator

from protocol.codec import REGISTRY
from protocol.codec_options import CodecOptions
from protocol.messages import MAX_REJECTIONS, MAX_SELECTED
from protocol.parsing import STRICT
from validator.outer import OuterConfig


class UpdateRules(BaseModel):
    """How a run's pseudo-gradients travel and reach the master: miners encode with this codec, the
    validator decodes with it and applies the outer step. A run manifest's `[train]` section is this
    model plus the miners' inner loop."""

    model_config = STRICT

    codec: str = "sparseloco"
    """Pseudo-gradient codec of the run (`protocol.codec.REGISTRY`: 'pulseloco', 'sparseloco', or
    'dense' for comparisons); a submission whose header names another is rejected."""
    codec_options: CodecOptions = CodecOptions()
    """The codec's parameters (PULSELoCo: value_format; SparseLoCo: k, beta); payloads are encoded and
    decoded with exactly these."""
    outer: OuterConfig = OuterConfig(lr=1.0, momentum=0.0)
    """Outer step the validator applies to the FP32 master (SparseLoCo: plain SGD, lr 1.0)."""

    @model_validator(mode="after")
    def _codec_known(self) -> Self:
        if self.codec not in REGISTRY:
            raise ValueError(f"codec {self.codec!r} is not one of {sorted(REGISTRY)}")
        return self


class SelectionRules(BaseModel):
    """The selection settings a run fixes, so miners know them (their data assignment) and every
    validator of the run applies the same. A run manifest's `[selection]` section is this model plus
    the evaluation batch sizes."""

    model_config = STRICT

    assignment_batches: int = Field(default=2, ge=1, le=1024)
    """Batches in a miner's data assignment per round (`protocol.assignment`): inner step s trains on
    batch s mod this, so H (the inner steps) gives fresh data every step, fewer cycles over them."""
    scored_assigned_batches: int = Field(default=4, ge=1, le=64)
    """How many of a miner's assigned batches (drawn secretly each round; all of them if it has
    fewer) the validator measures the own-data gain on."""
    top_g: int = Field(default=8, ge=1, le=MAX_SELECTED)
    """At most this many submissions are aggregated per round, the best by final score."""
    random_batches: int = Field(default=2, ge=1, le=64)
    """Random training batches R the validator draws each round and scores every submission on."""
    min_indicator_average: float = Field(default=0.1, ge=0, le=1)
    """Only miners whose own-data indicator average reaches this are aggregated (three honest rounds
    from zero)."""
    steady_indicator_average: float = Field(default=0.2, ge=0, le=1)
    """A miner whose indicator average (this round's included) reaches this is eligible in a round whose
    indicator came out -1, too: its record outweighs one round's noise (an honest miner's indicator is
    -1 in about one round in six). At decay 0.95 that takes six +1 rounds in a row from zero before
    the -1 round, which a thief's lucky rounds (about one in four) give once in some 4,000 tries."""


class GauntletConfig(UpdateRules, SelectionRules):
    """How the validator checks, scores, selects and aggregates one round's submissions: what the run
    fixes (`UpdateRules`, `SelectionRules`), then the validator's own thresholds."""

    model_config = STRICT

    # -- intake ------------------------------------------------------------------------------
    max_submissions: int = Field(default=MAX_REJECTIONS, ge=1, le=MAX_REJECTIONS)
    """Seats per round: submissions taken (`admission.py`). Capped so every outcome fits the result."""
    newcomer_seats: int = Field(default=16, ge=1, le=MAX_REJECTIONS)
    """Of `max_submissions` (all of them if fewer), seats established miners cannot take: keys without a
    history are always drawn for at least these (and for every seat established miners leave)."""
    newcomer_evaluations: int = Field(default=32, ge=1, le=MAX_REJECTIONS)
    """Newcomers' payloads a round decodes whole and evaluates at most, lowest admission tickets first
    (keys earning standing before fresh ones); the rest are rejected unexamined, without penalty. A
    seat costs its payload's bytes; a decoded payload costs its decode and its forward passes (at 0.5B
    seconds each): without this bound a flood of fresh keys sending valid noise at the median norm
    would make every round decode and evaluate all 128 seats. Payloads that fail to decode before
    their whole body is read are cheap and do not count, so a flood of junk cannot spend it; those
    that fail later cost a decode and count (newcomers.py)."""
    established_rounds: int = Field(default=2, ge=1, le=64)
    """A miner is established (seated before newcomers; its norm counts in the gate's reference) once it
    earned standing in at least this many of the last `established_window` rounds. A round earns
    standing when the update gained on random data, its own-data indicator was +1, and it was no copy
    (of a peer's payload or of the public previous step): work on the miner's own assignment, which
    nothing public can stand in for."""
    established_window: int = Field(default=8, ge=1, le=64)
    """The rounds `established_rounds` counts in; the validator's history keeps no more than these."""
    senior_rounds: int = Field(default=24, ge=1)
    """An established miner whose first round of standing is at least this many rounds old is senior.
    Where seniors sent updates, the norm gate's median is theirs, with the younger established miners'
    weight capped (`young_median_share`): keys that earned standing lately, in any number, cannot move it."""
    young_median_share: float = Field(default=0.5, ge=0)
    """The younger established miners together weigh at most this many seniors in the norm gate's
    median (0.5: a third of the weight, so they move it at most to the seniors' quartile)."""
    round_payload_bytes: int | None = Field(default=None, ge=1)
    """Payload bytes the validator holds for one round, received and being received; None: 8 x the
    payload cap. Every admitted header reserves its announced size against it."""
    max_payload_bytes: int | None = Field(default=None, ge=1)
    """Largest payload accepted; None means the codec's own cap (dense FP32 size plus slack)."""
    behind_rounds: int = Field(default=8, ge=1, le=1024)
    """How many earlier state hashes are remembered, to tell 'behind by k rounds' from 'unknown base'."""
    seen_capacity: int = Field(default=100_000, ge=1)
    """Message ids remembered to reject replays (oldest evicted first)."""

    # -- integrity ---------------------------------------------------------------------------
    norm_cap_multiple: float = Field(default=10.0, gt=1)
    """An update with a norm above this multiple of the round's median norm is rejected outright."""
    free_rider_fraction: float = Field(default=0.1, ge=0, lt=1)
    """An update with a norm at or below this fraction of the median norm is a free rider."""
    sketch_stride: int = Field(default=16, ge=1)
    """Copy detection compares every stride-th coordinate (offset secret per round)."""
    copy_overlap: float = Field(default=0.6, gt=0, le=1)
    """Near copy: at least this fraction of the smaller update's sampled nonzero positions are shared..."""
    copy_cosine: float = Field(default=0.9, ge=-1, le=1)
    """...and the sampled values have at least this cosine similarity (dense updates overlap everywhere)."""
    public_copy_cosine: float = Field(default=0.8, gt=0, le=1)
    """An update whose values, on the positions it sends, have at least this cosine similarity with the
    public previous step W_{r-1} - W_r is a copy of that step (any slice, any scale). Honest updates
    measure 0.3-0.5 against it on the embedded GPT, slices of it 0.93-1.0. Very short rounds make
    consecutive honest steps nearly parallel: two inner steps of Adam on a 1-layer GPT with the dense
    codec measured 0.61-0.93, and half of those updates were refused as copies; such a run needs a
    higher value (the sparse codecs' slices stay at 0.93 or more)."""
    echo_cosine: float = Field(default=0.9, gt=0, le=1)
    """An update whose values, on the positions it sends, have at least this cosine similarity with the
    mean of the round's other updates (two or more) is built from them, not trained (ALIE: mean - z x
    std): a copy. On the embedded GPT honest updates measure 0.48-0.84 against it, ALIE 0.88-0.96."""
    copy_owner_lead: float = Field(default=0.15, ge=0)
    """A copy group's owner must lead every other member's indicator average (before the round) by this
    much; else every member is a copy. At decay 0.95 one round moves the gap between two records by at most
    0.1, so 0.15 takes two rounds in which the owner's indicator beat the other's: one lucky round cannot."""

    # -- scoring -----------------------------------------------------------------------------
    eval_step_fraction: float = Field(default=0.2, gt=0)
    """The evaluation step is W - (fraction x outer lr) x update, the update clipped to the median norm."""
    indicator_margin: float = Field(default=0.0, ge=0)
    """Indicator +1 needs the own-data advantage to exceed this fraction of the reference update's gain on R.
    0: any advantage. With a fresh batch every inner step the advantage of an honest update is small
    early in a run (1-4% of the reference's gain on R on the embedded GPT), so a margin of 5% kept every
    miner at -1 and the run at W_0."""
    useful_share: float = Field(default=0.25, ge=0)
    """Indicator +1 also needs the update's gain on R to reach this share of the reference update's gain
    on R: work, not a random direction whose margin came out positive by chance (scoring.py)."""
    indicator_decay: float = Field(default=0.95, ge=0, lt=1)
    """Moving average of the indicator: average = decay x average + (1 - decay) x indicator."""
    openskill_beta: float = Field(default=7.0, gt=0)
    """OpenSkill Plackett-Luce beta: the performance noise of one round."""
    openskill_tau: float = Field(default=0.1, ge=0)
    """OpenSkill tau: uncertainty added before every match, so ratings keep adapting."""
    missing_rounds: int = Field(default=3, ge=0)
    """A rated miner silent for up to this many rounds ranks last; after that it sits out (rating kept)."""

    # -- selection ---------------------------------------------------------------------------
    min_score: float = 0.0
    """Only updates whose relative gain on random data exceeds this are aggregated."""

    # -- persistence -------------------------------------------------------------------------
    keep_rounds: int = Field(default=2, ge=1)
    """Committed round folders kept on disk (the newest is the one a restart resumes from)."""
    fp32_checkpoint_every: int = Field(default=5, ge=1)
    """Every this many rounds the result names the FP32 state after its step as a blob, where an
    auditor can start (a run manifest sets it to its `checkpoint_every`)."""
    decode_ahead: int = Field(default=2, ge=0, le=16)
    """Payloads decoded ahead of the one being inspected, each on its own thread (decodeahead.py):
    a payload's streams decode serially, so this is what puts a round's other cores to work. Each
    waiting update holds its decoded size (2 GB at 0.5B) where the validator evaluates; 0 decodes
    one at a time."""
    decoded_spill_bytes: int = Field(default=32 * 2**30, ge=0)
    """Disk for a round's decoded updates (spill.py, deleted when the round ends), so each payload is
    decoded once, not once per step; updates beyond it are decoded again when needed. 0 = no spill."""

    @model_validator(mode="after")
    def _seats_fit(self) -> Self:
        if self.established_rounds > self.established_window:
            raise ValueError("established_rounds exceeds established_window")
        return self

    @classmethod
    def for_run(cls, update: UpdateRules, selection: SelectionRules, **own: Any) -> GauntletConfig:
        """The settings for a run that fixes `update` and `selection` (and any of the validator's
        own settings in `own`); the rest keep their defaults."""
        fixed = {name: getattr(update, name) for name in UpdateRules.model_fields}
        fixed |= {name: getattr(selection, name) for name in SelectionRules.model_fields}
        return cls(**fixed, **own)

    @property
    def eval_step(self) -> float:
        return self.eval_step_fraction * self.outer.lr
