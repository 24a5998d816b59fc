"""vLLM backend: fast rollouts for training (weights synced from the trainer after each update) and evaluation.

GPU only, optional extra: ``pip install 'envace[vllm]'``. Without vLLM, constructing :class:`VLLMBackend` raises
an ImportError that names the extra (importing this module does not need vLLM).

Training (docs/scaling.md, configs/8gpu_fsdp_vllm.yaml)::

    rollout_backend: vllm
    rollout_backend_options: {gpu_memory_utilization: 0.3, max_model_len: 8192}
    recompute_old_logprobs: true

The engine is *colocated*: it lives in the trainer's process and GPU. Under torchrun / accelerate launch each
process gets its own engine (``distributed_executor_backend="external_launcher"``, tensor parallel size 1:
every process rolls out its own tasks), and ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` keeps vLLM's engine core in
this process, so :meth:`VLLMBackend.sync_weights` hands the trainer's tensors to the vLLM model's
``load_weights`` directly (``LLM.apply_model``) with no copy through another process; the prefix cache is then
reset (its keys/values were computed with the old weights). ``sync_weights`` takes a model (of a LoRA model, the
merged weights are sent), a state dict, or (name, tensor) pairs (what FSDP gathers, see envace.training.distributed).

Log-probs: vLLM returns the sampled tokens' log-probs of the *raw* distribution (before temperature, from its own
kernels), not the temperature-scaled quantity the trainer recomputes, so training with vLLM rollouts sets
``recompute_old_logprobs: true`` (the trainer takes its own log-probs before each update).

Evaluation: ``VLLMBackend("Qwen/Qwen3-8B")`` is a Backend like any other (``envace.evaluation.trials.evaluate(policy=...)``),
and ``envace serve --backend vllm --model M`` serves it over the OpenAI API (``vllm serve`` does too).

Sessions are ignored: vLLM's automatic prefix caching reuses shared prompt prefixes by itself.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Iterator, Sequence

from ..chat.prompts import ChatFormat
from .base import BACKENDS, Backend, Generation, SamplingParams

EXTRA = "pip install 'envace[vllm]'"
SYNC_CHUNK_BYTES = 1 << 30  # weights handed to vLLM per load_weights call


def require_vllm() -> Any:
    """The vllm module, or an ImportError that says how to get it."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine core in this process (direct weight loading)
    try:
        import vllm
    except ImportError as e:
        raise ImportError(
            f"the vllm backend needs vLLM, which runs on NVIDIA/AMD GPUs only: {EXTRA} on a GPU machine ({e})"
        ) from e
    return vllm


