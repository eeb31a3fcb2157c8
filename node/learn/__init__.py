"""Models, data and training: pure ML, no network, no roles, no manifest.

Files (in import order):

- `model.py`      the embedded byte-level GPT and its config; `CausalLM`, what the node needs of a model
- `data.py`       token corpora (possibly memory-mapped), seeded batches, the token digest; the embedded
                  corpus (the standard library's `.py` sources)
- `datafiles.py`  the user's text, JSONL and Parquet files (files, folders, globs) as documents, read
                  offline with Hugging Face `datasets`; one clear line per bad file
- `tokencache.py` those documents tokenized once into an on-disk, memory-mapped token cache, split by a
                  hash of each document
- `adamw16.py`    AdamW with BF16 moments (half the optimizer state)
- `train.py`      training primitives: BF16 state copy/load, H AdamW inner steps, the memory options, evaluation
- `hfmodel.py`    a Hugging Face causal LM (a local directory, or an architecture with seeded weights) as a
                  `CausalLM`, its chunked large-vocabulary loss, and its tokenized corpus
- `hfexport.py`   the embedded GPT as an exact Hugging Face GPT-2, and a byte-level tokenizer for it
- `basecache.py`  the briefly pre-trained base model, cached as safetensors keyed by its recipe
- `gpteval.py`    the model as the validator's `Evaluator`, and the seed -> batch source miners share
- `rl/`           the pure pieces of RL post-training: task, rollout checks, sampling, GRPO, evaluator, warm start

`learn` imports `protocol`, `validator` and `node.events` only.
"""
