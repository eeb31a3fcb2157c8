"""Pure protocol code: no sockets, no files, no clocks. Everything a peer sends is parsed here.

Files (each imports only the standard library, torch, numpy, codec libraries and earlier rows):

- `errors.py`      one exception tree; every rejection of peer bytes is a `ProtocolError`
- `state.py`       `State`, the one name for tensors by parameter name (read-only), and `StateDict` (owned)
- `tensorbytes.py` wire dtype names and exact bit-pattern views of float tensors
- `statehash.py`   canonical SHA-256 of a state dict (sorted names, dtype, shape, bytes)
- `identity.py`    Ed25519 identities (PyNaCl), signature checks, the key-file text format
- `messages.py`    pydantic wire models, their canonical bytes and size caps; `PROTOCOL_VERSION`
- `wire.py`        bounded reader/writer for binary formats (truncation, trailing bytes, caps)
- `signing.py`     signed envelopes over a domain-separated preimage, message ids, `SeenCache` for replays
- `parallel.py`    per-tensor codec work on all cores, results in input order
- `ans.py`         ANS entropy coding (constriction) with integer-exact models, bounded decoding
- `contexts.py`    the old weight's exponent as coding context, and the class-major order it induces
- `positions.py`   entropy coding of sparse positions conditioned on a per-position context
- `values.py`      changed values as bit-pattern differences, one model per (dtype, old exponent)
- `pulsesync.py`   PULSESync: lossless sparse BF16 weight patches between two states
- `assignment.py`  data assignment: a miner's batch seeds from (run id, round, key), and their digest
- `floatcode.py`   FP32 values as sign + exponent relative to a context exponent (entropy-coded) + raw mantissa
- `codec.py`       pseudo-gradient codec interface, the dense (DiLoCo) codec, the registry by name
- `pulseloco.py`   PULSELoCo: send what would change the BF16 forward pass, keep the rest as error feedback
- `sparseloco.py`  SparseLoCo: top-k per 4096-element chunk, 2-bit values, error feedback
- `codec_options.py` the codec parameters a run fixes (pydantic) and `build_codec`, the one way a run's codec is made

`protocol` imports neither `node` nor `validator`.
"""
