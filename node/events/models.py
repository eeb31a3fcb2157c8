"""One model per event kind a role reports: what `pulse demo`, the campaign ledger and tests read.

Every model names its kind in `event` (the JSON lines' discriminator). Rounds are the round the
event is about; hashes are 64-hex state hashes; byte counts are whole bytes.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from protocol.parsing import STRICT


class Event(BaseModel):
    """The base of every event: strict, closed, immutable."""

    model_config = STRICT


# -- every role ----------------------------------------------------------------------------------


class Started(Event):
    event: Literal["start"] = "start"
    sender: str | None = None
    """The role's public key (miners, followers, workers)."""
    round: int | None = None
    """The round a validator starts (or resumes) at."""
    peer_id: str | None = None
    """The role's libp2p peer id, where a reader needs it (hostile miners)."""
    senders: list[str] | None = None
    """Every key a process signs with (a hostile miner plays several)."""


class Exited(Event):
    event: Literal["exit"] = "exit"
    peak_rss_mb: float
    """Peak resident memory of the process (MiB)."""


# -- followers and miners: keeping the weights in step --------------------------------------------


class CheckpointLoaded(Event):
    event: Literal["checkpoint"] = "checkpoint"
    round: int
    state_hash: str
    bytes: int
    behind: int = 0
    """Round results published after this checkpoint when it loaded: the patch chain to apply."""
    seconds: float | None = None
    """Seconds from choosing the checkpoint to holding its weights (fetch, checks, load)."""
    holders: int | None = None
    """Most holders that sent pieces at once (piecewise fetches)."""
    resumed: int = 0
    """Bytes of the checkpoint already on disk from an interrupted attempt."""
    planned_bytes: int | None = None
    """Bytes the join plan had to fetch: the checkpoint not on disk, its piece index, the patches."""


class Joined(Event):
    """A join is done: this node holds the state that was current when it started to join."""

    event: Literal["joined"] = "joined"
    round: int
    seconds: float
    """From the start of the join (finding the checkpoint) to holding W_round."""
    bytes: int
    """What the join plan had to fetch: the checkpoint not on disk, its index, the patches."""
    patches: int


class PatchApplied(Event):
    event: Literal["patch"] = "patch"
    round: int
    """The patch took this node from W_round to W_{round+1}."""
    patch_bytes: int
    state_hash: str
    """The hash of W_{round+1}, as the validator announced it."""
    seconds: float | None = None
    """Seconds to decode and apply the patch (PULSESync)."""


class Final(Event):
    """A follower or miner stops, holding the state of `round`."""

    event: Literal["final"] = "final"
    round: int
    state_hash: str
    busy_fraction: float | None = None
    """Miners: seconds training and compressing / wall seconds since the first round trained."""


class Quiet(Event):
    """A node waited `seconds` without finding anything of its run (no head, no checkpoint)."""

    event: Literal["quiet"] = "quiet"
    seconds: float
    run_id: str
    hint: str
    """The likely reasons, as the log line gives them."""


# -- miners --------------------------------------------------------------------------------------


class Training(Event):
    event: Literal["train"] = "train"
    round: int
    ahead: bool
    """The steps were trained while the previous round was scored (`train.overlap`)."""


class Late(Event):
    event: Literal["late"] = "late"
    round: int


class Missed(Event):
    """Something a node sent for `round` was not taken (a submission, a rollout announcement)."""

    event: Literal["missed"] = "missed"
    round: int
    reason: str


class Submitted(Event):
    event: Literal["submitted"] = "submitted"
    round: int
    bytes: int
    loss: float
    """Mean training loss of the round's inner steps."""
    busy_fraction: float
    compress_seconds: float | None = None
    """Seconds to compress Delta plus the error feedback into the payload (the run's codec)."""
    step_seconds: float | None = None
    """Mean seconds of one of the round's inner steps."""
    upload_seconds: float | None = None
    """Seconds from the start of the push until the validator confirmed it stored the payload."""
    fraction: float = 1.0
    """Share of the codec's full payload sent: below 1 when the measured uplink could not carry
    the whole payload before the round's target (fewer values per chunk, `uplink.py`)."""


class Scored(Event):
    """How this miner's submission fared in `round`, from the signed round result."""

    event: Literal["scored"] = "scored"
    round: int
    of: int
    """Submissions with an outcome in the round."""
    place: int | None = None
    """1-based rank among the aggregated; None when not aggregated."""
    score: float | None = None
    reason: str | None = None
    """Why it was not aggregated (None: recorded as missing)."""


