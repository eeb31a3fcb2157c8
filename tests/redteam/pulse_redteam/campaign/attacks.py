"""The attacks of the campaign: what each one sends and what must stop it.

`detectable` means the submission can be told hostile from its own bytes (and the round's other
payloads, for copies): it must never be aggregated. The others (thief, ALIE, IPM) look like
plausible updates; the Gauntlet has to out-score them, and the campaign reports how often it did.
"""

from __future__ import annotations

from dataclasses import dataclass

FLOOD = 160
"""Fresh keys a flood pushes each round: more than the 128 seats of a round."""
NOISE_FLOOD = 64
"""Fresh keys a flood of valid noise pushes each round: twice the newcomers a round examines."""


@dataclass(frozen=True)
class Attack:
    does: str
    stopped_by: str
    detectable: bool = True
    expect: str = ""  # network attacks: the outcome each play must have (`NetAttack.outcome`)


ATTACKS: dict[str, Attack] = {
    "replay": Attack("resends a signed submission stored in an earlier round", "replay cache / round check"),
    "other-run": Attack("valid signature over a header for another run id", "signature preimage (run id)"),
    "other-round": Attack("valid signature over a header for the next round", "round is not open"),
    "forged-sig": Attack("honest header, one bit of the signature flipped", "signature check"),
    "size-lie": Attack("header names half the payload's size, whole payload sent", "size-capped read + SHA-256"),
    "truncated": Attack("sends half the announced body, then hangs up", "stream read of exactly size bytes"),
    "slow": Attack("trickles the body, 64 bytes every 0.5 s", "minimum body rate / round closed"),
    "oversize": Attack("a truthful header for junk 1 MB past the codec's cap", "size cap, checked on the header"),
    "zstd-bomb": Attack("codec header then a ~40 KB zstd frame of 1 GiB of zeros", "decoder (no decompression)"),
    "trailing": Attack("well-formed payload plus 16 trailing bytes", "decoder: trailing bytes"),
    "out-of-range": Attack("a position gap running past the tensor's end", "decoder: position checks"),
    "dup-positions": Attack("one flat position claimed by two chunks", "decoder: position checks"),
    "nan": Attack("well-formed payload with NaN values", "decoder: finite check"),
    "inf": Attack("well-formed payload with inf values", "decoder: finite check"),
    "copy": Attack("an honest miner's payload of this round, re-signed", "copy detection (same hash)"),
    "near-copy": Attack("an honest payload, values x(1 + 5% noise), re-encoded", "copy detection (sketches)"),
    "freerider": Attack("a zero update", "free-rider norm check"),
    "signflip": Attack("trains honestly, sends -1000 x its update", "norm cap (x median)"),
    "random-x1000": Attack("random direction at 1000 x an honest norm", "norm cap (x median)"),
    "alie": Attack("mean - 1.0 x std of the round's honest updates", "scoring (no gain)", detectable=False),
    "ipm": Attack("-0.1 x the mean of the round's honest updates", "free rider / scoring", detectable=False),
    "thief": Attack("trains honestly on another miner's assignment", "indicator (own data)", detectable=False),
    "stale": Attack("trains from the previous round's state and says so", "base state hash (behind)"),
    "sybil": Attack(f"{20} fresh keys each push random bytes in one round", "decoder; ranked last"),
    "flood": Attack(
        f"{FLOOD} fresh keys a round push random bytes, {3} streams at a time, before the honest miners",
        "admission (established first, newcomers drawn by secret ticket); decoder",
    ),
    "noise-flood": Attack(
        f"{NOISE_FLOOD} fresh keys a round push valid random updates at an honest norm (one key trains to know it)",
        "newcomers examined by ticket, at most `newcomer_evaluations` a round; references from established keys",
        detectable=False,
    ),
    "late-flood": Attack(
        f"{NOISE_FLOOD} fresh keys a round push valid random updates with the last byte changed: each decodes"
        " whole, then fails",
        "a payload that fails only after its body was read counts against `newcomer_evaluations`",
    ),
    "standby-flood": Attack(
        f"{FLOOD} fresh keys a round push random bytes to the standby validator, {3} streams at a time",
        "one intake on every validator (the same admission, header checks and byte budget); held, never scored",
    ),
    "tiny-dense": Attack(
        "a few hundred bytes declaring every weight sent (PULSELoCo: streams cut to a word)",
        "decoder: no read past a stream's end, symbols bounded by the stream",
    ),
    "rl-fabricated": Attack(
        "rollout batches of chosen completions (wrong sums) from a fresh key ground to sort first",
        "pool: sampled-from-W_r check; secret candidate order",
    ),
    "dht-flood": Attack(
        "64 fresh keys sign round results and checkpoints for this round and the next, and 64 heartbeats",
        "store-time writer check; per-key cap; validators read first",
        expect="refused",
    ),
    "dht-pin": Attack(
        "re-stores the validator's heartbeat to live 23 hours longer than signed",
        "the signed expiry is the record's expiration",
        expect="refused",
    ),
    "slot-silent": Attack(
        "opens 8 fetch and 8 submit streams to the validator and sends nothing",
        "request deadline; per-peer and per-phase budgets",
        expect="dropped",
    ),
    "slot-trickle": Attack(
        "opens 8 submit streams to the validator and trickles a request, a byte every 0.5 s",
        "request deadline",
        expect="dropped",
    ),
    "probe-flood": Attack(
        "download probes of 8 MiB from a fresh key each, 4 streams at once for 10 s",
        "signed probes; per-key rate; one byte budget for peers without standing",
        expect="limited",
    ),
    "range-flood": Attack(
        "16 streams ask the validator for the patch as a range and hold it unread",
        "ranges take send slots; a share kept for peers with standing",
        expect="limited",
    ),
    "dht-future": Attack(
        "64 fresh keys sign open records (heartbeat, rollouts, submission) for far rounds and 20-hour expiries",
        "store-time round window and open-kind TTL bound",
        expect="refused",
    ),
    "dht-evict": Attack(
        "320 fresh keys sign heartbeats of this round, more than a key keeps",
        "random displacement among signers without standing; per-kind quotas",
        expect="kept",
    ),
    "rl-unserved": Attack(
        "40 fresh keys announce rollout batches of this round that nobody serves",
        "pool: a failed fetch penalizes its key; budget per pass; the pool closes",
        expect="sent",
    ),
    "rl-push-flood": Attack(
        "40 fresh keys push rollout batches of noise to the validator each round",
        "rollout intake: seats by standing and ticket, bytes per round; pushed batches examined first",
        expect="sent",
    ),
    "push-miner": Attack(
        "pushes a submission to a miner and to a follower (free storage and hosting)",
        "only a validator takes pushes",
        expect="refused",
    ),
}

