"""Pure protocol code: no sockets, no files, no clocks. Everything a peer sends is parsed here.

Files (each imports only the standard library, torch, numpy, codec libraries and earlier rows):

- `errors.py`      one exception tree; every rejection of peer bytes is a `ProtocolError`
- `state.py`       `State`, the one name for tensors by parameter name (read-only), and `StateDict` (owned)
- `tensorbytes.py` wire dtype names, exact bit-pattern views of float tensors, host slabs of device tensors
- `parallel.py`    per-tensor codec work on all cores, results in input order
- `statehash.py`   the state hash (v2): SHA-256 over per-chunk SHA-256 digests, on all cores, checkable piecewise
- `identity.py`    Ed25519 identities (PyNaCl), signature checks, the key-file text format
- `parsing.py`     strict parsing of JSON models (size cap, schema, canonical bytes); a `ValidationError` as one line
- `messages.py`    pydantic wire models, their canonical bytes and size caps; `PROTOCOL_VERSION`
- `wire.py`        bounded reader/writer for binary formats (truncation, trailing bytes, caps)
- `signing.py`     signed envelopes over a domain-separated preimage, message ids, `SeenCache` for replays
- `pieces.py`      a checkpoint's piece index: which blob bytes are which state chunk, tied to the state hash
- `ans.py`         rANS entropy coding, compiled (numba), integer-exact models, streams bounded by their length
- `contexts.py`    the old weight's exponent as coding context; compiled rank passes in natural order
- `positions.py`   sparse positions as Rice-coded gaps between ranks in a context class, one code byte a class
- `syncpass.py`    PULSESync's compiled per-weight passes: collect the changes, walk a stream onto the old weights
- `changes.py`     the per-weight passes as torch ops where the tensors are (a GPU): changes, classes, ranks
- `pulsesync.py`   PULSESync: lossless sparse BF16 weight patches between two states
- `assignment.py`  data assignment: a miner's batch seeds from (run id, round, key), and their digest
- `floatcode.py`   FP32 values as sign + exponent relative to a context exponent (entropy-coded) + raw mantissa
- `codec.py`       pseudo-gradient codec interface, the dense (DiLoCo) codec, the registry by name
- `pulseloco.py`   PULSELoCo: send what would change the BF16 forward pass, keep the rest as error feedback
- `sparseloco.py`  SparseLoCo: top-k per 4096-element chunk, 2-bit values, error feedback
- `warmup.py`      every codec kernel run once (a node: on its own thread at start), none loaded against a deadline
- `codec_options.py` the codec parameters a run fixes (pydantic) and `build_codec`, the one way a run's codec is made

`protocol` imports neither `node` nor `validator`.
"""
