"""The roles on the network, built from a run (`run/`) and a peer (`net/`): each takes its `Peer`.

Files (in import order):

- `records.py`    the run as the network layer sees it (`RunRecords` from a manifest)
- `joinplan.py`   which checkpoint a joiner starts from: every recent one priced by bytes still to fetch
- `joinreport.py` what a node catching up shows: a join's progress, a fetch's bar, a run not found
- `chainstate.py` the CPU side of the chain: a checkpoint made the live state, a patch applied
- `forks.py`      whether a round's result continues the state the round before ended on (one line if not)
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
- `intake.py`     `RoundIntake`: the open round's pushed submissions, one object per validator process
                  (header checks and seats before the body, the inbox); active and standby alike
- `publisher.py`  `ChainPublisher`: checkpoints, the run's head, results (kept fresh), the round's blobs
- `keyclash.py`   a second validator with this key, seen on the run's head: stop in one line
- `chainrule.py`  an active validator among several: r-1 counted as its own, the standbys audited it,
                  nobody else published r (`Superseded` otherwise)
- `summary.py`    a closed round's figures: the `RoundClosed` event and the `RoundMetrics` record
- `validator_service.py` `ValidatorService`: the loop of rounds over a `Phase` enum; it owns the
                  `Validator` and is handed the intake; the publisher, the deadline clock and the chain rule
                  do the rest
- `auditblobs.py` `RoundBlobs`: what an audit works from (evidence, payloads, patch), fetched, re-served
- `auditstart.py` `ReplicaStart`: where an auditor's FP32 replica starts (its disk, W_0, a checkpoint)
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
- `doctor.py`     `pulse doctor`'s measurements (the machine, link probes, the run's records)
- `forecast.py`   `pulse doctor`'s forecast from them (bytes, seconds, the join's time) and its advice

Roles run on any `Peer`: `pulse` gives them the libp2p one, the fast tests the in-memory one.

One round, file by file (r: the open round; W_r: the BF16 weights everyone holds):

1. `validator_service.py` OPENING: `publisher.py` announces a checkpoint and the head; `hooks.py`
   prepares the round (RL: `rl/pool.py`); the intake opens on W_r; a heartbeat names the target
   (`deadline.py`).
2. `miner.py` sees it (`Peer.get`, `node/net/peer.py`), trains (`node/run/trainer.py`), shrinks
   its payload to its uplink (`uplink.py`), and pushes it (`Peer.submit` -> `node/net/transfer.py`
   `call_submit`).
3. `node/net/transfer.py` `rpc_submit` on the validator: signature, replay and stream budgets, then
   `intake.py` `accept` (`validator/intake.py` header checks, `validator/admission.py` seats);
   the body lands in the inbox, `on_submission` keeps it.
4. `validator_service.py` COLLECTING ends (`deadline.py`); CLOSING: `validator/core.py`
   `run_round` screens, scores, selects, aggregates and steps (`validator/gauntlet.py`), signs.
5. `replicas.py` hands the result to the standbys (`standby.py`, whose intake took the same pushes);
   `publisher.py` stores the patch, evidence and payloads and publishes the result; `summary.py`
   reports the round.
6. `follower.py` and `miner.py` (`catchup.py` `Chain`) fetch the patch, apply it (`chainstate.py`)
   and hold W_{r+1}; `auditor.py` recomputes the round from the evidence.
"""
