"""The GRPO trainer: tokenization, objective, LoRA step, checkpoints."""
