"""The run as the network layer sees it: a `RunRecords` made from the manifest."""

from __future__ import annotations

from node.net.peer import RunRecords
from node.run.manifest import Manifest


def run_records(manifest: Manifest) -> RunRecords:
    return RunRecords(
        run_id=manifest.run_id,
        validators=tuple(manifest.validators),
        record_ttl_seconds=manifest.round.record_ttl_seconds,
        checkpoint_every=manifest.round.checkpoint_every,
        payload_rounds=manifest.round.payload_rounds,
        keep_checkpoints=manifest.round.keep_checkpoints,
    )
