"""Data-parallel training over several processes, through ``accelerate`` on ``torch.distributed``.

Launch (see docs/scaling.md)::

    torchrun --nproc_per_node 2 -m envace.cli train --config configs/cpu.yaml            # CPU, gloo
    accelerate launch --config_file fsdp.yaml -m envace.cli train --config configs/8gpu_fsdp_vllm.yaml

A process started without a launcher gets :class:`Dist`, one process, whose collectives are all the identity:
the trainer then runs exactly as it does without this module. Under a launcher :func:`init_distributed`
returns :class:`AccelerateDist`; ``accelerate`` picks DDP or FSDP from its config (``accelerate config``).

How the work is split, and why the maths stays the single-process maths:

- **Whole groups on one process.** The B tasks of an iteration are dealt out task by task (process r takes tasks
  r, r+W, r+2W, ... of the global batch) and each process rolls out all K trajectories of its tasks. A GRPO group
  is one task's K trajectories, so every (group, role) baseline is computed from complete local data and the
  advantages are exactly the single-process ones, with no statistic exchanged. (The alternative, gathering
  per-group sums and counts so a group may span processes, costs a collective per iteration and couples rollout
  placement to the estimator; it only pays off when B < W, where some processes here simply idle.) Only light
  copies of the trajectories (no prompt tokens) are gathered, for metrics and the trajectory log.
- **A global loss normalizer.** token_mean divides by the completion tokens of the *whole* batch (seq_mean by its
  rows), all-reduced over processes; each process's loss is its own tokens' sum over that count. DDP and FSDP
  average gradients over processes, so the loss is multiplied by W before ``backward``: the synchronised gradient
  is then the gradient of the single-process loss.
- **As many forwards on every process.** A forward of a prepared model is a collective (DDP broadcasts buffers,
  FSDP gathers parameters), so every process runs the maximum micro-batch count over processes; a process that
  has run out runs a one-token forward whose loss is multiplied by 0. Gradients are synchronised once, on the
  last micro-batch (``no_sync`` before it).
- **Checkpoints** hold the full (unsharded) model and optimizer state and are written by rank 0 alone, in the
  same files a single process writes; the data position counts global tasks, so a run resumes on any process
  count (same data order, same optimizer state).

Not supported: DeepSpeed (its engine steps inside ``backward``, which breaks the one-step-per-batch gradient
accumulation over packed micro-batches; use DDP or FSDP), and the HF rollout backend under FSDP (generation
would need every process to run the same forwards; use ``rollout_backend: vllm``, whose weights are gathered and
synced after each update).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Any, Iterator

import torch

from ..core.checkpoint import load_optimizers, save_checkpoint
from ..core.seeding import derive_seed
from ..core.types import Trajectory


class Dist:
    """One process, no launcher: every collective is the identity; ``prepare`` only places the model."""

    rank = 0
    world_size = 1
    grad_scale = 1.0
    """The loss is multiplied by this before backward (undoes the wrapper's gradient averaging over processes)."""
    direct_head = True
    """Whether the update may run the model's trunk and LM head separately (a prepared DDP/FSDP model must be called
    whole)."""
    shards_parameters = False
    """True under FSDP: no process holds the full weights outside a forward."""

    def __init__(self, device: str | torch.device = "cpu"):
        self.device = torch.device(device)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    # -- work split ------------------------------------------------------------------------------------------
    def shard(self, items: list[Any]) -> list[Any]:
        """This process's share of a global list (items r, r+W, ...): whole tasks, hence whole GRPO groups."""
        return list(items)[self.rank :: self.world_size]

    def rank_seed(self, seed: int) -> int:
        """A sampling seed of its own for each process, ``seed + 1_000_003 * rank`` (rank 0 keeps ``seed``)."""
        return derive_seed(self.rank, seed)

    def group_prefix(self, prefix: str) -> str:
        """Group ids unique over processes (unchanged on one process)."""
        return prefix if self.world_size == 1 else f"{prefix}r{self.rank}-"

    # -- collectives -----------------------------------------------------------------------------------------
    def sum(self, x: float) -> float:
        return float(x)

    def max(self, x: float) -> float:
        return float(x)

    def all_gather(self, obj: Any) -> list[Any]:
        """``obj`` of every process, in rank order."""
        return [obj]

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every process."""
        return obj

    def gather_trajectories(self, trajs: list[Trajectory]) -> list[Trajectory]:
        """The whole batch's trajectories on every process (light copies, rows without prompt tokens); on one
        process the list itself."""
        if self.world_size == 1:
            return trajs
        return [t for part in self.all_gather([_light(t) for t in trajs]) for t in part]

    def merge_metrics(self, sums: dict[str, float]) -> dict[str, float]:
        """Add per-process metric sums over processes (``*_max`` keys: maximum)."""
        if self.world_size == 1:
            return sums
        out: dict[str, float] = {}
        for part in self.all_gather(sums):
            for k, v in part.items():
                out[k] = max(out.get(k, float("-inf")), v) if k.endswith("_max") else out.get(k, 0.0) + v
        return out

    # -- models ----------------------------------------------------------------------------------------------
    def prepare(self, model: Any, optimizer: Any) -> tuple[Any, Any]:
        """Place (and, under a launcher, wrap) a trained model and its optimizer."""
        model.to(self.device)
        return model, optimizer

    def place(self, model: Any) -> Any:
        """Place a frozen model (reference, simulator) on this process's device."""
        return model.to(self.device)

    def unwrap(self, model: Any) -> Any:
        return model

    def no_sync(self, model: Any) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def clip_grad_norm_(self, model: Any, max_norm: float) -> float:
        return float(torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], max_norm))

    def weights(self, model: Any) -> Any:
        """What a rollout engine's ``sync_weights`` gets: the model itself (full weights on every process)."""
        return self.unwrap(model)

    # -- checkpoints -----------------------------------------------------------------------------------------
    def save_checkpoint(
        self,
        root: str,
        step: int,
        models: dict[str, Any],
        optimizers: dict[str, Any],
        state: dict[str, Any],
        tokenizer: Any = None,
        keep: int = 2,
    ) -> str:
        """Write checkpoint ``step`` (rank 0 only, full states); every process gets its path."""
        views = {name: self._full_state(models[name], optimizers[name]) for name in models}  # a collective under FSDP
        path = None
        if self.is_main:
            path = save_checkpoint(
                root,
                step,
                {n: v[0] for n, v in views.items()},
                {n: v[1] for n, v in views.items()},
                state,
                tokenizer=tokenizer,
                keep=keep,
            )
        return self.broadcast(path)  # also a barrier: nobody goes on before the checkpoint exists

    def load_optimizers(self, path: str, models: dict[str, Any], optimizers: dict[str, Any]) -> None:
        load_optimizers(path, optimizers)

    def _full_state(self, model: Any, optimizer: Any) -> tuple[Any, Any]:
        """(object with ``save_pretrained``, object with ``state_dict``) holding the full states."""
        return model, optimizer