class VLLMBackend(Backend):
    """Generation with a colocated vLLM engine (``vllm.LLM``)."""

    def __init__(
        self,
        model: str,
        tokenizer: Any = None,
        *,
        gpu_memory_utilization: float = 0.3,
        max_model_len: int | None = None,
        dtype: str = "auto",
        enable_prefix_caching: bool = True,
        seed: int = 0,
        **engine_kwargs: Any,
    ):
        """``model``: a local HF model folder (or a cached id); its weights are replaced by ``sync_weights``.
        ``tokenizer``: the trainer's tokenizer object (default: loaded from ``model``). Other keyword arguments go
        to ``vllm.LLM`` (e.g. ``enforce_eager``, ``max_num_seqs``, ``kv_cache_dtype``)."""
        vllm = require_vllm()
        import torch

        self._vllm = vllm
        if tokenizer is None:
            from .models import load_tokenizer

            tokenizer = load_tokenizer(model)
        self.tokenizer = tokenizer
        if (
            torch.distributed.is_available()
            and torch.distributed.is_initialized()
            and torch.distributed.get_world_size() > 1
        ):
            # one engine per trainer process on its own GPU, inside the launcher's process group
            if int(engine_kwargs.get("tensor_parallel_size", 1)) != 1:
                raise ValueError(
                    "a colocated vLLM engine under a data-parallel trainer must have tensor_parallel_size 1 (each process rolls out its own tasks)"
                )
            engine_kwargs.setdefault("distributed_executor_backend", "external_launcher")
            seed = seed + torch.distributed.get_rank()
        self.llm = vllm.LLM(
            model=model,
            tokenizer=model,
            dtype=dtype,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            enable_prefix_caching=enable_prefix_caching,
            seed=seed,
            **engine_kwargs,
        )
        self.stop_token_ids = ChatFormat.for_tokenizer(
            tokenizer
        ).stop_ids  # end of turn (and eos), as the HF backend stops
        self.stats = {
            "prompt_tokens": 0,
            "cached_tokens": 0,
            "generated_tokens": 0,
            "forward_calls": 0,
            "weight_syncs": 0,
        }

    def generate(
        self, prompts: Sequence[list[int]], params: SamplingParams, sessions: Sequence[str | None] | None = None
    ) -> list[Generation]:
        # one SamplingParams per prompt: with a seed, each prompt gets its own (equal seeds would give the K
        # trajectories of a group, whose first prompts are equal, the same tokens)
        sps = [
            self._sampling(params, None if params.seed is None else (params.seed + i) % (2**63))
            for i in range(len(prompts))
        ]
        outs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompts], sampling_params=sps, use_tqdm=False)
        gens = []
        for p, o in zip(prompts, outs):
            c = o.outputs[0]
            ids = [int(t) for t in c.token_ids]
            lps = [float(d[t].logprob) for t, d in zip(ids, c.logprobs or [])]
            if len(lps) != len(ids):
                raise RuntimeError(f"vLLM returned {len(lps)} log-probs for {len(ids)} tokens")
            if c.finish_reason == "length":
                finish = "length"
            else:  # stop_reason: the stop string (str), a stop token id (int) or None (the model's EOS)
                finish = "stop" if isinstance(getattr(c, "stop_reason", None), str) else "eos"
            cached = getattr(o, "num_cached_tokens", None) or 0
            gens.append(
                Generation(
                    token_ids=ids,
                    logprobs=lps,
                    text=c.text,
                    finish_reason=finish,
                    prompt_tokens=len(p),
                    cached_tokens=int(cached),
                )
            )
            self.stats["prompt_tokens"] += len(p)
            self.stats["cached_tokens"] += int(cached)
            self.stats["generated_tokens"] += len(ids)
        self.stats["forward_calls"] += 1
        return gens

    def _sampling(self, p: SamplingParams, seed: int | None) -> Any:
        return self._vllm.SamplingParams(
            n=1,
            temperature=p.temperature,
            top_p=p.top_p,
            top_k=p.top_k if p.top_k > 0 else -1,
            max_tokens=p.max_new_tokens,
            stop=list(p.stop) or None,
            stop_token_ids=self.stop_token_ids or None,
            include_stop_str_in_output=True,  # the Backend protocol keeps the stop string
            logprobs=0,  # the sampled token's log-prob only
            seed=seed,
        )

    def sync_weights(self, model: Any) -> None:
        """Load the trainer's current weights (a model, LoRA merged; a state dict; or (name, tensor) pairs, e.g.
        gathered one at a time under FSDP) in chunks of ~1 GB, then drop the cached prefixes."""
        chunk: list[tuple[str, Any]] = []
        size = 0
        for name, t in hf_weights(model):
            chunk.append((name, t))
            size += t.numel() * t.element_size()
            if size >= SYNC_CHUNK_BYTES:
                self._load(chunk)
                chunk, size = [], 0
        if chunk:
            self._load(chunk)
        self.llm.reset_prefix_cache()
        self.stats["weight_syncs"] += 1

    def _load(self, weights: list[tuple[str, Any]]) -> None:
        if hasattr(self.llm, "apply_model"):  # vLLM >= 0.8: runs on the model in each worker (in-process here)
            self.llm.apply_model(lambda m: m.load_weights(weights=weights))
            return
        executor = self.llm.llm_engine.model_executor  # older engines: the driver worker's model
        worker = executor.driver_worker
        runner = getattr(getattr(worker, "worker", worker), "model_runner", None) or worker.model_runner
        runner.model.load_weights(weights=weights)

    def release(self, sessions: Sequence[str]) -> None:
        """Nothing kept per session (vLLM caches prefixes by content)."""

    def release_all(self) -> None:
        self.llm.reset_prefix_cache()


def hf_weights(model: Any) -> Iterator[tuple[str, Any]]:
    """(name, tensor) pairs with Hugging Face checkpoint names, which vLLM's ``load_weights`` takes.

    A state dict or an iterable of pairs passes through. A PEFT (LoRA) model yields its *merged* weights
    (base + the adapters' delta, computed aside: the model is not touched, so its frozen base weights never drift
    through merge/unmerge round trips) under the base model's names (no ``base_model.model.``, ``.base_layer``, LoRA
    matrices)."""
    if isinstance(model, Mapping):
        yield from model.items()
        return
    if not hasattr(model, "state_dict"):
        yield from model
        return
    import torch

    merged: dict[str, Any] = {}
    if hasattr(model, "peft_config"):
        with torch.no_grad():
            for mname, mod in model.named_modules():
                if hasattr(mod, "get_delta_weight") and hasattr(mod, "base_layer"):
                    w = mod.base_layer.weight
                    for a in getattr(mod, "active_adapters", []):
                        if a in getattr(mod, "lora_A", {}):
                            w = w + mod.get_delta_weight(a).to(w.dtype)
                    merged[f"{mname}.base_layer.weight"] = w
    for name, t in model.state_dict().items():
        if merged or hasattr(model, "peft_config"):
            if "lora_" in name or "original_module" in name:
                continue
            t = merged.get(name, t)
            name = (
                name.removeprefix("base_model.model.")
                .replace(".base_layer", "")
                .replace("modules_to_save.default.", "")
            )
        yield name, t.detach()


BACKENDS.add("vllm", lambda model, tokenizer=None, **kw: VLLMBackend(model, tokenizer, **kw))
