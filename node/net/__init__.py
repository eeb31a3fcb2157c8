"""The network: hivemind's DHT and libp2p streams, blobs on disk, key files.

Files (in import order):

- `keyfile.py`    identity key files on disk: atomic, mode 0600, never overwritten, checked on load
- `netconfig.py`  network start-up options (initial peers, listen/announce addrs, relays, identity)
- `dht.py`        signed records on hivemind's DHT and the record validator every peer runs
- `blobstore.py`  content-addressed blobs on disk (SHA-256 names, verified atomic writes)
- `streams.py`    blob stream framing, limits and byte pumps (bounded reads, hashing off the loop)
- `transfer.py`   `rpc_fetch`/`rpc_submit` handlers and `call_fetch`/`call_submit` clients over libp2p
- `peer.py`       one node on the network: the run's DHT records, heartbeats, blob fetch from any holder;
                  `RunRecords`, the few facts of a run it needs

`net` imports `protocol` and `validator.atomicfile`, never the manifest (`run`) or the roles.
"""
