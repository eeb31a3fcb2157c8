"""The network: hivemind's DHT and libp2p streams, blobs on disk, key files.

Files (in import order):

- `keyfile.py`    identity key files on disk: atomic, mode 0600, never overwritten, checked on load
- `netconfig.py`  network start-up options (initial peers, listen/announce addrs, relays, identity)
- `dht.py`        signed records on hivemind's DHT and the record validator every peer runs
- `blobstore.py`  content-addressed blobs on disk (SHA-256 names, verified atomic writes)
- `streams.py`    blob stream framing, limits and byte pumps (bounded reads, hashing off the loop)
- `transfer.py`   `rpc_fetch`/`rpc_submit` handlers and `call_fetch`/`call_submit` clients (the
                  conversations run on any stream: libp2p or in memory)
- `peer.py`       what roles need of the network: `RunView` (read the run's records, find the latest
                  result) and `Peer` (publish, heartbeats, hold and fetch blobs, push or take
                  submissions), written once over a few transport primitives; `RunRecords`
- `p2ppeer.py`    `P2PPeer`: a `Peer` on hivemind's DHT and libp2p streams; `DHTView` (records only)
- `memory.py`     `MemoryNetwork` / `MemoryPeer`: a `Peer` in process, same record and blob checks

`net` imports `protocol` and `validator.atomicfile`, never the manifest (`run`) or the roles.
"""
