"""One real swarm watched two ways: `--metrics-port` on live roles, and `pulse dashboard` in a real
headless browser.

A bootstrap, a validator, two honest miners, a follower and a hostile miner sending payloads that
repeat a position (they read whole and fail once decoded) run 3 rounds, every role but the second
miner and the hostile one serving metrics, and `pulse dashboard` watching them through the DHT.
The swarm is started once for both tests (a swarm each cost CI a minute).

- metrics: each role scraped over HTTP on loopback while it runs; what they say is checked against
  the roles' typed events (every submission received has one outcome; the follower's patches and
  bytes; the miner's scored rounds); the hostile payloads show up as rejections of class
  `undecodable`, and every `reason` label is one of the fixed classes.
- dashboard: Chromium (the system's, driven by Playwright) must show the swarm's open round, a
  held-out loss plot with one point per finished round, and the hostile submission's rejection with
  its reason. Skips, saying why, where no browser exists (`make test` installs Debian's `chromium`
  where it runs as root with apt).

Every role, the metrics servers and the dashboard among them, must stop cleanly on Ctrl+C.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from node.events import EventLog
from node.events.metrics import REASON_CLASSES
from node.events.models import Done, PatchApplied, Scored
from node.run.manifest import Manifest, parse_manifest
from node.swarm.demo import Proc
from pulse_redteam.campaign.swarms import CampaignSwarm, Keys, Team, campaign_manifest, has, write_manifest
from tests.helpers import Samples, events, poll, scrape, wait_for

pytestmark = pytest.mark.swarm
ROUNDS = 3
METRICS = ["--metrics-port", "0"]
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@dataclass
class Watched:
    """The swarm after its last round: what each role's metrics said then, and the dashboard's URL."""

    out: Path
    manifest: Manifest
    keys: Keys
    log: EventLog
    scraped: dict[str, Samples]  # the bootstrap's is empty if its routing table never held a peer
    dashboard: str


@pytest.fixture(scope="module")
def watched(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Watched]:
    root = tmp_path_factory.mktemp("watched")
    keys = Keys.make(root / "keys", honest=2, hostile=1)
    # every round stays open 8 s, so that each miner is heard from before the first submission closes it
    data = campaign_manifest(deadline=20.0, validator=keys.validator_hex()).model_dump(mode="json")
    data["round"]["min_seconds"] = 8.0
    manifest = parse_manifest(data)
    out = root / "run"
    write_manifest(out, manifest)
    swarm = CampaignSwarm(out, manifest, ROUNDS)
    try:
        swarm.start_bootstrap(extra=METRICS)
        _, url = swarm.start_dashboard()
        swarm.start_role("validator", "validator", keys.validator, extra=METRICS)
        # the first miner and the follower go on past ROUNDS, so they are still running when scraped
        keep_going = ["--rounds", str(ROUNDS + 50), *METRICS]
        miner = swarm.start_role("miner0", "miner", keys.honest[0], extra=keep_going)
        swarm.start_role("miner1", "miner", keys.honest[1])
        follower = swarm.start_role("follower", "follow", None, extra=keep_going)
        swarm.start_team(Team("hostile", ("dup-positions",), 1), keys.hostile)
        served = ("bootstrap", "validator", "miner0", "follower")
        urls = {p.name: metrics_url(p.log) for p in swarm.procs if p.name in served}
        assert all(url.startswith("http://127.0.0.1:") for url in urls.values()), urls  # loopback by default
        swarm.wait("the validator's last round", has("validator", Done), timeout=240.0)
        last = [has("miner0", Scored, ROUNDS - 1), has("follower", PatchApplied, ROUNDS - 1)]
        wait_for(
            lambda: all(found(events(out)) for found in last), 60, "the miner's and follower's last round", out / "logs"
        )
        log = events(out)
        scraped = {n: scrape(urls[n]) for n in ("validator", "miner0", "follower")}
        bootstrap: Samples | None = poll(lambda: _with_peers(scrape(urls["bootstrap"])), timeout=30)
        scraped["bootstrap"] = bootstrap or {}
        check_running([miner, follower])
        yield Watched(out, manifest, keys, log, scraped, url)
    finally:
        swarm.stop_all()
    assert not swarm.unclean, swarm.unclean  # metrics servers and the dashboard keep no role from stopping


def metrics_url(log: Path) -> str:
    found = poll(lambda: re.search(r"metrics at (http://\S+)", log.read_text(errors="replace")), timeout=60)
    assert found, f"no metrics address in {log}"
    return found.group(1)


def total(samples: Samples, name: str) -> float:
    """The sum over every label set of `name`."""
    return sum(v for (n, _), v in samples.items() if n == name)


def test_live_roles_serve_their_metrics(watched: Watched) -> None:
    manifest, keys, log = watched.manifest, watched.keys, watched.log
    validator, miner_samples, follower_samples = (watched.scraped[n] for n in ("validator", "miner0", "follower"))
    bootstrap = watched.scraped["bootstrap"]

    # the validator: one outcome per submission received, the hostile payloads as "undecodable"
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


def test_dashboard_shows_round_loss_and_a_rejected_hostile_submission(watched: Watched) -> None:
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e .[test])")
    browser_path = chromium()
    keys, out, url = watched.keys, watched.out, watched.dashboard
    hostile = keys_hex(keys.hostile[0])
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=browser_path, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 1600})
            page.goto(url + f"?miner={hostile}")
            # the page refreshes itself: wait until the watcher has read the last round and its metrics
            page.wait_for_function(
                f"document.querySelectorAll('#loss-plot circle.point').length == {ROUNDS}", timeout=60_000
            )
            assert page.locator("#current-round").inner_text() == str(ROUNDS)
            assert page.locator("#completed").inner_text() == str(ROUNDS)
            points = page.locator("#loss-plot circle.point")
            assert [points.nth(i).get_attribute("data-round") for i in range(ROUNDS)] == ["0", "1", "2"]
            rejected = page.locator("#submissions tr", has_text=hostile[:16]).first.inner_text()
            assert "not aggregated: undecodable: InvalidPositions" in rejected, rejected
            honest = [keys_hex(k)[:16] for k in keys.honest]
            board = page.locator("#leaderboard").inner_text()
            assert all(k in board for k in honest), board
            # an honest miner was aggregated in some round (the last round's own-data indicator can
            # leave both out: with two honest miners it is a coin toss at this size)
            rows = [line for line in board.splitlines() if any(k in line for k in honest)]
            assert any(re.search(rf"\b[1-{ROUNDS}] of {ROUNDS}$", row) for row in rows), board
            history = page.locator("#miner-history").inner_text()
            assert history.count("not aggregated: undecodable") >= 1 and " aggregated," not in history, history
            assert "linked" in page.locator("#chain-head").inner_text()
            page.screenshot(path=str(out / "dashboard.png"), full_page=True)
        finally:
            browser.close()


def chromium() -> str:
    """The system's Chromium, or skip with the reason."""
    found = os.environ.get("PULSE_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        pytest.skip("no Chromium on this machine (make test installs Debian's `chromium` when run as root with apt)")
    return found


def keys_hex(path: Path) -> str:
    from node.net.keyfile import load_key_file

    return load_key_file(path).public_hex


def _info(role: str, run_id: str, key: str) -> tuple[tuple[str, str], ...]:
    return (("key", key), ("role", role), ("run_id", run_id))


def _with_peers(samples: Samples) -> Samples | None:
    return samples if samples.get(("pulse_peers", ()), 0) >= 1 else None


def check_running(procs: list[Proc]) -> None:
    assert all(p.popen.poll() is None for p in procs), [p.name for p in procs if p.popen.poll() is not None]