# -- the validator --------------------------------------------------------------------------------


class Baseline(Event):
    """The held-out measure of W_0, before round 0."""

    event: Literal["baseline"] = "baseline"
    loss: float | None = None
    reward: float | None = None


class CheckpointAnnounced(Event):
    event: Literal["checkpoint_announced"] = "checkpoint_announced"
    round: int
    bytes: int


class RoundOpened(Event):
    event: Literal["open"] = "open"
    round: int
    state_hash: str
    target_seconds: float | None = None
    """Seconds after the open by which submissions are expected (adaptive target, or the deadline)."""


class Received(Event):
    event: Literal["received"] = "received"
    round: int
    sender: str
    bytes: int


class RoundClosed(Event):
    event: Literal["round"] = "round"
    round: int
    submissions: int
    selected: int
    bytes: int
    """Payload bytes received this round."""
    dense_bytes: int
    """What as many dense FP32 pseudo-gradients would have been."""
    patch_bytes: int
    state_bytes: int
    """The BF16 weights: what a dense sync would ship."""
    loss: float | None = None
    """Held-out loss of W_{round+1} (language modelling)."""
    reward: float | None = None
    """Held-out reward of W_{round+1} (RL, every `reward_every` rounds)."""
    changed_fraction: float
    """Fraction of BF16 weights the round changed."""
    scores: dict[str, float]
    """Aggregated senders and their scores."""
    rejections: dict[str, str]
    """Senders not aggregated, with the reason."""
    state_hash: str
    seconds: float
    """Seconds the validator spent deciding and stepping."""
    ignored: list[str] = []
    """Reasons of the submissions ignored at intake (not provably their sender's: not in the signed result)."""
    decide_seconds: float | None = None
    """Of `seconds`: intake, decoding, scoring and selecting the submissions."""
    encode_seconds: float | None = None
    """Of `seconds`: encoding the PULSESync patch."""
    held_out_seconds: float | None = None
    """Seconds measuring the held-out loss or reward of W_{round+1}, after `seconds`."""
    open_seconds: float | None = None
    """Seconds the round was open for submissions (from its open to its close)."""
    arrivals: dict[str, float] = {}
    """Seconds after the open at which each sender's submission was stored."""
    offered: int = 0
    """Signed headers offered this round (admission, before any body)."""
    refused: int = 0
    """Headers refused a seat (each answered with its reason on the stream)."""
    unseated: int = 0
    """Seated newcomers that later lost their seat to a lower ticket or an established miner."""
    established: int = 0
    """Miners established when the round opened (seated first; the norm gate's reference)."""


class Dropped(Event):
    """A received submission left the round before it closed (its seat went to someone else)."""

    event: Literal["dropped"] = "dropped"
    round: int
    sender: str
    reason: str


class Done(Event):
    """The validator completed its rounds; it keeps serving blobs."""

    event: Literal["done"] = "done"
    round: int
    state_hash: str


# -- RL: the validator's pool and the inference workers ---------------------------------------------


class PoolWaiting(Event):
    event: Literal["waiting"] = "waiting"
    round: int


class RolloutsRefused(Event):
    event: Literal["rollouts_refused"] = "rollouts_refused"
    round: int
    worker: str
    reason: str


class PoolPublished(Event):
    event: Literal["pool"] = "pool"
    round: int
    batches: int
    workers: list[str]
    """The worker of each pool batch, in pool order."""
    refused: dict[str, str]
    staleness: list[int]
    """Rounds between each batch's state and this round."""


class RolloutsPublished(Event):
    event: Literal["rollouts"] = "rollouts"
    round: int
    completions: int
    bytes: int
    mean_reward: float
    pushed: bool = False  # a validator took it over a stream (else it is only announced in the DHT)


ROLE_EVENTS = (
    Started,
    Exited,
    CheckpointLoaded,
    Joined,
    PatchApplied,
    Quiet,
    Final,
    Training,
    Late,
    Missed,
    Submitted,
    Scored,
    Baseline,
    CheckpointAnnounced,
    RoundOpened,
    Received,
    Dropped,
    RoundClosed,
    Done,
    PoolWaiting,
    RolloutsRefused,
    PoolPublished,
    RolloutsPublished,
)
