"""How each role reports: log lines a user understands, and the same events as JSON lines.

    events = Events("miner", path)                      # path: None for log lines only
    events.add_sink(metrics.record)                     # also hand every event to a sink (metrics.py)
    events.emit(Submitted(round=3, ...), "round 3: submitted 9.1 kB ...")
    log = read_events(folder)                           # every *.jsonl file, by time
    log.of(RoundClosed, name="validator")               # [Logged[RoundClosed]], in order

A JSON line is flat and readable: {"t": ..., "role": ..., "event": "round", "round": 3, ...}. The
reader parses each back into its model (`models.py`); a last line still being written (no newline
yet) is skipped, any other line that is not an event is an `EventLogError`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import resource
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Generic, TypeVar, Union

from pydantic import Field, TypeAdapter, ValidationError

from node.events.audit import AUDIT_EVENTS
from node.events.campaign import CAMPAIGN_EVENTS
from node.events.models import ROLE_EVENTS, Done, Event, Exited, Final, Started
from protocol.errors import PulseError

E = TypeVar("E", bound=Event)
ENVELOPE = ("t", "role")  # what the writer adds to every line around the event's own fields
_ANY: TypeAdapter[Event] = TypeAdapter(
    Annotated[Union[(*ROLE_EVENTS, *CAMPAIGN_EVENTS, *AUDIT_EVENTS)], Field(discriminator="event")]  # type: ignore[arg-type]
)


class EventLogError(PulseError, ValueError):
    """A line of an event file is not an event this version writes."""


Sink = Callable[[Event], None]
"""Something every emitted event is handed to, in the emitting thread (e.g. `EventMetrics.record`)."""


class Events:
    """Human log lines plus, optionally, machine-readable JSON lines (`pulse demo`, the ledger) and sinks."""

    def __init__(
        self,
        role: str,
        path: Path | None = None,
        logger: logging.Logger | None = None,
        sinks: Sequence[Sink] = (),
    ) -> None:
        self.role = role
        self.path = path
        self.log = logger or logging.getLogger(f"pulse.{role}")
        self.sinks = list(sinks)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)

    def add_sink(self, sink: Sink) -> None:
        self.sinks.append(sink)

    def emit(self, event: Event, text: str) -> None:
        self.log.info(text)
        self._record(event)

    def warn(self, event: Event, text: str) -> None:
        """`emit`, logged as a warning: something the user should act on."""
        self.log.warning(text)
        self._record(event)

    def _record(self, event: Event) -> None:
        for sink in self.sinks:
            sink(event)
        if self.path is None:
            return
        record = {"t": time.time(), "role": self.role, **event.model_dump(mode="json")}
        with self.path.open("a") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")

    def finish(self) -> None:
        """The last record: peak RSS of this process."""
        rss_mb = peak_rss_mb()
        self.emit(Exited(peak_rss_mb=rss_mb), f"{self.role} exiting (peak RSS {rss_mb:.0f} MB)")


@dataclass(frozen=True)
class Logged(Generic[E]):
    """One event as read back: when, which role and process (`name`, the file's stem) said it."""

    t: float
    role: str
    name: str
    event: E


def parse_line(line: str, name: str) -> Logged[Event]:
    """One JSON line -> its event; `EventLogError` if it is not one."""
    try:
        record: dict[str, Any] = json.loads(line)
        t, role = record.pop("t"), record.pop("role")
        event = _ANY.validate_python(record)
    except (json.JSONDecodeError, KeyError, AttributeError, ValidationError) as exc:
        raise EventLogError(f"{name}: not an event line: {line[:120]!r} ({exc})") from exc
    if not isinstance(t, int | float) or not isinstance(role, str):
        raise EventLogError(f"{name}: bad time or role in {line[:120]!r}")
    return Logged(float(t), role, name, event)


def read_file(path: Path) -> list[Logged[Event]]:
    """The events of one file; a last line without its newline (being written) is left out."""
    text = path.read_text(errors="replace")
    lines = text.split("\n")
    partial = lines.pop()  # "" when the file ends with a newline
    records = [parse_line(line, path.stem) for line in lines if line]
    if partial:
        with contextlib.suppress(EventLogError):  # the writer has not finished this line yet
            records.append(parse_line(partial, path.stem))
    return records


class EventLog:
    """Every event of a swarm, by time, with typed queries."""

    def __init__(self, records: Iterable[Logged[Event]]) -> None:
        self.records = sorted(records, key=lambda r: r.t)

    def __iter__(self) -> Iterator[Logged[Event]]:
        return iter(self.records)

    def __len__(self) -> int:
        return len(self.records)

    def of(self, kind: type[E], name: str | None = None) -> list[Logged[E]]:
        """Every `kind` event (of process `name`, if given), in time order."""
        return [r for r in self.records if isinstance(r.event, kind) and (name is None or r.name == name)]  # type: ignore[misc]

    def events(self, kind: type[E], name: str | None = None) -> list[E]:
        return [r.event for r in self.of(kind, name)]

    def has(self, kind: type[E], name: str | None = None, round_: int | None = None) -> bool:
        return any(round_ is None or getattr(e, "round", None) == round_ for e in self.events(kind, name))

    def final_hashes(self) -> dict[str, str]:
        """Process name -> the state hash it ended on (a follower's or miner's `final`, the validator's `done`)."""
        return {r.name: r.event.state_hash for r in self.records if isinstance(r.event, Final | Done)}

    def keys(self) -> dict[str, str]:
        """Process name -> the public key it announced in its start event."""
        return {r.name: r.event.sender for r in self.of(Started) if r.event.sender is not None}


def read_events(folder: Path) -> EventLog:
    """Every `*.jsonl` file in `folder`, each record named by its file's stem."""
    return EventLog(r for path in sorted(folder.glob("*.jsonl")) for r in read_file(path))


def mb(n: int) -> str:
    return f"{n / 1e6:.2f} MB" if n >= 10_000 else f"{n} bytes"


def peak_rss_mb() -> float:
    """Peak resident memory of this process in MiB: VmHWM (Linux keeps `ru_maxrss` across fork+exec,
    so a child of a big parent would report the parent's size), else `ru_maxrss`."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
