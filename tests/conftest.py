import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny():
    """The tiny random-init model with the SmolLM2 tokenizer: (model, tokenizer)."""
    from envace.backends.models import load

    return load("tiny-random")


@pytest.fixture(scope="session")
def tokenizer(tiny):
    return tiny[1]


SMALL = dict(hidden_size=128, num_attention_heads=2, num_key_value_heads=1, intermediate_size=256)
"""The tiny model's shape with head size 64 (vLLM's CPU kernels have none for the tiny model's 16)."""


@pytest.fixture(scope="session")
def small_folder(tmp_path_factory, tokenizer):
    """A seeded random-init Llama of shape :data:`SMALL` saved with the tokenizer as a Hugging Face folder (what a
    vLLM engine or ``vllm serve`` loads)."""
    from envace.backends.models import tiny_model

    folder = tmp_path_factory.mktemp("small-llama")
    tiny_model(tokenizer, **SMALL).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)
