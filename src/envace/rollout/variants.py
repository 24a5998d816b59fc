"""Method variants (METHOD.md) and who plays Rehearse in each rollout mode.

A variant (:data:`VARIANTS`, the value of ``TrainConfig.variant``) is a rollout mode, the roles that are trained
and a line of doc. Its rollout mode decides who answers Act's calls (:data:`REHEARSERS`): the policy's own
weights (``rehearsal``), the real environment (``real``), a second model of its own (``per_role``: trained on the
Rehearse rows and saved beside the policy in every checkpoint) or a frozen external model (``simulator``). A model
that answers besides the policy is a *helper*, handed to ``RolloutEngine`` under its name (``rehearser=``,
``simulator=``). The trainer, the CLI and the experiment ask these entries which models play, where a checkpoint
keeps them and which engine keywords a rollout needs, instead of branching on variant names:

- :attr:`Variant.trained_models` and :meth:`Variant.model_of`: the models training updates and checkpoints, and
  the one a role's rows update;
- :meth:`Variant.models_at`: the model folder of each player after training (a checkpoint's ``<name>/``);
- :meth:`Rehearser.helpers`: the engine keywords of a rollout in the mode, each model opened by the caller.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable

from ..core.registry import Registry


@dataclass(frozen=True)
class Rehearser:
    """Who answers Act's calls in a rollout mode."""

    doc: str
    helper: str | None = None
    """The ``RolloutEngine`` keyword of the model that answers besides the policy (``rehearser``, ``simulator``);
    None where the policy itself rehearses or the real environment answers."""
    trained: bool = False
    """Whether the helper is trained (on the Rehearse rows) and saved in each checkpoint as ``<helper>/``; else it is
    frozen, never trained nor saved."""

    @property
    def checkpoint_role(self) -> str:
        """The model of a training checkpoint that plays the helper (``envace.backends.models.resolve_model``'s role):
        its own sub-folder for a trained helper, else the checkpoint's policy."""
        return self.helper if self.trained and self.helper else "policy"

    def helpers(self, open_model: Callable[[str, str], Any]) -> dict[str, Any]:
        """The engine keywords of a rollout in this mode: ``{helper: open_model(helper, checkpoint_role)}``, or {}."""
        return {} if self.helper is None else {self.helper: open_model(self.helper, self.checkpoint_role)}


REHEARSERS: Registry[Rehearser] = Registry("rollout mode")
REHEARSERS.add("rehearsal", Rehearser("the policy's own weights, in a Rehearse context of their own"))
REHEARSERS.add("real", Rehearser("the task's real environment"))
REHEARSERS.add(
    "per_role", Rehearser("a second model of its own, trained on the Rehearse rows", helper="rehearser", trained=True)
)
REHEARSERS.add("simulator", Rehearser("a frozen external model, never trained", helper="simulator"))


@dataclass(frozen=True)
class Variant:
    """A method variant: rollout mode, which roles are trained, and (through its mode) who plays Rehearse."""

    mode: str
    train_roles: tuple[str, ...]
    doc: str

    @property
    def rehearser(self) -> Rehearser:
        return REHEARSERS.get(self.mode)

    @property
    def trained_models(self) -> tuple[str, ...]:
        """The models training updates and every checkpoint saves (its sub-folders): ``policy``, and a trained helper."""
        r = self.rehearser
        return ("policy", r.helper) if r.trained and r.helper else ("policy",)

    @property
    def frozen_helper(self) -> str | None:
        """The name of a helper that is never trained (``simulator``), or None."""
        r = self.rehearser
        return None if r.trained else r.helper

    @property
    def rehearse_mode(self) -> str:
        """The rollout mode in which the variant's own models rehearse (fidelity): its mode where a helper plays
        Rehearse, else ``rehearsal`` (the policy rehearses; also for real_env, which trained with the real world)."""
        return self.mode if self.rehearser.helper else "rehearsal"

    def model_of(self, role: str) -> str:
        """The trained model that rows of ``role`` update: Rehearse rows a trained helper, everything else the policy."""
        r = self.rehearser
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

__all__ = ["Rehearser", "REHEARSERS", "Variant", "VARIANTS"]
