"""How each role reports: log lines, and the same events as typed JSON lines that others read back.

Files (in import order):

- `models.py`    one pydantic model per event kind of the roles (start, patch, submitted, round, pool, ...)
- `campaign.py`  the events of the attack campaign's hostile miners (attack, uploading, skipped, ...)
- `log.py`       `Events` (writes log lines and JSON lines), `read_events` / `EventLog` (reads them back)

`events` is the lowest floor of `node`: it imports only `protocol.errors`.
"""

from node.events.log import EventLog, Events, Logged, mb, peak_rss_mb, read_events

__all__ = ["EventLog", "Events", "Logged", "mb", "peak_rss_mb", "read_events"]
