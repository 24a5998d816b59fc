"""EnvACE: train and evaluate tool-using LLM agents with world rehearsal (arXiv 2608.06197).

The public API, importable from the package itself::

    import envace

    model, tokenizer = envace.load("tiny-random")               # backends.models.load
    policy = envace.HFBackend(model, tokenizer)                  # backends.hf.HFBackend
    envace.train(envace.TrainConfig(...))                        # training.trainer.train (role-wise GRPO)
    envace.sft(envace.SFTConfig(...))                            # training.sft.sft (supervised warm-up)
    envace.evaluate_model("tiny-random", "bank", n=4)            # evaluation.budget.evaluate_model
    envace.rehearse(policy, tasks, envace.TTSConfig(n=2))        # evaluation.tts.rehearse (test-time rehearsal)

``import envace`` stays cheap: it imports neither torch nor transformers. Each name is imported from its module
on first use (a module-level ``__getattr__``, PEP 562), so ``envace --version`` and ``envace tasks`` start fast.

The folders are the architecture: ``core`` (types, registries, seeds, logging, checkpoints), ``chat`` (prompts,
chat formats, tool-call parsing), ``backends`` (models and generation engines), ``envs`` (environments and task
suites), ``rollout`` (Act and Rehearse unrolling trajectories), ``math`` (GRPO advantages and losses, statistics),
``rewards``, ``training`` (the GRPO and SFT loops, the update), ``evaluation`` (trials, test-time rehearsal,
fidelity, the experiment and its report) and ``serving`` (``envace serve``); ``cli`` and ``config`` on top.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# The one place the version is written: pyproject.toml reads it (``[tool.setuptools.dynamic]``), so the
# installed metadata, ``envace.__version__`` and ``envace --version`` cannot disagree.
__version__ = "0.1.0"

# public name -> module (relative to the package) that defines it
_EXPORTS: dict[str, str] = {
    "load": "backends.models",
    "HFBackend": "backends.hf",
    "RolloutEngine": "rollout.engine",
    "RolloutConfig": "rollout.engine",
    "train": "training.trainer",
    "TrainConfig": "config",
    "sft": "training.sft",
    "SFTConfig": "config",
    "evaluate": "evaluation.trials",
    "evaluate_model": "evaluation.budget",
    "rehearse": "evaluation.tts",
    "run_tts": "evaluation.budget",
    "TTSConfig": "evaluation.tts",
}

__all__ = ["__version__", *_EXPORTS]

if TYPE_CHECKING:  # what type checkers see (py.typed); at run time the names are imported lazily below
    from .backends.hf import HFBackend
    from .config import SFTConfig, TrainConfig
    from .evaluation.budget import evaluate_model, run_tts
    from .evaluation.trials import evaluate
    from .backends.models import load
    from .rollout.engine import RolloutConfig, RolloutEngine
    from .training.sft import sft
    from .training.trainer import train
    from .evaluation.tts import TTSConfig, rehearse


def __getattr__(name: str) -> Any:
    """Import a public name from its module on first access (PEP 562) and keep it on the package."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'envace' has no attribute {name!r}; public names: {', '.join(__all__)}")
    where = _EXPORTS[name]
    module = importlib.import_module(f".{where}", __name__)
    value = getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
