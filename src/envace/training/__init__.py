"""The training loops (role-wise GRPO in trainer, SFT in sft), the gradient update, data-parallel training."""
