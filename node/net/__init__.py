"""The network: hivemind's DHT and libp2p streams, blobs on disk, key files.

Files (in import order):

- `keyfile.py`    identity key files on disk: atomic, mode 0600, never overwritten, checked on load
- `netconfig.py`  network start-up options (initial peers, listen/announce addrs, relays, identity;
                  the libp2p identity file written 0600 from the start)
- `records.py`    the store-time rules of a run's records: a policy per kind (who writes it, its
                  size, signers per key), the signed expiry, and the store budget of one peer
- `lifetime.py`   children die with their node (the DHT process watches its parent, p2pd gets a
                  parent-death signal); a fixed listen port already taken, named with its holder
- `dhtprocess.py` what runs inside hivemind's DHT process: tied to the node, the bounded storage, a
                  pipe that waits
- `dht.py`        signed records on hivemind's DHT, the record validator every peer runs, restarts
- `blobstore.py`  content-addressed blobs on disk (SHA-256 names, verified atomic writes)
- `retention.py`  which blobs a node keeps: the last rounds, the newest checkpoints whole, a disk budget
- `streams.py`    blob stream framing, limits and byte pumps (bounded reads, minimum rates both ways)
- `fetching.py`   one blob from many claimed holders: proven ones first, hedged, one deadline
- `ranges.py`     parts of a blob and link probes on the fetch stream
- `pieces.py`     one large blob from every holder at once, piece by piece, each piece checked on
                  arrival (lying holders dropped, dead ones replaced, a partial file resumed)
- `transfer.py`   `rpc_fetch`/`rpc_submit`/`rpc_replicate` handlers with their budgets, and `call_fetch`/`call_submit`
                  clients (the conversations run on any stream: libp2p or in memory); `rpc_submit` ends
                  in the `Intake` the service is built with (the validator's, `node/roles/intake.py`),
                  or, for a rollout batch, in the `RolloutTaker` an RL validator sets
                  (`node/roles/rl/intake.py`)
- `peer.py`       what roles need of the network: `RunView` (read the run's records, find the latest
                  result) and `Peer` (publish, heartbeats, hold and fetch blobs, push submissions),
                  written once over a few transport primitives; `RunRecords`
- `p2ppeer.py`    `P2PPeer`: a `Peer` on hivemind's DHT and libp2p streams; `DHTView` (records only)
- `memory.py`     `MemoryNetwork` / `MemoryPeer`: a `Peer` in process, same record and blob checks
                  (both take the validator's `Intake` when they are made, and only then take pushes)

`net` imports `protocol` and `validator.atomicfile`, never the manifest (`run`) or the roles.
"""
