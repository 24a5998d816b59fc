"""Method variants (METHOD.md): a rollout mode, the roles that are trained and a line of doc.

A variant (:data:`VARIANTS`, the value of ``TrainConfig.variant``) asks its rollout mode
(``envace.rollout.modes.MODES``) who answers Act's calls, which models play and are trained, and which engine
keywords a rollout needs; the trainer, the CLI and the experiment ask these entries instead of branching on
variant names:

- :attr:`Variant.trained_models` and :meth:`Variant.model_of`: the models training updates and checkpoints, and
  the one a role's rows update;
- :meth:`Variant.models_at`: the model folder of each player after training (a checkpoint's ``<name>/``);
- ``Variant.rollout_mode.helpers``: the engine keywords of a rollout in the mode, each model opened by the caller.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..core.registry import Registry
from .modes import MODES, RolloutMode


@dataclass(frozen=True)
class Variant:
    """A method variant: rollout mode, which roles are trained, and (through its mode) who plays Rehearse."""

    mode: str
    train_roles: tuple[str, ...]
    doc: str

    @property
    def rollout_mode(self) -> RolloutMode:
        """The entry of its rollout mode: who plays Rehearse, which models are trained, whether a real env is needed."""
        return MODES.get(self.mode)

    @property
    def trained_models(self) -> tuple[str, ...]:
        """The models training updates and every checkpoint saves (its sub-folders): its mode's trained models."""
        return self.rollout_mode.trained_models

    @property
    def frozen_helper(self) -> str | None:
        """The name of a helper that is never trained (``simulator``), or None."""
        r = self.rollout_mode
        return None if r.trained else r.helper

    @property
    def rehearse_mode(self) -> str:
        """The rollout mode in which the variant's own models rehearse (fidelity): its mode where a helper plays
        Rehearse, else ``rehearsal`` (the policy rehearses; also for real_env, which trained with the real world)."""
        return self.mode if self.rollout_mode.helper else "rehearsal"

    def model_of(self, role: str) -> str:
        """The trained model that rows of ``role`` update: Rehearse rows a trained helper, all else the policy."""
        r = self.rollout_mode
        return r.helper if role == "rehearse" and r.trained and r.helper else "policy"

    def models_at(self, ckpt: str | None, start: str, frozen: str | None = None) -> dict[str, str]:
        """The model folder of each player after training from ``start``: ``<ckpt>/<name>`` for every trained model
        (all ``start`` when ``ckpt`` is None: untrained), and for a frozen helper the model that played it in
        training: ``frozen`` (``TrainConfig.simulator_model``) or, None, ``start`` (the trainer's default
        simulator: the model training began from)."""
        out = {name: os.path.join(ckpt, name) if ckpt else start for name in self.trained_models}
        if self.frozen_helper:
            out[self.frozen_helper] = frozen or start
        return out


VARIANTS: Registry[Variant] = Registry("variant")
VARIANTS.add(
    "envace", Variant("rehearsal", ("act", "rehearse"), "EnvACE: shared weights play Act and Rehearse; both trained")
)
VARIANTS.add("real_env", Variant("real", ("act",), "standard GRPO: real environment in the loop, Act only"))
VARIANTS.add("simulator", Variant("simulator", ("act",), "external frozen simulator model answers; Act trained"))
VARIANTS.add(
    "per_role", Variant("per_role", ("act", "rehearse"), "two models, one per role, each trained on its own rows")
)
VARIANTS.add("caller_frozen", Variant("rehearsal", ("rehearse",), "rehearsal rollouts, only Rehearse trained"))
VARIANTS.add("caller_only", Variant("rehearsal", ("act",), "rehearsal rollouts, Rehearse not trained"))

__all__ = ["Variant", "VARIANTS"]
