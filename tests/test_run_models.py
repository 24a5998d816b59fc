"""Every command that takes a model takes a training run: a run folder, a checkpoint folder or its policy/
folder, of a full fine-tuning run or of a LoRA run (whose policy/ holds only the adapter, merged on load)."""

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from envace.backends.models import ModelNotFoundError, is_adapter, load, load_tokenizer, resolve_model
from envace.training.trainer import train
from tiny import tiny_train_config


def _train(out_dir, **kw):
    return train(tiny_train_config(out_dir, **kw))


def _perturb_adapter(policy):
    """Give the trained adapter non-zero LoRA B matrices: one step on a tiny random model usually has all-zero
    advantages, so its adapter would still be the identity and a loader that ignored it would pass."""
    path = os.path.join(policy, "adapter_model.safetensors")
    weights = load_file(path)
    gen = torch.Generator().manual_seed(0)
    for name, t in weights.items():
        if "lora_B" in name:
            weights[name] = 0.05 * torch.randn(t.shape, generator=gen, dtype=t.dtype)
    save_file(weights, path)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{"full": run folder, "lora": run folder}, one training iteration each on tiny-random."""
    root = tmp_path_factory.mktemp("runs")
    full = _train(root / "full")
    lora = _train(root / "lora", lora_r=4)
    _perturb_adapter(os.path.join(lora.checkpoint, "policy"))
    return {"full": full.out_dir, "lora": lora.out_dir}


def _logits(model, tok):
    ids = torch.tensor([tok('<tool_call>{"name": "get_balance"}</tool_call>')["input_ids"]])
    with torch.no_grad():
        return model(input_ids=ids).logits


def _peft_reference(policy):
    """The LoRA policy as training sees it: the base with the (unmerged) adapter applied by PEFT."""
    from peft import PeftModel

    base, tok = load("tiny-random")
    return PeftModel.from_pretrained(base, policy).eval(), tok


def test_a_run_folder_and_a_checkpoint_folder_resolve_to_the_checkpoints_policy(runs):
    for kind, run in runs.items():
        ckpt = os.path.join(run, "checkpoints", "step-000001")
        policy = os.path.join(ckpt, "policy")
        assert resolve_model(run) == resolve_model(ckpt) == resolve_model(policy) == policy, kind
    assert is_adapter(resolve_model(runs["lora"])) and not is_adapter(resolve_model(runs["full"]))
    assert resolve_model("tiny-random") == "tiny-random"


def test_a_checkpoint_without_the_asked_role_says_which_models_it_holds(runs):
    with pytest.raises(ModelNotFoundError, match=r"no 'rehearser' model; it holds: policy"):
        resolve_model(runs["full"], "rehearser")


def test_resolve_model_finds_each_role_of_a_checkpoint(tmp_path):
    ck = tmp_path / "run" / "checkpoints" / "step-000003"
    for role in ("policy", "rehearser"):
        (ck / role).mkdir(parents=True)
        (ck / role / "config.json").write_text("{}")
    (tmp_path / "run" / "checkpoints" / "latest").write_text("step-000003")
    assert resolve_model(str(ck)) == str(ck / "policy")
    assert resolve_model(str(ck), "rehearser") == str(ck / "rehearser")
    assert resolve_model(str(tmp_path / "run"), "rehearser") == str(ck / "rehearser")


def test_loading_a_lora_run_checkpoint_or_policy_folder_gives_the_base_with_the_adapter_merged(runs):
    ckpt = os.path.join(runs["lora"], "checkpoints", "step-000001")
    ref, tok = _peft_reference(os.path.join(ckpt, "policy"))
    want = _logits(ref, tok)
    base = _logits(load("tiny-random")[0], tok)
    assert not torch.allclose(want, base, atol=1e-3)  # the adapter changes the model
    for name in (runs["lora"], ckpt, os.path.join(ckpt, "policy")):
        model, tok2 = load(name)
        assert not hasattr(model, "peft_config")  # merged: a plain model, ready for any backend
        assert len(tok2) == len(tok)
        torch.testing.assert_close(_logits(model, tok2), want, rtol=0, atol=1e-5)


def test_a_lora_adapter_records_its_base_by_the_name_it_was_trained_from(runs):
    """Not the machine's cache folder of tiny-random: the adapter then loads with another cache too."""
    policy = resolve_model(runs["lora"])
    with open(os.path.join(policy, "adapter_config.json"), encoding="utf-8") as f:
        assert json.load(f)["base_model_name_or_path"] == "tiny-random"


