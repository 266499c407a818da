"""A Megatron checkpoint written as a Hugging Face model directory (for vLLM, SGLang, transformers), and the
check that the written model computes what the checkpoint computes.

`weights` (megatron-core's tensors under Hugging Face's names; the config mapping is
`checkpoint.hf_export_config`), `write` (`export_checkpoint`: the directory, written atomically), `parity`
(`check_parity`: config, tensors, tokenizer, logits and greedy tokens compared), `checked` (both), `cache`
(`export_into_cache`: the job's step before vLLM/SGLang, keyed by the checkpoint's content identity, one job
at a time per entry; `python -m ckpteval.hfexport cached`).
"""
