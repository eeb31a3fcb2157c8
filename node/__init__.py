"""The running peer: model and data, training, checkpoints, networking, the CLI.

- `cli.py`         `pulse` entry point; parses flags and calls library functions
- `model.py`       the embedded byte-level GPT and its config; `CausalLM`, what the node needs of a model
- `hfmodel.py`     a Hugging Face causal LM from a local directory as a `CausalLM`, and its tokenized corpus
- `data.py`        the embedded corpus (the standard library's `.py` sources) and seeded batches
- `train.py`       training primitives: BF16 state copy/load, H AdamW inner steps, evaluation
- `basecache.py`   the briefly pre-trained base model, cached as safetensors keyed by its recipe
- `keyfile.py`     identity key files on disk: atomic, mode 0600, never overwritten, checked on load
- `keygen_command.py` `pulse keygen`
- `netconfig.py`   network start-up options (initial peers, listen/announce addrs, relays, identity)
- `dht.py`         signed records on hivemind's DHT and the record validator every peer runs
- `dht_command.py` `pulse dht`: a bootstrap peer that prints its multiaddrs
- `blobstore.py`   content-addressed blobs on disk (SHA-256 names, verified atomic writes)
- `streams.py`     blob stream framing, limits and byte pumps (bounded reads, hashing off the loop)
- `transfer.py`    `rpc_fetch`/`rpc_submit` handlers and `call_fetch`/`call_submit` clients over libp2p
- `gpteval.py`     the model as the validator's `Evaluator`, and the seed -> batch source miners share
- `manifest.py`    run manifests (`configs/*.toml`): pydantic sections, run id = hash of the manifest
- `runtime.py`     what a manifest means in memory (model, batches, W_0) and `Events`, the role logs
- `peer.py`        one node on the network: DHT records of the run, heartbeats, blob fetch from any holder
- `catchup.py`     BF16 global weights kept in step: patch chain, checkpoints to join or recover
- `validator_service.py` the validator's rounds: open, collect pushed submissions, close, publish
- `trainer.py`     a miner's local work: H inner steps on its assignment, compression with error feedback
- `miner.py`       the miner (train H steps, compress, push; overlaps the next round) and the follower
- `roles_command.py` `pulse validator`, `pulse miner`, `pulse follow`; clean Ctrl+C shutdown
- `status_command.py` `pulse status`: current round, active nodes, latest scores
- `demo.py`, `demo_command.py` `pulse demo`: a loopback swarm of processes, live table, report and plots
- `rl/`            RL post-training (`task = "rl"`): the task, sampling, GRPO, the evaluator, the warm
                   start, and the workers', pool's and miners' network roles (see `rl/__init__.py`)
- `bench/`         `pulse bench ...` subcommands (`command.py` registers them, `report.py` prints;
                   `sync.py` measures PULSESync against `plainpatch.py`, the plain sparse encoding)
- `bench/transfer.py` blob fetch over libp2p versus a plain TCP copy
- `bench/trace.py` real BF16 update traces from the base model (`load_trace`) and their sparsity
- `bench/rl.py`    decentralized GRPO (`rlsim.py`: workers, pool, miners, the real validator, PULSESync)
                   against single-process GRPO: held-out reward, patch density, bytes per sync
- `bench/gauntlet.py` the validator against fake miners (`fakeminers.py`, run by `arena.py`): selection,
                   loss, time and memory
- `bench/attacks.py` the attack and fault campaign of `tests/campaign/` (hostile miner processes,
                   faults) against real loopback swarms; needs the source checkout

`node` may import `protocol` and `validator`; neither imports `node`.
"""
