"""Gauntlet: evaluation, ratings, selection, aggregation and the validator's round logic.

Files:

- `aggregate.py`  clip each selected pseudo-gradient to the median norm, average (one decoded at a time)
- `outer.py`      outer optimizer on the FP32 master: SGD with optional Nesterov momentum, savable state
- `config.py`     `GauntletConfig`: every threshold of intake, scoring, selection and persistence
- `admission.py`  a round's seats, before any body: established miners first, newcomers by secret ticket, bytes
- `newcomers.py`  how many newcomer payloads a round decodes and evaluates (by ticket; junk does not count)
- `intake.py`     cheap checks before decoding: signature, run, round, replay, duplicate, base hash, size, digest
                  (`check_header`: those a header fails before its body is read, for the node's intake)
- `scoring.py`    the `Evaluator` interface, loss gains before/after an evaluation step, indicator, copy sketches
- `sketchmatch.py` two copy sketches compared in one merge pass (shared positions, dot product)
- `ratings.py`    persistent OpenSkill Plackett-Luce ratings, one match per round, missing/invalid rank last
- `gauntlet.py`   `RoundPipeline`: a round's whole decision (inspect, evaluate, copies, rate, select), the aggregate
- `decodeahead.py` the round's next payloads decoded on their own threads while one is inspected
- `atomicfile.py` atomic whole-file writes (temp file, fsync, rename, fsync folder); `node` uses them too
- `ledger.py`     every round's signed result in an append-only file; the hash-chain check anyone can run
- `state.py`      the state on disk: atomic files, one commit point per round, resume after a kill
- `core.py`       `Validator`: owns master, ratings and replay cache; `run_round`: screen, decide, step, sign, commit;
                  `round_context` / `established_in`: a round's terms from a book (validator and standby alike)
- `evidence.py`   a round's evidence blob (aggregation order, norms, clips, headers, revealed secret, book)
- `audit.py`      recompute a round from public data on an FP32 `Replica`; `AuditReport` names what differs
- `receipt.py`    a miner's receipt: the verdict from result and evidence, its gains recomputed within a tolerance

`validator` imports `protocol`, never `node`.
"""
