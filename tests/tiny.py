"""The tiny training run the trainer tests start from: the random-init model on bank tasks, one iteration of
groups of 2, two Act steps of at most 8 new tokens; each test file sets what it varies."""

from typing import Any

from envace.backends.base import SamplingParams
from envace.config import TrainConfig
from envace.rollout.engine import RolloutConfig


def tiny_train_config(out_dir: Any, **kw: Any) -> TrainConfig:
    """A TrainConfig of the tiny run writing into ``out_dir``; ``kw`` sets or replaces any field."""
    rollout = RolloutConfig(
        max_steps=2,
        act=SamplingParams(max_new_tokens=8),
        rehearse=SamplingParams(max_new_tokens=8, stop=["</observation>"]),
    )
    base = dict(
        model="tiny-random",
        suite="bank",
        iterations=1,
        batch_tasks=1,
        lr=1e-3,
        group_size=2,
        rollout=rollout,
        out_dir=str(out_dir),
        tensorboard=False,
        progress=False,
        save_every=1,
    )
    return TrainConfig(**(base | kw))
