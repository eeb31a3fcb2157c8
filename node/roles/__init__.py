"""The roles on the network, built from a run (`run/`) and a peer (`net/`): each takes its `Peer`.

Files (in import order):

- `records.py`    the run as the network layer sees it (`RunRecords` from a manifest)
- `joinplan.py`   which checkpoint a joiner starts from: every recent one priced by bytes still to fetch
- `chainstate.py` the CPU side of the chain: a checkpoint made the live state, a patch applied
- `catchup.py`    BF16 global weights kept in step: `Chain`, one loop over checkpoints and patches
                  (a join fetches the checkpoint piecewise from every holder, patches meanwhile)
- `uplink.py`     a miner's measured uplink: the share of a payload that arrives by the round's target
- `follower.py`   `Follower`: keeps the weights in step and runs its round services (RL: rollouts)
- `miner.py`      `Miner`: keeps the weights in step, trains, pushes (overlaps the next round);
                  `RoundInputs`, what its trainer needs from the network first
- `hooks.py`      `RoundHooks`, what the validator does around a round per task; the LM hooks
- `rl/`           the RL pieces of the roles: the pool (validator), the rollout worker (follower's
                  service), the pool fetch (miner's inputs), the RL round hooks
- `deadline.py`   when a round closes: fixed, or adaptive (quorum + a target learned from arrivals)
- `replicas.py`   a round's result, patch, evidence and payloads on a standby before they are
                  published (`rpc_replicate`): the active validator's push, the standby's checks
- `validator_service.py` the validator's rounds: open, collect pushed submissions, close, publish
- `auditor.py`    `Auditor`: an FP32 replica that recomputes every counted round (`pulse audit`,
                  `pulse follow --audit`); a result that does not recompute is reported, not applied
- `standby.py`    `ValidatorRole`: a validator of a manifest listing several, active or standby
                  (audits, collects, takes a round over after deadline + its turn, stands down)
- `receipt.py`    `pulse receipt`: W_r, the counted result and its evidence, a miner's verdict and gains
- `tasks.py`      the roles of a run from its task (`Task` -> hooks, inputs, services): the one
                  place that knows which task needs what; the roles never ask
- `status.py`     what `pulse status` shows, read from any `RunView`
- `export.py`     the model taken home: a Hugging Face folder, its contributor ledger and its check
- `dashboard/`    the live run page: a board derived from signed records, its HTML, a watcher, a server
- `metrics.py`    a role's Prometheus endpoint: the event metrics plus the peer's counts and the process
- `machinefit.py` does the run fit this machine: inner steps timed on the device at the run's batch,
                  peak device and host memory, against the card's memory, the RAM and the disk
- `doctor.py`     `pulse doctor`'s measurements (the machine, link probes, the run's records) and forecast

Roles run on any `Peer`: `pulse` gives them the libp2p one, the fast tests the in-memory one.
"""
