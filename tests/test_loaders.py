"""One way to open a model (envace.backends.loaders): one registry, :func:`open_backend`, and one URL test that every
room asking for a helper model (simulator, judge, user simulator, an experiment arm's model) goes through."""

import pytest

from envace.backends.hf import HFBackend
from envace.backends.http import HTTPBackend
from envace.backends.loaders import LOADERS, frozen_backend, is_url, loader_for, open_backend
from envace.core.registry import UnknownNameError

URL = "http://127.0.0.1:1/v1"  # nothing listens there: opening a served model asks the server nothing


@pytest.mark.parametrize(
    "name,url",
    [
        ("http://127.0.0.1:8000/v1", True),
        ("https://example.org/v1", True),
        ("tiny-random", False),
        ("runs/train", False),
        ("httpx-model", False),
        ("", False),
        (None, False),
    ],
)
def test_a_model_is_served_exactly_when_it_is_an_http_url(name, url):
    assert is_url(name) is url
    if name is not None:
        assert loader_for(name) == ("http" if url else "hf")


def test_an_http_url_opens_the_openai_compatible_client_through_open_backend():
    be = open_backend(URL, "http", {"model": "m", "timeout": 5})
    assert isinstance(be, HTTPBackend) and be.base_url == URL and be.model == "m" and be.timeout == 5
    assert isinstance(frozen_backend(URL), HTTPBackend)  # a helper named by URL: the same client
    assert isinstance(frozen_backend(URL, bf16=True), HTTPBackend)  # precision is the server's, not an error


def test_a_served_model_s_tokenizer_is_found_when_first_needed():
    """A chat-only helper (judge, simulator, user) needs no local tokenizer; a policy that builds token prompts is
    told how to name one."""
    be = open_backend(URL, "http", {"model": "no-such-local-model"})
    with pytest.raises(ValueError, match="no local tokenizer for the served model 'no-such-local-model'.*tokenizer"):
        be.tokenizer
    named = open_backend(URL, "http", {"model": "x", "tokenizer": "tiny-random"})
    assert named.tokenizer.encode("hi")


def test_a_bad_backend_name_is_one_line_listing_the_valid_ones():
    with pytest.raises(UnknownNameError) as e:
        open_backend("tiny-random", "nosuch")
    assert str(e.value) == "unknown backend 'nosuch'; valid names: auto, hf, http, vllm"
    assert LOADERS.names() == ["auto", "hf", "http", "vllm"]


def test_a_url_needs_backend_http_and_http_needs_a_url():
    with pytest.raises(ValueError, match=r"is a URL: a served model needs backend http \(--backend http\)"):
        open_backend(URL, "hf")
    with pytest.raises(ValueError, match="must be the server's http\\(s\\)://host:port/v1 URL, got 'tiny-random'"):
        open_backend("tiny-random", "http")
    with pytest.raises(ValueError, match="bf16 is a setting of the hf backend"):
        open_backend(URL, "http", bf16=True)


def test_a_local_helper_is_loaded_frozen_in_the_asked_precision():
    be = frozen_backend("tiny-random")
    assert isinstance(be, HFBackend) and not any(p.requires_grad for p in be.model.parameters())


def test_every_helper_named_by_url_is_the_served_model(monkeypatch):
    """Simulator and judge of training, the rollout's user simulator and an experiment arm's helper: one rule."""
    from envace.config import TrainConfig
    from envace.evaluation.experiment import ExperimentConfig, arm_backend
    from envace.rollout.engine import user_backend_for
    from envace.training import trainer
    from envace.training.distributed import Dist

    cfg = TrainConfig(model="tiny-random", judge=URL, simulator_model=URL, variant="simulator")
    assert isinstance(trainer.judge_backend(cfg, policy=None, dist=Dist()), HTTPBackend)
    assert isinstance(trainer._simulator(cfg, initial=None, dist=Dist()), HTTPBackend)
    assert trainer.judge_backend(TrainConfig(judge="policy"), policy="the policy", dist=Dist()) == "the policy"
    assert trainer.judge_backend(TrainConfig(), policy="the policy", dist=Dist()) is None
    assert isinstance(user_backend_for(URL), HTTPBackend)
    assert isinstance(arm_backend(ExperimentConfig(model="tiny-random"), URL), HTTPBackend)


def test_the_old_second_registry_name_says_where_models_open_now():
    import envace.backends.base as base

    with pytest.raises(AttributeError, match="LOADERS / open_backend"):
        base.BACKENDS  # noqa: B018
    with pytest.raises(AttributeError, match="no attribute"):
        base.NO_SUCH_NAME  # noqa: B018
