"""The GRPO trainer: tokenization, objective, LoRA step, checkpoints.

Trajectories rendered into exact token sequences (`render`, `sequences`), the loss and
advantages (`objective`), the LoRA step (`lora`, `step`, `fusion`, `attention`), SFT
(`sft`), checkpoints (`checkpoint`), and the trainer's processes (`pool`, `distributed`,
`ranks`).

May import: the root foundation, `runtime`, `models`, `trajectory`, `engines` (a rank's
child environment). Never imports: the endpoint, rollouts, the backend or serve.
"""
