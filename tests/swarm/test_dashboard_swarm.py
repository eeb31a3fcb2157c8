"""`pulse dashboard` in a real headless browser, on a real swarm with a hostile miner.

A validator, two honest miners, a follower and a hostile miner sending NaN payloads run 3 rounds;
`pulse dashboard` watches them through the DHT. Chromium (the system's, driven by Playwright)
must show the swarm's open round, a held-out loss plot with one point per finished round, and
the hostile submission's rejection with its reason. Skips, saying why, where no browser exists
(`make test` installs Debian's `chromium` where it runs as root with apt).
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from node.events.models import RoundClosed
from node.run.manifest import parse_manifest
from pulse_redteam.campaign.swarms import CampaignSwarm, Keys, Team, campaign_manifest, has, write_manifest

pytestmark = pytest.mark.swarm
ROUNDS = 3
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium() -> str:
    """The system's Chromium, or skip with the reason."""
    found = os.environ.get("PULSE_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        pytest.skip("no Chromium on this machine (make test installs Debian's `chromium` when run as root with apt)")
    return found


def test_dashboard_shows_round_loss_and_a_rejected_hostile_submission(tmp_path: Path) -> None:
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e .[test])")
    browser_path = chromium()
    keys = Keys.make(tmp_path / "keys", honest=2, hostile=1)
    # every round stays open 8 s, so that each miner is heard from before the first submission closes it
    data = campaign_manifest(deadline=20.0, validator=keys.validator_hex()).model_dump(mode="json")
    data["round"]["min_seconds"] = 8.0
    manifest = parse_manifest(data)
    out = tmp_path / "run"
    write_manifest(out, manifest)
    swarm = CampaignSwarm(out, manifest, ROUNDS)
    try:
        swarm.start_bootstrap()
        _, url = swarm.start_dashboard()
        swarm.start_role("validator", "validator", keys.validator)
        swarm.start_role("miner0", "miner", keys.honest[0])
        swarm.start_role("miner1", "miner", keys.honest[1])
        swarm.start_role("follower", "follow", None)
        swarm.start_team(Team("hostile", ("nan",), 1), keys.hostile)
        swarm.wait(f"round {ROUNDS - 1} closing", has("validator", RoundClosed, ROUNDS - 1), timeout=240.0)
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
                assert "not aggregated: undecodable: NonFiniteValues" in rejected, rejected
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
    finally:
        swarm.stop_all()
    assert not swarm.unclean, swarm.unclean  # the dashboard, like every role, stops cleanly on Ctrl+C


def keys_hex(path: Path) -> str:
    from node.net.keyfile import load_key_file

    return load_key_file(path).public_hex
