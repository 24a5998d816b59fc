"""Atomic, resumable checkpoints.

A checkpoint is a folder ``step-NNNNNN`` holding the model (or LoRA adapter) in safetensors, the optimizer and
scheduler states, the RNG states, the step, the data position and the config. It is written into a temporary
folder and renamed into place, then ``latest`` (a small text file, itself replaced atomically) points to it:
a kill at any moment leaves either the previous checkpoint or the new one, never half of one.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from typing import Any

import numpy as np
import torch


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    except OSError:
        pass


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(s: dict[str, Any]) -> None:
    random.setstate(s["python"])
    np.random.set_state(s["numpy"])
    torch.set_rng_state(s["torch"])


def save_checkpoint(
    root: str,
    step: int,
    models: dict[str, Any],
    optimizers: dict[str, Any],
    state: dict[str, Any],
    tokenizer: Any = None,
    keep: int = 2,
) -> str:
    """Write checkpoint ``step`` under ``root`` atomically and point ``latest`` at it."""
    os.makedirs(root, exist_ok=True)
    final = os.path.join(root, f"step-{step:06d}")
    tmp = tempfile.mkdtemp(prefix=f".tmp-step-{step:06d}-", dir=root)
    try:
        for name, model in models.items():
            model.save_pretrained(os.path.join(tmp, name), safe_serialization=True, **_save_options(model))
            if tokenizer is not None:
                tokenizer.save_pretrained(os.path.join(tmp, name))
        torch.save({name: opt.state_dict() for name, opt in optimizers.items()}, os.path.join(tmp, "optimizer.pt"))
        torch.save(rng_state(), os.path.join(tmp, "rng.pt"))
        with open(os.path.join(tmp, "state.json"), "w", encoding="utf-8") as f:
            json.dump({"step": step, **state}, f, indent=1, default=str)
        for dirpath, _, files in os.walk(tmp):
            for fn in files:
                with open(os.path.join(dirpath, fn), "rb") as fh:
                    os.fsync(fh.fileno())
        if os.path.exists(final):  # a complete folder of this step, from a run killed before `latest` moved on
            old = _hide(final)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
        _fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    latest_tmp = os.path.join(root, ".latest.tmp")
    with open(latest_tmp, "w", encoding="utf-8") as f:
        f.write(os.path.basename(final))
        f.flush()
        os.fsync(f.fileno())
    os.replace(latest_tmp, os.path.join(root, "latest"))
    _fsync_dir(root)
    _prune(root, keep)
    return final


def _save_options(model: Any) -> dict[str, Any]:
    """Of a LoRA (PEFT) model: never save embedding layers. envace's adapters target linear layers only and never
    resize the vocabulary; PEFT's default ("auto") would look the base model's name up on the Hugging Face hub
    to decide, where the adapter names its base by a built-in name (envace.backends.models)."""
    inner = getattr(model, "model", None)  # distributed._SavedModel (FSDP) wraps the model it saves
    return {"save_embedding_layers": False} if hasattr(model, "peft_config") or hasattr(inner, "peft_config") else {}


def _hide(path: str) -> str:
    """Rename a checkpoint folder out of the ``step-*`` namespace (atomic) before deleting it, so that a kill
    during the deletion never leaves a half-deleted folder named like a checkpoint."""
    hidden = os.path.join(os.path.dirname(path), f".tmp-step-deleting-{os.path.basename(path)}-{os.getpid()}")
    os.replace(path, hidden)
    return hidden


def _prune(root: str, keep: int) -> None:
    steps = sorted(d for d in os.listdir(root) if d.startswith("step-"))
    for d in steps[:-keep] if keep > 0 else []:
        shutil.rmtree(_hide(os.path.join(root, d)), ignore_errors=True)
    for d in os.listdir(root):  # leftovers of interrupted writes and deletions
        if d.startswith(".tmp-step-"):
            shutil.rmtree(os.path.join(root, d), ignore_errors=True)


def latest_checkpoint(root: str) -> str | None:
    p = os.path.join(root, "latest")
    if not os.path.exists(p):
        return None
    with open(p, encoding="utf-8") as f:
        name = f.read().strip()
    path = os.path.join(root, name)
    return path if os.path.isdir(path) else None


def load_state(path: str) -> dict[str, Any]:
    with open(os.path.join(path, "state.json"), encoding="utf-8") as f:
        return json.load(f)


def load_optimizers(path: str, optimizers: dict[str, Any]) -> None:
    states = torch.load(os.path.join(path, "optimizer.pt"), weights_only=False)
    for name, opt in optimizers.items():
        opt.load_state_dict(states[name])


def load_rng(path: str) -> None:
    set_rng_state(torch.load(os.path.join(path, "rng.pt"), weights_only=False))
