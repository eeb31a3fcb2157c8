"""Models, data and training: pure ML, no network, no roles, no manifest.

Files (in import order):

- `model.py`      the embedded byte-level GPT and its config; `CausalLM`, what the node needs of a model
- `data.py`       the embedded corpus (the standard library's `.py` sources) and seeded batches
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