STANDING = ("public-slice", "median-whisper", "header-only")
"""Attacks on standing (`standing.py`): fresh keys trying to be established, or to hold a seat, without training."""
ATTACKS |= {
    "public-slice": Attack(
        "40 keys each send a disjoint slice of the public previous step at its norm", "public-step copy check"
    ),
    "median-whisper": Attack(
        "the same 40 keys send random updates at 1/100 of that norm", "free rider; the seniors' median"
    ),
    "header-only": Attack("a seated header whose body never comes (hangs up at once)", "stream; overdue seat freed"),
}

NEEDS_HONEST = ("copy", "near-copy", "alie", "ipm")
"""Attacks built from the honest payloads of the round (fetched from their miners)."""

TRAINED = {
    "signflip": "signflip",
    "random-x1000": "noise",
    "freerider": "freerider",
    "thief": "thief",
    "stale": "behind",
}
"""Attacks played by a `node.swarm.fakeminers` adversary (by its kind there)."""

TRANSPORT = ("replay", "other-run", "other-round", "forged-sig", "size-lie", "truncated", "slow")
"""Attacks the validator refuses on the stream, before the round sees them."""

SCENARIOS = {
    "flood": "lm",
    "noise-flood": "lm",
    "late-flood": "lm",
    "standby-flood": "lm",
    "tiny-dense": "rl",
    "rl-fabricated": "rl",
    "rl-unserved": "rl",
    "rl-push-flood": "rl",
    "dht-evict": "lm",
}
"""Attacks played in their own swarm (the run's task): against one of them alone the run's figures
(rounds completed, honest miners aggregated, validator memory and disk) say what it costs. A
tiny dense payload needs PULSELoCo, the RL preset's codec; fabricated rollouts need an RL run. An
eviction flood displaces the heartbeats of miners without standing, which other attacks of a shared
swarm find their victims by. A flood of the standby's intake needs a run with two validators."""

STANDBY = ("standby-flood",)
"""Attacks that need a run with a standby validator: played in their own swarm, never in the rotation."""

NETWORK = tuple(a for a, attack in ATTACKS.items() if attack.expect and a not in SCENARIOS)
"""Attacks on the DHT and the streams themselves (`netattacks.py`, `budgetattacks.py`): no
submission reaches a round."""

PAYLOAD = tuple(
    a for a in ATTACKS if a not in (*TRANSPORT, *NEEDS_HONEST, *TRAINED, *NETWORK, "sybil", *SCENARIOS, *STANDING)
)
"""Malformed payloads the decoder refuses."""
