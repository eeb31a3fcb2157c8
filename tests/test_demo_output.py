"""A new demo run starts from an output folder without the last run's artefacts, of either task."""

from __future__ import annotations

from pathlib import Path

from node.swarm.demo import fresh_output


def test_an_rl_demo_does_not_sit_beside_the_lm_runs_plot_and_model(tmp_path: Path) -> None:
    out = tmp_path / "pulse-demo"
    (out / "model").mkdir(parents=True)
    (out / "model" / "model.safetensors").write_bytes(b"an LM export")
    (out / "logs").mkdir()
    (out / "logs" / "miner3.log").write_text("a miner the next run does not have")
    for name in ("loss.png", "bytes.png", "summary.json"):
        (out / name).write_bytes(b"the LM run's")
    (out / "notes.txt").write_text("the user's own")
    fresh_output(out)
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