def test_saving_a_lora_checkpoint_never_looks_its_base_up_on_the_hub(tmp_path, monkeypatch):
    import peft.utils.save_and_load as peft_save

    from envace.core.checkpoint import save_checkpoint
    from envace.backends.models import load_trainable

    def no_hub(repo_id, filename, **kw):
        raise AssertionError(f"looked up {repo_id}/{filename} on the hub")

    monkeypatch.setattr(peft_save, "check_file_exists_on_hf_hub", no_hub)
    model, tok = load_trainable("tiny-random", lora_r=4)
    ckpt = save_checkpoint(str(tmp_path), 1, {"policy": model}, {}, {}, tokenizer=tok)
    assert is_adapter(os.path.join(ckpt, "policy"))


def test_a_lora_adapter_without_its_tokenizer_takes_its_bases(runs, tmp_path):
    import shutil

    src = resolve_model(runs["lora"])
    bare = tmp_path / "adapter"
    bare.mkdir()
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        shutil.copy(os.path.join(src, name), bare / name)
    assert (
        load_tokenizer(bare)("Hello world!")["input_ids"] == load_tokenizer("tiny-random")("Hello world!")["input_ids"]
    )


def test_serve_loads_a_lora_run_merged(runs):
    from envace.backends.loaders import open_backend
    from envace.serving.serve import context_of

    be = open_backend(runs["lora"])  # what envace serve loads
    n = context_of(be)
    ref, tok = _peft_reference(resolve_model(runs["lora"]))
    assert n == 8192
    torch.testing.assert_close(_logits(be.model, tok), _logits(ref, tok), rtol=0, atol=1e-5)


# -- the commands, as subprocesses ---------------------------------------------------------------------------


def _cli(*args):
    p = subprocess.run([sys.executable, "-m", "envace.cli", *args], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stdout


@pytest.mark.parametrize("kind", ["full", "lora"])
def test_rehearse_takes_a_run_folder(runs, kind):
    out = _cli(
        "rehearse",
        "--model",
        runs[kind],
        "--suite",
        "bank",
        "-N",
        "1",
        "--max-steps",
        "2",
        "--max-new-tokens",
        "8",
        "--memory",
        "concat",
    )
    assert out.strip()


@pytest.mark.parametrize("kind", ["full", "lora"])
def test_rollout_takes_a_run_folder(runs, kind, tmp_path):
    path = tmp_path / "t.jsonl"
    _cli(
        "rollout",
        "--model",
        runs[kind],
        "--suite",
        "bank",
        "-n",
        "1",
        "-k",
        "1",
        "--max-steps",
        "2",
        "--max-new-tokens",
        "8",
        "--show",
        "0",
        "--out",
        str(path),
    )
    assert len(path.read_text().splitlines()) == 1


def test_eval_takes_a_lora_run(runs, tmp_path):
    res = tmp_path / "eval.json"
    _cli(
        "eval",
        "--model",
        runs["lora"],
        "--suite",
        "bank",
        "-n",
        "1",
        "--max-steps",
        "2",
        "--max-new-tokens",
        "8",
        "--out",
        str(res),
    )
    assert len(json.loads(res.read_text())["per_task"]) == 1


def test_train_starts_from_a_lora_run(runs, tmp_path):
    out = tmp_path / "next"
    sets = [
        f"model={runs['lora']}",
        "suite=bank",
        "iterations=1",
        "batch_tasks=1",
        "group_size=2",
        "rollout.max_steps=2",
        "rollout.act.max_new_tokens=8",
        "rollout.rehearse.max_new_tokens=8",
        f"out_dir={out}",
        "tensorboard=false",
        "progress=false",
        "save_every=1",
    ]
    _cli("train", *[a for s in sets for a in ("--set", s)])
    assert os.path.isfile(os.path.join(resolve_model(str(out)), "config.json"))  # full fine-tuning of the merged model