class AccelerateDist(Dist):
    """Several processes under torchrun / accelerate launch: DDP or FSDP as ``accelerate`` is configured."""

    direct_head = False

    def __init__(self) -> None:
        from accelerate import Accelerator
        from accelerate.utils import DistributedType

        self.acc = Accelerator(cpu=not torch.cuda.is_available())  # without cpu=True accelerate ignores a CPU launch
        kind = self.acc.distributed_type
        if kind == DistributedType.DEEPSPEED:
            raise ValueError(
                "DeepSpeed is not supported: its engine steps the optimizer inside backward, which breaks envace's one "
                "optimizer step per batch over packed micro-batches; configure accelerate for DDP (multi-GPU) or FSDP"
            )
        self.rank = self.acc.process_index
        self.world_size = self.acc.num_processes
        self.device = self.acc.device
        self.grad_scale = float(self.world_size)  # DDP and FSDP average gradients over processes
        self.shards_parameters = kind == DistributedType.FSDP

    def sum(self, x: float) -> float:
        return self._reduce(x, torch.distributed.ReduceOp.SUM)

    def max(self, x: float) -> float:
        return self._reduce(x, torch.distributed.ReduceOp.MAX)

    def _reduce(self, x: float, op: Any) -> float:
        if self.world_size == 1:
            return float(x)
        t = torch.tensor([float(x)], dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(t, op=op)
        return float(t.item())

    def all_gather(self, obj: Any) -> list[Any]:
        if self.world_size == 1:
            return [obj]
        out: list[Any] = [None] * self.world_size
        torch.distributed.all_gather_object(out, obj)
        return out

    def broadcast(self, obj: Any) -> Any:
        if self.world_size == 1:
            return obj
        box = [obj if self.is_main else None]
        torch.distributed.broadcast_object_list(box, src=0)
        return box[0]

    def prepare(self, model: Any, optimizer: Any) -> tuple[Any, Any]:
        return self.acc.prepare(model, optimizer)

    def place(self, model: Any) -> Any:
        return model.to(self.device)

    def unwrap(self, model: Any) -> Any:
        return self.acc.unwrap_model(model)

    def no_sync(self, model: Any) -> contextlib.AbstractContextManager:
        return self.acc.no_sync(model)

    def backward(self, loss: torch.Tensor) -> None:
        self.acc.backward(loss)

    def clip_grad_norm_(self, model: Any, max_norm: float) -> float:
        return float(self.acc.clip_grad_norm_(model.parameters(), max_norm))

    def weights(self, model: Any) -> Any:
        """DDP: the model (every process holds the full weights). FSDP: (name, full tensor) pairs, gathered on every
        process (each one's rollout engine needs them) -- one tensor at a time under FSDP2, all at once under FSDP1.
        Every process must consume them, in order (each gather is a collective)."""
        if not self.shards_parameters:
            return self.unwrap(model)
        if _is_peft(self.unwrap(model)):
            raise ValueError(
                "syncing LoRA weights into a rollout engine under FSDP is not "
                "supported; train LoRA with DDP (it fits one GPU per process)"
            )
        if getattr(self.acc, "is_fsdp2", False):
            return (
                (name, t.full_tensor() if hasattr(t, "full_tensor") else t) for name, t in model.state_dict().items()
            )
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=False)).items()

    def load_optimizers(self, path: str, models: dict[str, Any], optimizers: dict[str, Any]) -> None:
        if not self.shards_parameters:
            load_optimizers(path, {n: _inner(o) for n, o in optimizers.items()})  # state is cast to the params' device
            return
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        states = torch.load(os.path.join(path, "optimizer.pt"), weights_only=False)
        for name, opt in optimizers.items():
            names = trainable_names(self.unwrap(models[name]))
            set_optimizer_state_dict(
                models[name],
                _inner(opt),
                optim_state_dict=by_name(states[name], names),
                options=StateDictOptions(full_state_dict=True),
            )

    def _full_state(self, model: Any, optimizer: Any) -> tuple[Any, Any]:
        if not self.shards_parameters:
            return self.unwrap(model), _inner(optimizer)
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)  # rank 0 gets the full state, in CPU memory
        sd = get_model_state_dict(model, options=opts)
        osd = get_optimizer_state_dict(model, _inner(optimizer), options=opts)
        names = trainable_names(self.unwrap(model))
        return _SavedModel(self.unwrap(model), sd), _SavedOptimizer(by_index(osd, names) if self.is_main else {})


