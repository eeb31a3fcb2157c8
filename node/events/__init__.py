"""How each role reports: log lines, and the same events as typed JSON lines that others read back.

Files (in import order):

- `models.py`    one pydantic model per event kind of the roles (start, patch, submitted, round, pool, ...)
- `campaign.py`  the events of the attack campaign's hostile miners (attack, uploading, skipped, ...)
- `audit.py`     the events of auditors and standby validators (audited, mismatch, took over, stood down)
- `log.py`       `Events` (writes log lines and JSON lines, hands events to sinks), `read_events` / `EventLog`
- `metrics.py`   `EventMetrics`: a sink that turns events into Prometheus metrics (bounded label sets)
- `progress.py`  progress bars for long work, drawn on a terminal only

`events` is the lowest floor of `node`: it imports only `protocol.errors` (and rich for progress,
prometheus_client for metrics).
"""

from node.events.log import EventLog, Events, Logged, mb, peak_rss_mb, read_events
from node.events.progress import progress, steps

__all__ = ["EventLog", "Events", "Logged", "mb", "peak_rss_mb", "progress", "read_events", "steps"]
