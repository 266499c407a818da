"""Builders of tiny real Megatron checkpoints, one module per kind (architectures, tokenizers, layouts,
sharded saves): each `build_<name>(out_dir) -> Path` runs on the CPU in seconds."""
