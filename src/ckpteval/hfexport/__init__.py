"""A Megatron checkpoint written as a Hugging Face model directory (for vLLM, SGLang, transformers), and the
check that the written model computes what the checkpoint computes.

`config` (stdlib only: which Hugging Face family a checkpoint's architecture is, and its config.json),
`weights` (megatron-core's tensors under Hugging Face's names), `write` (`export_checkpoint`: the directory,
written atomically), `parity` (`check_parity`: config, tensors, tokenizer, logits and greedy tokens compared).
"""
