"""`--metrics-port` on live roles: a bootstrap, a validator, a miner and a follower of a real swarm
with a hostile miner, each scraped over HTTP on loopback while it runs.

What the metrics say is checked against what the roles' typed events say (every submission
received has one outcome; the follower's patches and bytes; the miner's scored rounds), the
hostile NaN payloads show up as rejections of class `undecodable`, and every `reason` label is one
of the fixed classes.
"""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from node.events.metrics import REASON_CLASSES
from node.events.models import Done, PatchApplied, Scored
from node.run.manifest import parse_manifest
from node.swarm.demo import Proc
from pulse_redteam.campaign.swarms import CampaignSwarm, Keys, Team, campaign_manifest, has, write_manifest
from tests.helpers import events, poll, wait_for

pytestmark = pytest.mark.swarm
ROUNDS = 2
METRICS = ["--metrics-port", "0"]
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def metrics_url(log: Path) -> str:
    found = poll(lambda: re.search(r"metrics at (http://\S+)", log.read_text(errors="replace")), timeout=60)
    assert found, f"no metrics address in {log}"
    return found.group(1)


def scrape(url: str) -> Samples:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def total(samples: Samples, name: str) -> float:
    """The sum over every label set of `name`."""
    return sum(v for (n, _), v in samples.items() if n == name)


def test_live_roles_serve_their_metrics(tmp_path: Path) -> None:
    keys = Keys.make(tmp_path / "keys", honest=1, hostile=1)
    data = campaign_manifest(deadline=20.0, validator=keys.validator_hex()).model_dump(mode="json")
    data["round"]["min_seconds"] = 8.0  # each round waits for both miners
    manifest = parse_manifest(data)
    out = tmp_path / "run"
    write_manifest(out, manifest)
    swarm = CampaignSwarm(out, manifest, ROUNDS)
    try:
        swarm.start_bootstrap(extra=METRICS)
        swarm.start_role("validator", "validator", keys.validator, extra=METRICS)
        # the miner and the follower go on past ROUNDS, so they are still running when scraped
        keep_going = ["--rounds", str(ROUNDS + 50), *METRICS]
        miner = swarm.start_role("miner0", "miner", keys.honest[0], extra=keep_going)
        follower = swarm.start_role("follower", "follow", None, extra=keep_going)
        swarm.start_team(Team("hostile", ("nan",), 1), keys.hostile)
        urls = {p.name: metrics_url(p.log) for p in swarm.procs if p.name != "hostile"}
        assert all(url.startswith("http://127.0.0.1:") for url in urls.values()), urls  # loopback by default
        swarm.wait("the validator's last round", has("validator", Done), timeout=240.0)
        last = [has("miner0", Scored, ROUNDS - 1), has("follower", PatchApplied, ROUNDS - 1)]
        wait_for(
            lambda: all(found(events(out)) for found in last), 60, "the miner's and follower's last round", out / "logs"
        )
        log = events(out)
        validator, miner_samples, follower_samples = (scrape(urls[n]) for n in ("validator", "miner0", "follower"))
        bootstrap = poll(lambda: _with_peers(scrape(urls["bootstrap"])), timeout=30)
        check_running([miner, follower])
    finally:
        swarm.stop_all()
    assert not swarm.unclean, swarm.unclean  # the metrics server does not keep a role from stopping

    # the validator: one outcome per submission received, the hostile NaN payloads as "undecodable"
    assert validator[("pulse_node_info", _info("validator", manifest.run_id, keys.validator_hex()))] == 1
    assert validator[("pulse_round", ())] == ROUNDS
    received = validator[("pulse_submissions_received_total", ())]
    rejected = total(validator, "pulse_submissions_rejected_total")
    assert received >= 2 and validator[("pulse_submissions_selected_total", ())] + rejected == received
    assert validator[("pulse_submissions_rejected_total", (("reason", "undecodable"),))] >= 1
    assert {dict(labels)["reason"] for n, labels in validator if n == "pulse_submissions_rejected_total"} <= set(
        REASON_CLASSES
    )
    assert validator[("pulse_codec_seconds_count", (("op", "patch_encode"),))] == ROUNDS
    assert validator[("pulse_evaluation_seconds_count", (("what", "submissions"),))] == ROUNDS
    assert validator[("pulse_patch_bytes_count", ())] == ROUNDS and validator[("pulse_held_out_loss", ())] > 0
    assert validator[("pulse_served_bytes_total", ())] > 0  # checkpoints and patches fetched from it
    assert validator[("pulse_peers", ())] >= 1 and validator[("process_resident_memory_bytes", ())] > 0
    assert 0 <= validator[("pulse_state_age_seconds", ())] < 300

    # the miner: its submissions, their scores, its training and compression time
    scored = log.events(Scored, "miner0")
    assert total(miner_samples, "pulse_miner_outcomes_total") == len(scored)
    assert miner_samples[("pulse_miner_last_scored_round", ())] == scored[-1].round
    assert miner_samples[("pulse_miner_last_place", ())] == (scored[-1].place or 0)
    assert miner_samples[("pulse_submissions_sent_total", ())] >= 1
    assert miner_samples[("pulse_sent_bytes_total", (("kind", "submission"),))] > 0
    assert miner_samples[("pulse_inner_step_seconds_count", ())] >= 1
    assert miner_samples[("pulse_codec_seconds_count", (("op", "compress"),))] >= 1
    assert miner_samples[("pulse_received_bytes_total", (("kind", "checkpoint"),))] > 0

    # the follower: every patch it applied, with its bytes, and nothing left to catch up
    patches = log.events(PatchApplied, "follower")
    assert follower_samples[("pulse_round", ())] == patches[-1].round + 1 == ROUNDS
    assert follower_samples[("pulse_patches_applied_total", ())] == len(patches)
    assert follower_samples[("pulse_received_bytes_total", (("kind", "patch"),))] == sum(p.patch_bytes for p in patches)
    assert follower_samples[("pulse_catchup_patches_remaining", ())] == 0

    # the bootstrap: the peers in its routing table, and no event metrics (it emits no events)
    assert bootstrap, "the bootstrap's pulse_peers stayed below 1"
    assert ("pulse_round", ()) not in bootstrap and bootstrap[("process_resident_memory_bytes", ())] > 0


def _info(role: str, run_id: str, key: str) -> tuple[tuple[str, str], ...]:
    return (("key", key), ("role", role), ("run_id", run_id))


def _with_peers(samples: Samples) -> Samples | None:
    return samples if samples.get(("pulse_peers", ()), 0) >= 1 else None


def check_running(procs: list[Proc]) -> None:
    assert all(p.popen.poll() is None for p in procs), [p.name for p in procs if p.popen.poll() is not None]