def init_distributed(device: str = "cpu") -> Dist:
    """:class:`AccelerateDist` under torchrun / accelerate launch (WORLD_SIZE > 1, or an accelerate FSDP setup),
    else :class:`Dist` on ``device``."""
    launched = (
        int(os.environ.get("WORLD_SIZE", "1")) > 1
        or os.environ.get("ACCELERATE_USE_FSDP", "").lower() == "true"
        or os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true"
    )
    return AccelerateDist() if launched else Dist(device)


class SilentLogger:
    """The metrics logger of processes other than rank 0 (rank 0 writes the log)."""

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass


# -- optimizer state keyed by parameter index (torch's format, what a single process saves) or by name (FSDP) ---


def trainable_names(model: Any) -> list[str]:
    """Names of the trainable parameters in ``model.parameters()`` order, i.e. the optimizer's index order
    (``envace.backends.models.make_optimizer``), without FSDP wrapper prefixes."""
    return [_clean(n) for n, p in model.named_parameters() if p.requires_grad]


def by_index(osd: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """A name-keyed optimizer state (torch.distributed.checkpoint) -> torch's index-keyed ``state_dict`` format."""
    index = {n: i for i, n in enumerate(names)}
    groups = [{**g, "params": [index[_clean(n)] for n in g["params"]]} for g in osd["param_groups"]]
    return {"state": {index[_clean(n)]: s for n, s in osd["state"].items()}, "param_groups": groups}


def by_name(osd: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """The inverse of :func:`by_index`."""
    groups = [{**g, "params": [names[i] for i in g["params"]]} for g in osd["param_groups"]]
    return {"state": {names[int(i)]: s for i, s in osd["state"].items()}, "param_groups": groups}


def _clean(name: str) -> str:
    for wrapper in ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod."):
        name = name.replace(wrapper, "")
    return name


def _inner(optimizer: Any) -> Any:
    return getattr(optimizer, "optimizer", optimizer)  # accelerate's AcceleratedOptimizer wraps the torch one


def _is_peft(model: Any) -> bool:
    return hasattr(model, "peft_config")


@dataclasses.dataclass
class _SavedModel:
    model: Any
    state_dict: dict[str, Any]

    def save_pretrained(self, path: str, **kw: Any) -> None:
        self.model.save_pretrained(path, state_dict=self.state_dict, **kw)


@dataclasses.dataclass
class _SavedOptimizer:
    state: dict[str, Any]

    def state_dict(self) -> dict[str, Any]:
        return self.state


def _light(t: Trajectory) -> Trajectory:
    """A copy for gathering: rows keep their role and completion tokens, not their prompts or log-probs."""
    return dataclasses.replace(t, rows=[dataclasses.replace(r, prompt_ids=[], old_logprobs=[]) for r in t.rows])


def each_micro_batch(batches: list[Any], dist: Dist) -> Iterator[tuple[Any | None, bool]]:
    """(micro-batch or None for an idle one, whether gradients synchronise after it): as many on every process."""
    n = int(dist.max(len(batches)))
    for k in range(n):
        yield (batches[k] if k < len(batches) else None), k == n - 1
