"""Models, data and training: pure ML, no network, no roles, no manifest.

Files (in import order):

- `model.py`      the embedded byte-level GPT and its config; `CausalLM`, what the node needs of a model
- `data.py`       the embedded corpus (the standard library's `.py` sources) and seeded batches
- `hfmodel.py`    a Hugging Face causal LM from a local directory as a `CausalLM`, and its tokenized corpus
- `hfexport.py`   the embedded GPT as an exact Hugging Face GPT-2, and a byte-level tokenizer for it
- `train.py`      training primitives: BF16 state copy/load, H AdamW inner steps, evaluation
- `basecache.py`  the briefly pre-trained base model, cached as safetensors keyed by its recipe
- `gpteval.py`    the model as the validator's `Evaluator`, and the seed -> batch source miners share
- `rl/`           the pure pieces of RL post-training: task, rollout checks, sampling, GRPO, evaluator, warm start

`learn` imports `protocol`, `validator` and `node.events` only.
"""
