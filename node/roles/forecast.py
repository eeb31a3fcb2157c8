"""`pulse doctor`'s forecast: from what `doctor.py` measured, will this machine keep up with the run?

    report = forecast(measured, setup.manifest)      # report.advice: what to change, if anything

The forecast: bytes per round each way; whether a whole payload arrives before the round's
target (and, if not, the share a miner sends: `uplink.py`); whether H steps fit in a round; the
time to join now (bytes still to fetch at the measured downlink, plus the checks and loading,
timed here by hashing, plus the patches to replay, each timed here on a patch like the run's).
`pulse bench links` compares these forecasts with what then happens on a shaped network.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from node.roles.doctor import Measured
from node.roles.machinefit import Machine, needs
from node.roles.uplink import MIN_FRACTION, SAFETY
from node.run.manifest import Manifest

# after the checkpoint's last piece (each checked as it came) a join fsyncs the file and reads it once
# into the live state (`roles/chainstate.py`): measured at about one hash pass's time (0.6-1.5x)
LOAD_PASSES = 1.0


@dataclass
class Forecast:
    bytes_up_per_round: float
    bytes_down_per_round: float
    train_seconds: float  # H inner steps
    upload_seconds: float | None  # a whole payload
    submit_seconds: float | None  # compress + upload
    target_seconds: float
    makes_target: bool | None
    fraction: float  # the share of a payload a miner here would send
    trains_in_a_round: bool | None
    join_seconds: float | None
    disk_needed: int
    memory_needed: int
    advice: list[str]
    measured: Measured

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def forecast(m: Measured, manifest: Manifest) -> Forecast:
    h = manifest.train.inner_steps
    train = m.step_seconds * h
    up_bytes = m.run_payload_bytes or float(m.own_payload_bytes)
    down_bytes = float(m.patch_bytes or 0)
    upload = up_bytes / m.up_bytes_per_second if m.up_bytes_per_second else None
    submit = m.compress_seconds + upload if upload is not None else None
    makes = submit <= m.target_seconds if submit is not None else None
    fraction = 1.0
    if upload is not None and not makes:
        fraction = max(MIN_FRACTION, min(1.0, (m.target_seconds - m.compress_seconds) * SAFETY / upload))
    fits = train <= m.round_seconds if m.round_seconds else None
    join = join_seconds(m, m.join_bytes, m.join_patches) if m.join_bytes is not None else None
    disk = 2 * m.state_bytes + (m.join_patches + 2) * int(down_bytes)
    memory = m.machine.host_peak_bytes  # measured: what the probe's steps and compression took here
    f = Forecast(
        bytes_up_per_round=up_bytes,
        bytes_down_per_round=down_bytes,
        train_seconds=train,
        upload_seconds=upload,
        submit_seconds=submit,
        target_seconds=m.target_seconds,
        makes_target=makes,
        fraction=fraction,
        trains_in_a_round=fits,
        join_seconds=join,
        disk_needed=disk,
        memory_needed=memory,
        advice=[],
        measured=m,
    )
    f.advice = advise(f, manifest)
    return f


def join_seconds(m: Measured, join_bytes: int, patches: int) -> float | None:
    """A join of `join_bytes` with `patches` after its checkpoint, at the rates measured here: the
    lookups, the bytes at the downlink, the checkpoint's load, and each patch read and applied in turn."""
    if not m.down_bytes_per_second:
        return None
    load = LOAD_PASSES * m.state_bytes / m.hash_bytes_per_second
    return (
        m.lookup_seconds
        + join_bytes / m.down_bytes_per_second
        + load
        + patches * (m.patch_apply_seconds + m.read_seconds)
    )


def fit_advice(machine: Machine, manifest: Manifest) -> list[str]:
    """What to change where the machine lacks GPU memory or host RAM for the run (`machinefit.needs`)."""
    out = []
    for need in needs(machine):
        if need.fits is not False or need.what == "disk":
            continue
        what = "the steps' peak" if need.what == "GPU memory" else "a miner's peak"
        out.append(
            f"{need.what}: {what} here was {need.needed / 2**30:.1f} GiB, {(need.available or 0) / 2**30:.1f} GiB "
            "are available: a smaller model or data.batch_size, "
            "train.memory options (`pulse bench memory`), or run a follower (`pulse follow`)"
        )
    if not machine.data_pinned:
        out.append(
            f'data.digest is not set: put digest = "{machine.data_digest}" in [data] so that every node '
            "checks it trains on these tokens"
        )
    return out


def advise(f: Forecast, manifest: Manifest) -> list[str]:
    m, out = f.measured, []
    if f.makes_target is False:
        out.append(
            f"a whole payload ({f.bytes_up_per_round / 1e6:.1f} MB) takes {f.upload_seconds:.1f}s to upload here, "
            f"the round expects it within {f.target_seconds:.1f}s: a miner here sends about {f.fraction:.0%} of it "
            "(fewer values per chunk, the rest kept for later rounds); a faster uplink sends it whole"
        )
    if f.trains_in_a_round is False:
        out.append(
            f"{manifest.train.inner_steps} inner steps take {f.train_seconds:.0f}s here, rounds last about "
            f"{m.round_seconds:.0f}s: this machine would fall behind every round (a faster device, or a run with "
            "fewer inner steps)"
        )
    if m.disk_free < f.disk_needed:
        out.append(f"free disk {m.disk_free / 1e9:.1f} GB is less than the {f.disk_needed / 1e9:.1f} GB a join needs")
    out += fit_advice(m.machine, manifest)
    if m.reachability.startswith("loopback"):
        out.append("no other machine can dial this node: listen on a reachable address (--host), or --client-mode")
    return out + [f"not measured: {p}" for p in m.problems]
