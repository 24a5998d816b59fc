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
