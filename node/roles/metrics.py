"""A role's Prometheus endpoint (`--metrics-port`): the event metrics, plus what only the network and
the process can tell.

    metrics = NodeMetrics.serve(port, "127.0.0.1", role="miner", run_id=run_id, key=key)  # 0: any free port
    events.add_sink(metrics.events.record)     # node/events/metrics.py: what the typed events say
    metrics.watch(peer)                        # bytes served to others, pushes refused, peers known
    print(metrics.url)                         # http://127.0.0.1:PORT/metrics
    metrics.close()

Beside the event metrics it exposes `pulse_node_info` (role, run, key), `pulse_served_bytes_total`
and `pulse_submissions_refused_total{status}` (read from the peer's transfer service at scrape time),
`pulse_peers` (the DHT routing table, sampled in a thread so a scrape never waits on the network),
`pulse_peak_resident_memory_bytes` and the standard `process_*` metrics (memory, CPU, open files).
The bootstrap (`pulse dht`) emits no events: it serves the last four kinds only.
The server binds to loopback unless told otherwise: the figures say who this node is and how it
fares, which is for its operator's monitoring, not for the whole network.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Gauge, Info, ProcessCollector, start_http_server
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from node.events import peak_rss_mb
from node.events.metrics import EventMetrics
from node.net.peer import Peer
from node.net.transfer import REFUSAL_STATUSES, TransferCounts
from protocol.errors import NetworkError

log = logging.getLogger(__name__)
PEERS_SECONDS = 10.0  # how often the DHT routing table is counted


class _NetworkCollector(Collector):
    """Counts kept by the peer's transfer service, read at scrape time (plain integers, no I/O)."""

    def __init__(self, counts: Callable[[], TransferCounts | None]) -> None:
        self.counts = counts

    def collect(self) -> Iterator[Metric]:
        counts = self.counts()
        if counts is None:
            return
        yield CounterMetricFamily(
            "pulse_served_bytes",
            "Blob bytes this node streamed to peers that fetched them (patches, checkpoints, payloads, rollouts).",
            value=counts.served_bytes,
        )
        refused = CounterMetricFamily(
            "pulse_submissions_refused",
            "Pushed submissions refused at the stream, before any round saw them, by reply status.",
            labels=["status"],
        )
        for status in REFUSAL_STATUSES:
            refused.add_metric([status], counts.refused.get(status, 0))
        yield refused


class NodeMetrics:
    def __init__(self, registry: CollectorRegistry, role: str, run_id: str, key: str) -> None:
        self.registry = registry
        # the bootstrap emits no events: it gets the network and process metrics only
        self.events = EventMetrics(registry) if role != "bootstrap" else None
        Info("pulse_node", "Who this node is.", registry=registry).info({"role": role, "run_id": run_id, "key": key})
        ProcessCollector(registry=registry)
        peak = Gauge("pulse_peak_resident_memory_bytes", "Peak resident memory of this process.", registry=registry)
        peak.set_function(lambda: peak_rss_mb() * 2**20)
        self.peers = Gauge("pulse_peers", "Peers in this node's DHT routing table (sampled).", registry=registry)
        self.url = ""
        self._server: WSGIServer | None = None
        self._stop = threading.Event()

    @classmethod
    def serve(cls, port: int, bind: str, *, role: str, run_id: str, key: str) -> NodeMetrics:
        """Start serving `/metrics` on `bind`:`port` (0: a free port); `OSError` if it is taken."""
        metrics = cls(CollectorRegistry(), role, run_id, key)
        server, _ = start_http_server(port, addr=bind, registry=metrics.registry)
        metrics._server = server
        host, bound = server.server_address[:2]
        metrics.url = f"http://{_url_host(str(host))}:{bound}/metrics"
        return metrics

    def watch(self, peer: Peer) -> None:
        """Also expose what `peer` counts and how many peers it knows."""
        self.registry.register(_NetworkCollector(peer.transfer_counts))
        self.watch_peers(peer.known_peers)

    def watch_peers(self, known: Callable[[], int | None]) -> None:
        """Sample `known()` (it may block on the DHT) every `PEERS_SECONDS` in a thread of its own."""

        def sample() -> None:
            while not self._stop.is_set():
                try:
                    count = known()
                except NetworkError as exc:  # the DHT is busy or going away: keep the last figure
                    log.debug("peer count not read: %s", exc)
                else:
                    if count is not None:
                        self.peers.set(count)
                self._stop.wait(PEERS_SECONDS)

        threading.Thread(target=sample, name="pulse-metrics-peers", daemon=True).start()

    def close(self) -> None:
        self._stop.set()
        server = self._server
        if server is not None:
            server.shutdown()
            server.server_close()
            self._server = None


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
